"""Tests of trainer_hooks.anchors: capture, re-padding, measurement (naive reference), state, a tiny real LM."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from contracts import metrics as M
from trainer_hooks.anchors import AnchorBatch, AnchorSet

NAN = math.nan
INF = math.inf
PAD = 63  # pad id the rollout used (the anchor set pads with its own `pad_token_id`)


@dataclass(frozen=True)
class Resp:
    """One response: real prompt tokens, real completion tokens, loss mask over the completion."""

    prompt: list[int]
    completion: list[int]
    loss: list[int]
    reward: float = 1.0


def rollout(resps: list[Resp], p_width: int | None = None, t_width: int | None = None) -> dict[str, Any]:
    """A TRL-style batch: prompts left-padded, completions right-padded (with PAD), to at least the given widths."""
    pw = max([len(r.prompt) for r in resps] + [p_width or 0])
    tw = max([len(r.completion) for r in resps] + [t_width or 0])
    b = len(resps)
    prompt_ids = torch.full((b, pw), PAD)
    prompt_mask = torch.zeros(b, pw, dtype=torch.int64)
    completion_ids = torch.full((b, tw), PAD)
    completion_mask = torch.zeros(b, tw, dtype=torch.int64)
    loss_mask = torch.zeros(b, tw, dtype=torch.int64)
    for i, r in enumerate(resps):
        if r.prompt:
            prompt_ids[i, pw - len(r.prompt) :] = torch.tensor(r.prompt)
            prompt_mask[i, pw - len(r.prompt) :] = 1
        completion_ids[i, : len(r.completion)] = torch.tensor(r.completion)
        completion_mask[i, : len(r.completion)] = 1
        loss_mask[i, : len(r.loss)] = torch.tensor(r.loss)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "loss_mask": loss_mask,
        "rewards": torch.tensor([r.reward for r in resps], dtype=torch.float64),
    }


def unpack(batch: AnchorBatch) -> list[Resp]:
    """Each anchor's real tokens back out of a padded batch (checks the padding layout on the way)."""
    t = batch.logits_to_keep
    out = []
    for ids, att, lm in zip(
        batch.input_ids.tolist(), batch.attention_mask.tolist(), batch.loss_mask.tolist(), strict=True
    ):
        p_ids, p_att, c_ids, c_att = ids[:-t] if t else ids, att[:-t] if t else att, ids[-t:], att[-t:]
        n_p, n_c = sum(p_att), sum(c_att)
        assert p_att == [0] * (len(p_att) - n_p) + [1] * n_p  # prompt left-padded
        assert c_att == [1] * n_c + [0] * (t - n_c)  # completion right-padded
        assert not any(lm[n_c:])
        out.append(Resp(p_ids[len(p_att) - n_p :], c_ids[:n_c], lm[:n_c]))
    return out


R1 = Resp([1, 2, 3], [10, 11, 12, 13], [1, 1, 0, 1])
R2 = Resp([4], [20, 21], [1, 1])
R3 = Resp([5, 6, 7, 8, 9], [30], [1])
R4 = Resp([1, 2, 3], [10, 11, 12], [1, 1, 1])  # R1's prompt, a different completion


def offer(anchors: AnchorSet, resps: list[Resp], step: int = 0, **kw: Any) -> int:
    widths = {k: kw.pop(k) for k in ("p_width", "t_width") if k in kw}
    return anchors.offer(**rollout(resps, **widths), step=step, **kw)


# ----------------------------------------------------------------------------------------------
# capture


def test_capture_order_threshold_and_nan_rewards() -> None:
    anchors = AnchorSet(capacity=10, success_threshold=0.5)
    assert len(anchors) == 0 and not anchors.full
    resps = [
        Resp(R1.prompt, R1.completion, R1.loss, 0.25),  # below threshold
        Resp(R2.prompt, R2.completion, R2.loss, 0.5),  # at threshold: correct
        Resp(R3.prompt, R3.completion, R3.loss, NAN),  # NaN: never correct
        Resp(R4.prompt, R4.completion, R4.loss, 2.0),
        Resp([9], [40, 41], [0, 0], 1.0),  # no loss token: no likelihood to track
    ]
    assert offer(anchors, resps, step=3) == 2
    assert unpack(anchors.batch()) == [
        Resp(R2.prompt, R2.completion, R2.loss),
        Resp(R4.prompt, R4.completion, R4.loss),
    ]
    assert anchors.captured_steps == [3, 3]
    assert anchors.baseline_steps == [None, None]


def test_default_threshold_is_the_contract_default() -> None:
    anchors = AnchorSet()
    assert anchors.capacity == M.DEFAULT_ANCHOR_SIZE
    resps = [Resp(R1.prompt, R1.completion, R1.loss, M.DEFAULT_SUCCESS_THRESHOLD), Resp([4], [5], [1], 0.0)]
    assert offer(anchors, resps) == 1


def test_capacity_and_full() -> None:
    anchors = AnchorSet(capacity=3)
    assert offer(anchors, [R1, R2]) == 2
    assert not anchors.full
    assert offer(anchors, [R3, R4], step=1) == 1  # only room for one: row order wins
    assert anchors.full and len(anchors) == 3
    assert offer(anchors, [Resp([1], [2], [1])], step=2) == 0
    assert unpack(anchors.batch()) == [R1, R2, R3]
    assert anchors.captured_steps == [0, 0, 1]
    zero = AnchorSet(capacity=0)
    assert zero.full and offer(zero, [R1]) == 0 and len(zero) == 0
    assert zero.measure(zero.batch().input_ids[:, :0].float(), step=0) == {}
    with pytest.raises(ValueError, match="capacity"):
        AnchorSet(capacity=-1)


def test_duplicates_are_skipped() -> None:
    anchors = AnchorSet(capacity=10)
    assert offer(anchors, [R1, R1, R2]) == 2  # a duplicate inside one batch: the first is kept
    # Held anchors again, at other padding widths and with other pad ids: still duplicates.
    batch = rollout([R2, R1], p_width=8, t_width=9)
    batch["prompt_ids"][batch["prompt_mask"] == 0] = 5
    batch["completion_ids"][batch["completion_mask"] == 0] = 7
    assert anchors.offer(**batch, step=1) == 0
    # Same tokens, another loss mask: a duplicate (identity is the token sequence).
    assert offer(anchors, [Resp(R1.prompt, R1.completion, [1, 1, 1, 1])]) == 0
    # Same completion, another prompt; same prompt, another completion; a prefix: all new.
    assert (
        offer(anchors, [Resp([9], R1.completion, R1.loss), R4, Resp(R1.prompt, R1.completion[:2], [1, 1])])
        == 3
    )
    assert len(anchors) == 5
    # A duplicate does not use up capacity.
    small = AnchorSet(capacity=2)
    assert offer(small, [R1, R1, R1, R2]) == 2
    assert unpack(small.batch()) == [R1, R2]


def test_repadding_mixed_widths_reproduces_every_anchor() -> None:
    anchors = AnchorSet(capacity=10, pad_token_id=0)
    empty_prompt = Resp([], [50, 51, 52], [0, 1, 1])
    groups = [([R2], 2, 6), ([R3, empty_prompt], 9, 3), ([R1], 3, 12), ([R4], 1, 3)]
    for step, (resps, p_width, t_width) in enumerate(groups):
        assert offer(anchors, resps, step=step, p_width=p_width, t_width=t_width) == len(resps)
    batch = anchors.batch("cpu")
    assert unpack(batch) == [R2, R3, empty_prompt, R1, R4]
    # tightest widths: the longest prompt (R3: 5) and completion (R1: 4), not the rollouts' padding
    assert batch.logits_to_keep == 4
    assert tuple(batch.input_ids.shape) == (5, 9) == tuple(batch.attention_mask.shape)
    assert tuple(batch.loss_mask.shape) == (5, 4)
    assert batch.input_ids.dtype == batch.attention_mask.dtype == batch.loss_mask.dtype == torch.int64
    assert (batch.input_ids[batch.attention_mask == 0] == 0).all()  # the set's own pad id


def test_offer_moves_rows_to_cpu_and_clones() -> None:
    anchors = AnchorSet(capacity=4)
    batch = rollout([R1])
    anchors.offer(**batch, step=0)
    batch["completion_ids"].fill_(0)  # the trainer reuses its buffers
    batch["prompt_ids"].fill_(0)
    assert unpack(anchors.batch()) == [R1]
    assert anchors.batch().input_ids.device.type == "cpu"


def test_offer_validates_shapes() -> None:
    anchors = AnchorSet(capacity=4)
    good = rollout([R1, R2])
    for name, bad in (
        ("prompt_ids", torch.zeros(2)),
        ("prompt_mask", good["prompt_mask"][:, :1]),
        ("completion_ids", good["completion_ids"][:1]),
        ("completion_mask", good["completion_mask"][:, :2]),
        ("loss_mask", good["loss_mask"][:1]),
        ("rewards", torch.ones(3)),
    ):
        with pytest.raises(ValueError, match=name):
            anchors.offer(**{**good, name: bad}, step=0)
    with pytest.raises(ValueError, match="old_logp"):
        anchors.offer(**good, step=0, old_logp=torch.zeros(2, 1))
    assert len(anchors) == 0
    assert anchors.offer(**{k: v[:0] for k, v in good.items()}, step=0) == 0  # empty batch


# ----------------------------------------------------------------------------------------------
# measure


def logp_for(batch: AnchorBatch, values: list[list[float]]) -> Tensor:
    return torch.tensor(values, dtype=torch.float64).reshape(batch.input_ids.shape[0], batch.logits_to_keep)


def test_baseline_semantics() -> None:
    anchors = AnchorSet(capacity=4)
    offer(anchors, [R1, R2], step=0)  # loss tokens: R1 at 0 1 3 (of 4), R2 at 0 1
    b = anchors.batch()
    first = logp_for(b, [[-1.0, -2.0, 99.0, -3.0], [-1.0, -1.0, NAN, NAN]])  # off-mask never read
    out = anchors.measure(first, step=5)
    assert out == {M.ANCHOR_LOGP: -8 / 5, M.ANCHOR_SIZE: 2.0}  # no baseline before: no delta yet
    assert anchors.baseline_steps == [5, 5]

    offer(anchors, [R3], step=6)  # joins; widths unchanged (R3's completion is 1 token)
    b = anchors.batch()
    assert b.logits_to_keep == 4
    second = logp_for(b, [[-1.5, -2.0, 0.0, -3.5], [-0.5, -1.0, 0.0, 0.0], [-4.0, 0.0, 0.0, 0.0]])
    out = anchors.measure(second, step=10)
    # delta over R1 (-.5 0 -.5) and R2 (.5 0): -.5 / 5; D_traj -1 and .5: one of two decreased
    assert out == {
        M.ANCHOR_LOGP: (-7.0 - 1.5 - 4.0) / 6,
        M.ANCHOR_SIZE: 3.0,
        M.ANCHOR_DELTA: -0.5 / 5,
        M.ANCHOR_FRAC_DECREASED: 0.5,
    }
    assert anchors.baseline_steps == [5, 5, 10]  # old baselines are kept, R3's is new

    third = logp_for(b, [[-1.0, -2.0, 0.0, -3.0], [-1.0, -1.0, 0.0, 0.0], [-4.0, 0.0, 0.0, 0.0]])
    with pytest.raises(RuntimeError, match="batch"):
        anchors.measure(third, step=11)  # each batch() is measured once
    b = anchors.batch()
    out = anchors.measure(third, step=15)
    assert out[M.ANCHOR_DELTA] == 0.0 and out[M.ANCHOR_FRAC_DECREASED] == 0.0  # strict: 0 < 0 is false
    eps_set = AnchorSet(capacity=1, eps=0.5)
    offer(eps_set, [R2])
    eps_set.measure(logp_for(eps_set.batch(), [[-1.0, -1.0]]), step=0)
    assert eps_set.measure(logp_for(eps_set.batch(), [[-1.0, -0.75]]), step=1)[M.ANCHOR_FRAC_DECREASED] == 1.0


def test_anchors_joining_between_batch_and_measure_wait_for_the_next_batch() -> None:
    anchors = AnchorSet(capacity=4)
    offer(anchors, [R2])
    b = anchors.batch()
    offer(anchors, [R1])  # widens the completions to 4 after the batch was built
    out = anchors.measure(logp_for(b, [[-1.0, -3.0]]), step=1)
    assert out == {M.ANCHOR_LOGP: -2.0, M.ANCHOR_SIZE: 1.0}
    assert anchors.baseline_steps == [1, None]
    b = anchors.batch()
    out = anchors.measure(logp_for(b, [[-2.0, -3.0, 0.0, 0.0], [-1.0, -1.0, 0.0, -1.0]]), step=2)
    assert out[M.ANCHOR_SIZE] == 2.0 and out[M.ANCHOR_DELTA] == -1 / 2 and out[M.ANCHOR_FRAC_DECREASED] == 1.0


def test_nan_and_inf_propagate_and_do_not_become_baselines() -> None:
    anchors = AnchorSet(capacity=4)
    offer(anchors, [R2, R3])
    b = anchors.batch()
    out = anchors.measure(logp_for(b, [[-1.0, NAN], [-2.0, 0.0]]), step=0)
    assert math.isnan(out[M.ANCHOR_LOGP])
    assert anchors.baseline_steps == [None, 0]  # R2's first values are not finite: no baseline yet
    b = anchors.batch()
    out = anchors.measure(logp_for(b, [[-1.0, -1.0], [-INF, 0.0]]), step=1)
    assert out[M.ANCHOR_LOGP] == -INF and out[M.ANCHOR_DELTA] == -INF
    assert out[M.ANCHOR_FRAC_DECREASED] == 1.0  # only R3 had a baseline; -inf < 0
    assert anchors.baseline_steps == [1, 0]
    b = anchors.batch()
    out = anchors.measure(logp_for(b, [[NAN, -1.0], [-2.0, 0.0]]), step=2)
    assert math.isnan(out[M.ANCHOR_DELTA]) and math.isnan(out[M.ANCHOR_FRAC_DECREASED])


def test_old_logp_at_offer_is_the_baseline() -> None:
    anchors = AnchorSet(capacity=4)
    resps = [R1, R2, R3]
    old = torch.full((3, 4), 7.0)  # off-mask values are never read
    old[0, [0, 1, 3]] = torch.tensor([-1.0, -1.0, -1.0])
    old[1, :2] = torch.tensor([-2.0, -2.0])
    old[2, 0] = NAN  # not finite: R3 waits for its first measure
    assert offer(anchors, resps, step=4, old_logp=old) == 3
    assert anchors.baseline_steps == [4, 4, None]
    b = anchors.batch()
    new = logp_for(b, [[-2.0, -1.0, 0.0, -1.0], [-2.0, -1.5, 0.0, 0.0], [-3.0, 0.0, 0.0, 0.0]])
    out = anchors.measure(new, step=8)
    assert out == {
        M.ANCHOR_LOGP: (-4.0 - 3.5 - 3.0) / 6,
        M.ANCHOR_SIZE: 3.0,
        M.ANCHOR_DELTA: -0.5 / 5,
        M.ANCHOR_FRAC_DECREASED: 0.5,
    }


def test_measure_validates_and_accepts_any_float_dtype() -> None:
    anchors = AnchorSet(capacity=4)
    with pytest.raises(RuntimeError):
        anchors.measure(torch.zeros(0, 0), step=0)
    assert anchors.measure(anchors.batch().loss_mask.float(), step=0) == {}  # empty set
    offer(anchors, [R1, R2])
    b = anchors.batch()
    with pytest.raises(ValueError, match="new_logp"):
        anchors.measure(torch.zeros(2, 3), step=0)
    out = anchors.measure(torch.full((2, 4), -0.5, dtype=torch.bfloat16, requires_grad=True), step=0)
    assert out[M.ANCHOR_LOGP] == -0.5 and all(isinstance(v, float) for v in out.values())
    assert b.logits_to_keep == 4


@dataclass
class MeasureCase:
    widths: list[tuple[int, int]]  # (completion length, joined at round) per anchor
    masks: list[list[int]]
    rounds: list[Tensor]  # one (K, T) log-prob tensor per measure round, for all anchors
    eps: float


@st.composite
def measure_cases(draw: st.DrawFn) -> MeasureCase:
    k = draw(st.integers(1, 6))
    n_rounds = draw(st.integers(1, 4))
    lengths = [draw(st.integers(1, 6)) for _ in range(k)]
    masks = []
    for n in lengths:
        m = draw(st.lists(st.sampled_from([0, 1]), min_size=n, max_size=n))
        m[draw(st.integers(0, n - 1))] = 1  # at least one loss token
        masks.append(m)
    joined = sorted(draw(st.integers(0, n_rounds - 1)) for _ in range(k))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    width = max(lengths)
    rounds = []
    for _ in range(n_rounds):
        values = -torch.randint(0, 24, (k, width), generator=gen).to(torch.float64) / 8
        if draw(st.integers(0, 4)) == 0:
            values.view(-1)[int(torch.randint(0, k * width, (1,), generator=gen))] = draw(
                st.sampled_from([NAN, -INF])
            )
        rounds.append(values)
    return MeasureCase(
        list(zip(lengths, joined, strict=True)), masks, rounds, draw(st.sampled_from([0.0, 0.25]))
    )


def naive_measure_rounds(case: MeasureCase) -> list[dict[str, float]]:
    """Per-anchor loop: anchors join before their round; first finite values are the baseline."""
    baseline: dict[int, list[float]] = {}
    outs = []
    for r, values in enumerate(case.rounds):
        present = [i for i, (_, j) in enumerate(case.widths) if j <= r]
        toks = {i: [float(values[i, t]) for t, m in enumerate(case.masks[i]) if m] for i in present}
        out: dict[str, float] = {}
        if present:
            all_toks = [x for i in present for x in toks[i]]
            out[M.ANCHOR_LOGP] = sum(all_toks) / len(all_toks)
            out[M.ANCHOR_SIZE] = float(len(present))
            had = [i for i in present if i in baseline]
            if had:
                diffs = [[x - b for x, b in zip(toks[i], baseline[i], strict=True)] for i in had]
                flat = [d for ds in diffs for d in ds]
                out[M.ANCHOR_DELTA] = sum(flat) / len(flat)
                d_traj = [sum(ds) for ds in diffs]
                out[M.ANCHOR_FRAC_DECREASED] = (
                    NAN
                    if any(math.isnan(d) for d in d_traj)
                    else sum(d < case.eps for d in d_traj) / len(had)
                )
            for i in present:
                if i not in baseline and all(math.isfinite(x) for x in toks[i]):
                    baseline[i] = toks[i]
        outs.append(out)
    return outs


@settings(max_examples=100, deadline=None)
@given(measure_cases())
def test_measure_matches_naive_reference(case: MeasureCase) -> None:
    anchors = AnchorSet(capacity=len(case.widths), eps=case.eps)
    want = naive_measure_rounds(case)
    for r, values in enumerate(case.rounds):
        # Anchors joining this round: distinct prompts [i] with their own completion lengths.
        joining = [
            Resp([i + 1], [(i * 7 + t) % 60 for t in range(n)], case.masks[i])
            for i, (n, j) in enumerate(case.widths)
            if j == r
        ]
        if joining:
            assert offer(anchors, joining, step=r) == len(joining)
        b = anchors.batch()
        k, t = b.input_ids.shape[0], b.logits_to_keep
        # Each anchor's completion is at the start of its row: the first t columns of the values.
        got = anchors.measure(values[:k, :t].clone(), step=r)
        assert set(got) == set(want[r]), r
        for name, value in want[r].items():
            assert got[name] == pytest.approx(value, rel=1e-12, abs=1e-12, nan_ok=True), (r, name)


# ----------------------------------------------------------------------------------------------
# state


def test_state_dict_round_trip() -> None:
    anchors = AnchorSet(capacity=4)
    offer(anchors, [R1, R2], step=2)
    b = anchors.batch()
    anchors.measure(logp_for(b, [[-1.0, -1.0, 0.0, -1.0], [-2.0, -2.0, 0.0, 0.0]]), step=3)
    offer(anchors, [R3], step=4)
    state = anchors.state_dict()
    assert all(v.device.type == "cpu" for k, v in state.items() if isinstance(v, Tensor))

    resumed = AnchorSet(capacity=4)
    resumed.load_state_dict(state)
    assert (
        len(resumed) == 3 and resumed.captured_steps == [2, 2, 4] and resumed.baseline_steps == [3, 3, None]
    )
    assert unpack(resumed.batch()) == [R1, R2, R3]
    new = logp_for(resumed.batch(), [[-2.0, -1.0, 0.0, -1.0], [-2.0, -2.0, 0.0, 0.0], [-1.0, 0.0, 0.0, 0.0]])
    out = resumed.measure(new, step=5)
    assert out[M.ANCHOR_DELTA] == -1 / 5 and out[M.ANCHOR_FRAC_DECREASED] == 0.5
    # The state is a copy: measuring the resumed set did not touch it.
    assert state["baseline"][0].tolist() == [-1.0, -1.0, 0.0, -1.0]

    smaller = AnchorSet(capacity=2)
    smaller.load_state_dict(state)  # a smaller K on resume keeps the earliest anchors
    assert unpack(smaller.batch()) == [R1, R2] and smaller.full
    with pytest.raises(ValueError, match="version"):
        smaller.load_state_dict({**state, "version": 99})
    with pytest.raises(ValueError, match="loss_mask"):
        smaller.load_state_dict({k: v for k, v in state.items() if k != "loss_mask"})
    with pytest.raises(ValueError, match="baseline"):
        smaller.load_state_dict({**state, "baseline": state["baseline"][:, :2]})
    assert unpack(smaller.batch()) == [R1, R2]  # a failed load leaves the set as it was


# ----------------------------------------------------------------------------------------------
# a tiny real causal LM: padding and positions are handled right


def per_token_logps(model: Any, input_ids: Tensor, attention_mask: Tensor, logits_to_keep: int) -> Tensor:
    """Log-probs of the last `logits_to_keep` tokens, as TRL computes them (plain forward, shift by one)."""
    logits: Tensor = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logits = logits[:, -logits_to_keep - 1 : -1].double()
    return logits.log_softmax(-1).gather(-1, input_ids[:, -logits_to_keep:, None]).squeeze(-1)


def test_padded_batch_scores_like_each_anchor_alone() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    model = transformers.Qwen2ForCausalLM(config).eval()
    anchors = AnchorSet(capacity=8)
    gen = torch.Generator().manual_seed(1)
    resps = []
    for p_len, c_len in ((3, 5), (7, 2), (1, 9), (4, 4), (2, 3)):
        loss = torch.randint(0, 2, (c_len,), generator=gen)
        loss[-1] = 1
        resps.append(
            Resp(
                torch.randint(0, 63, (p_len,), generator=gen).tolist(),
                torch.randint(0, 63, (c_len,), generator=gen).tolist(),
                loss.tolist(),
            )
        )
    offer(anchors, resps[:2], p_width=10, t_width=12)
    offer(anchors, resps[2:], p_width=8, t_width=9)
    b = anchors.batch("cpu")
    with torch.no_grad():
        padded = per_token_logps(model, b.input_ids, b.attention_mask, b.logits_to_keep)
        for i, r in enumerate(resps):
            ids = torch.tensor([r.prompt + r.completion])
            alone = per_token_logps(model, ids, torch.ones_like(ids), len(r.completion))[0]
            torch.testing.assert_close(padded[i, : len(r.completion)], alone, rtol=0, atol=1e-5)
    out = anchors.measure(padded, step=0)
    assert out[M.ANCHOR_SIZE] == 5.0 and math.isfinite(out[M.ANCHOR_LOGP])
    assert (
        anchors.measure(per_token_logps(model, *anchors.batch()[:3]).detach(), step=1)[M.ANCHOR_DELTA] == 0.0
    )

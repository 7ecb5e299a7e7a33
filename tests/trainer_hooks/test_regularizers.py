"""Tests of trainer_hooks.regularizers: LLDS ([LLD] Eq. 4/5/9/10), SAPO's reported term, ma_beta."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from trainer_hooks.regularizers import llds_loss, ma_beta, sapo_kl_loss

X = float("nan")  # value on mask == 0 tokens: never read, so NaN must not leak into loss or grad

# ----------------------------------------------------------------------------------------------
# Hand case. old_logp = 0, logp = -d, so the token change d = old - new is the table below.
#
#   row 0, A = +1,  mask 1 1 0 1 1 0   d  0.5 -0.2  X  -0.4  0.2  X
#       actions: a0 = (0.5, -0.2) sum 0.3 > 0 on;  a1 = (-0.4, 0.2) sum -0.2 off; response sum 0.1 > 0
#   row 1, A = -1,  mask 1 1 1 0 0 0   d  1.0  1.0  1.0  X    X   X     (not preserving)
#   row 2, A =  0,  mask 1 0 1 1 1 0   d  0.3  X   -1.0  0.2  0.1  X
#       actions: a0 = (0.3) on;  a1 = (-1.0, 0.2, 0.1) sum -0.7 off; response sum -0.4 off
#
# totals:   action   = 0.5 (r0a0) + 0.3 (r2a0)                   = 0.8
#           response = 0.5 + 0.2 (row 0 on) + 0 (row 2 off)       = 0.7
#           token    = 0.5 + 0.2 + 0.3 + 0.2 + 0.1                = 1.3
# counts:   all mask tokens 4 + 3 + 4 = 11; preserving (rows 0, 2) 4 + 4 = 8; preserving actions 4
# gated actions: action 2 (r0a0, r2a0); response 2 (both of row 0); token 4


def _hand() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    d = torch.tensor(
        [
            [0.5, -0.2, X, -0.4, 0.2, X],
            [1.0, 1.0, 1.0, X, X, X],
            [0.3, X, -1.0, 0.2, 0.1, X],
        ],
        dtype=torch.float64,
    )
    mask = torch.tensor([[1, 1, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0], [1, 0, 1, 1, 1, 0]])
    old = torch.zeros_like(d)
    logp = (-d).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0, 0.0])
    return logp, old, mask, adv


@pytest.mark.parametrize(
    ("gate", "total", "frac"),
    [("action", 0.8, 0.5), ("response", 0.7, 0.5), ("token", 1.3, 1.0)],
)
@pytest.mark.parametrize(("normalize", "count"), [("loss_tokens", 11), ("preserving_tokens", 8)])
def test_llds_hand_values(gate: str, total: float, frac: float, normalize: str, count: int) -> None:
    logp, old, mask, adv = _hand()
    loss, stats = llds_loss(logp, old, mask, adv, gate=gate, normalize=normalize)  # type: ignore[arg-type]
    assert loss.item() == pytest.approx(total / count)
    assert stats.penalty_sum.item() == pytest.approx(total)
    assert stats.gated_action_frac.item() == pytest.approx(frac)
    assert int(stats.n_preserving_tokens) == 8
    assert int(stats.n_preserving_actions) == 4
    assert not stats.penalty_sum.requires_grad
    assert not stats.gated_action_frac.requires_grad


def test_llds_default_is_action_gate_and_loss_tokens() -> None:
    logp, old, mask, adv = _hand()
    loss, _ = llds_loss(logp, old, mask, adv)
    assert loss.item() == pytest.approx(0.8 / 11)


# Answer weighting (Eq. 5), w = 0.5 on row 0 token 0 (d 0.5) and row 2 token 4 (d 0.1):
#   action:   0.5 * 0.5 + 0.3                     = 0.55  (r2 token 4 is in the off action)
#   response: 0.5 * 0.5 + 0.2                     = 0.45
#   token:    0.25 + 0.2 + 0.3 + 0.2 + 0.5 * 0.1  = 1.0
@pytest.mark.parametrize(("gate", "total"), [("action", 0.55), ("response", 0.45), ("token", 1.0)])
def test_llds_answer_weight(gate: str, total: float) -> None:
    logp, old, mask, adv = _hand()
    answer = torch.zeros_like(mask)
    answer[0, 0] = 1
    answer[2, 4] = 1
    answer[1, :] = 1  # non-preserving row: weight irrelevant
    loss, stats = llds_loss(
        logp,
        old,
        mask,
        adv,
        gate=gate,  # type: ignore[arg-type]
        answer_mask=answer,
        answer_weight=0.5,
        normalize="preserving_tokens",
    )
    assert stats.penalty_sum.item() == pytest.approx(total)
    assert loss.item() == pytest.approx(total / 8)


def test_llds_gate_uses_unweighted_d() -> None:
    # Weight 3 on row 0 token 1 (d = -0.2): a weighted gate sum of r0a0 would be 0.5 - 0.6 < 0 (off);
    # the unweighted sum is 0.3 > 0, so r0a0 stays on and the action total is still 0.5 + 0.3 = 0.8
    # (the weighted token has d < 0 and adds nothing).
    logp, old, mask, adv = _hand()
    answer = torch.zeros_like(mask)
    answer[0, 1] = 1
    _, stats = llds_loss(logp, old, mask, adv, answer_mask=answer, answer_weight=3.0)
    assert stats.penalty_sum.item() == pytest.approx(0.8)
    assert stats.gated_action_frac.item() == pytest.approx(0.5)


def test_llds_answer_weight_zero_keeps_gate() -> None:
    # w = 0 on every token: penalty 0, but gates (unweighted) are unchanged.
    logp, old, mask, adv = _hand()
    loss, stats = llds_loss(logp, old, mask, adv, answer_mask=torch.ones_like(mask), answer_weight=0.0)
    assert loss.item() == 0.0
    assert stats.gated_action_frac.item() == pytest.approx(0.5)


def test_llds_per_token_advantages_use_per_response_value() -> None:
    # (B, T) advantages: the row's mean over mask tokens decides; values on mask == 0 are ignored.
    logp, old, mask, adv = _hand()
    adv_bt = adv[:, None].expand(3, 6).clone()
    adv_bt[mask == 0] = -100.0  # would flip row 0 and row 2 if read
    loss_b, _ = llds_loss(logp, old, mask, adv)
    loss_bt, _ = llds_loss(logp, old, mask, adv_bt)
    assert loss_bt.item() == pytest.approx(loss_b.item())


def test_llds_nan_advantage_is_not_preserving() -> None:
    logp, old, mask, _ = _hand()
    adv = torch.tensor([X, -1.0, 0.0])
    _, stats = llds_loss(logp, old, mask, adv)
    assert stats.penalty_sum.item() == pytest.approx(0.3)  # only r2a0
    assert int(stats.n_preserving_tokens) == 4


# ----------------------------------------------------------------------------------------------
# Gradients


def _expected_active(gate: str) -> Tensor:
    """Tokens that must get gradient in the hand case (d > 0 in a gated action of A >= 0)."""
    active = torch.zeros(3, 6, dtype=torch.bool)
    if gate == "action":
        active[0, 0] = active[2, 0] = True
    elif gate == "response":
        active[0, 0] = active[0, 4] = True
    else:
        active[0, 0] = active[0, 4] = active[2, 0] = active[2, 3] = active[2, 4] = True
    return active


@pytest.mark.parametrize("gate", ["action", "response", "token"])
def test_llds_gradient_support_and_sign(gate: str) -> None:
    logp, old, mask, adv = _hand()
    old.requires_grad_(True)  # must be treated as a constant anyway
    loss, _ = llds_loss(logp, old, mask, adv, gate=gate)  # type: ignore[arg-type]
    loss.backward()
    assert logp.grad is not None
    grad = logp.grad
    assert torch.isfinite(grad).all()  # NaN on masked tokens does not leak
    active = _expected_active(gate)
    # d loss / d logp = -w / count on active tokens: minimising pushes their log-prob up.
    assert torch.equal(grad[active], torch.full_like(grad[active], -1.0 / 11))
    assert torch.equal(grad[~active], torch.zeros_like(grad[~active]))
    assert old.grad is None


def test_llds_gradient_weighted() -> None:
    logp, old, mask, adv = _hand()
    answer = torch.zeros_like(mask)
    answer[0, 0] = 1
    loss, _ = llds_loss(logp, old, mask, adv, answer_mask=answer, answer_weight=0.25)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0, 0].item() == pytest.approx(-0.25 / 11)
    assert logp.grad[2, 0].item() == pytest.approx(-1.0 / 11)


def test_llds_zero_d_token_gets_no_gradient() -> None:
    # Action (0.4, 0.0): on; the d == 0 token gets no gradient (subgradient 0 of max(0, d)).
    logp = torch.tensor([[-0.4, 0.0]], requires_grad=True)
    loss, _ = llds_loss(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1))
    loss.backward()
    assert logp.grad is not None
    assert logp.grad.tolist() == [[-0.5, 0.0]]


def test_llds_no_drift_gives_zero_loss() -> None:
    # First mini-batch of a rollout: logp == old_logp, every gate is off.
    logp = torch.randn(2, 5, requires_grad=True)
    for gate in ("action", "response", "token"):
        loss, stats = llds_loss(logp, logp.detach().clone(), torch.ones(2, 5), torch.ones(2), gate=gate)
        assert loss.item() == 0.0
        assert stats.gated_action_frac.item() == (1.0 if gate == "token" else 0.0)


@pytest.mark.parametrize("normalize", ["loss_tokens", "preserving_tokens"])
def test_llds_empty_denominator_keeps_graph(normalize: str) -> None:
    logp = torch.full((2, 3), X, requires_grad=True)
    for mask, adv in ((torch.zeros(2, 3), torch.ones(2)), (torch.ones(2, 3), -torch.ones(2))):
        lp = logp if mask.sum() == 0 else torch.zeros(2, 3, requires_grad=True)
        loss, stats = llds_loss(lp, torch.ones(2, 3), mask, adv, gate="token", normalize=normalize)  # type: ignore[arg-type]
        assert loss.item() == 0.0
        assert loss.requires_grad
        loss.backward()
        assert lp.grad is not None
        assert torch.equal(lp.grad, torch.zeros(2, 3))
        assert stats.gated_action_frac.item() == 0.0


def test_llds_empty_batch() -> None:
    logp = torch.zeros(0, 4, requires_grad=True)
    loss, stats = llds_loss(logp, torch.zeros(0, 4), torch.zeros(0, 4), torch.zeros(0))
    assert loss.item() == 0.0
    assert int(stats.n_preserving_actions) == 0


def test_llds_bf16_computes_in_float32() -> None:
    logp, old, mask, adv = _hand()
    loss, _ = llds_loss(logp.detach().bfloat16(), old.bfloat16(), mask, adv)
    assert loss.dtype == torch.float32


# ----------------------------------------------------------------------------------------------
# Validation


def test_llds_rejects_unknown_options() -> None:
    logp, old, mask, adv = _hand()
    with pytest.raises(ValueError, match=r"gate must be one of \('action', 'response', 'token'\)"):
        llds_loss(logp, old, mask, adv, gate="chunk")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"normalize must be one of \('loss_tokens', 'preserving_tokens'\)"):
        llds_loss(logp, old, mask, adv, normalize="tokens")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="normalize must be one of"):
        sapo_kl_loss(logp, old, mask, adv, threshold=0.5, normalize="x")  # type: ignore[arg-type]
    for bad in (-0.1, math.nan, math.inf):
        with pytest.raises(ValueError, match="answer_weight"):
            llds_loss(logp, old, mask, adv, answer_weight=bad)


@pytest.mark.parametrize(
    ("arg", "pattern"),
    [
        ("old_logp", r"old_logp has shape \(3, 5\), expected logp's \(3, 6\)"),
        ("mask", r"mask has shape \(3, 5\)"),
        ("answer_mask", r"answer_mask has shape \(3, 5\)"),
        ("advantages", r"advantages must be .* got \(3, 5\)"),
        ("advantages_b", r"advantages must be .* got \(2,\)"),
        ("logp", r"logp must be \(B, T\), got shape \(18,\)"),
    ],
)
def test_llds_rejects_shape_mismatch(arg: str, pattern: str) -> None:
    logp, old, mask, adv = _hand()
    args: dict[str, Tensor] = {"logp": logp, "old_logp": old, "mask": mask, "advantages": adv}
    answer: Tensor | None = None
    if arg == "answer_mask":
        answer = torch.zeros(3, 5)
    elif arg == "advantages_b":
        args["advantages"] = torch.zeros(2)
    elif arg == "logp":
        args["logp"] = logp.detach().reshape(-1)
    else:
        args[arg] = torch.zeros(3, 5)
    positional = (args["logp"], args["old_logp"], args["mask"], args["advantages"])
    with pytest.raises(ValueError, match=pattern):
        llds_loss(*positional, answer_mask=answer)
    if arg not in ("answer_mask", "logp"):
        with pytest.raises(ValueError, match=pattern):
            sapo_kl_loss(*positional, threshold=0.5)


# ----------------------------------------------------------------------------------------------
# Naive reference (pure Python loops) vs the vectorised loss, on random inputs


@dataclass
class _Ref:
    total: float
    count_all: int
    count_pres: int
    n_actions: int
    n_gated: int
    grad_weight: list[list[float]]  # w on tokens that must get gradient, 0 elsewhere


def _reference(
    d: list[list[float]],
    mask: list[list[int]],
    adv: list[float],
    answer: list[list[int]],
    weight: float,
    gate: str,
) -> _Ref:
    n_rows, n_cols = len(mask), len(mask[0])
    total = 0.0
    count_all = count_pres = n_actions = n_gated = 0
    grad_weight = [[0.0] * n_cols for _ in range(n_rows)]
    for b in range(n_rows):
        count_all += sum(1 for t in range(n_cols) if mask[b][t])
        if not adv[b] >= 0:
            continue
        count_pres += sum(1 for t in range(n_cols) if mask[b][t])
        actions: list[list[int]] = []
        for t in range(n_cols):
            if mask[b][t]:
                if t == 0 or not mask[b][t - 1]:
                    actions.append([])
                actions[-1].append(t)
        response_sum = sum(d[b][t] for a in actions for t in a)
        for a in actions:
            n_actions += 1
            if gate == "action":
                on = sum(d[b][t] for t in a) > 0
            elif gate == "response":
                on = response_sum > 0
            else:
                on = True
            if not on:
                continue
            n_gated += 1
            for t in a:
                w = weight if answer[b][t] else 1.0
                if d[b][t] > 0:
                    total += w * d[b][t]
                    grad_weight[b][t] = w
    return _Ref(total, count_all, count_pres, n_actions, n_gated, grad_weight)


@st.composite
def _batches(draw: st.DrawFn) -> dict[str, object]:
    n_rows = draw(st.integers(1, 4))
    n_cols = draw(st.integers(1, 10))
    cells = st.lists(
        st.lists(st.integers(0, 1), min_size=n_cols, max_size=n_cols), min_size=n_rows, max_size=n_rows
    )
    mask = draw(cells)
    for row in mask:  # trailing padding on some rows
        pad = draw(st.integers(0, n_cols))
        row[n_cols - pad :] = [0] * pad
    # Multiples of 1/8 are exact in float64, so the loop's and torch's sums agree bit for bit
    # (including exact zeros, which the strict gate must treat as off).
    eighths = st.integers(-8, 8).map(lambda k: k / 8)
    d = draw(st.lists(st.lists(eighths, min_size=n_cols, max_size=n_cols), min_size=n_rows, max_size=n_rows))
    adv = draw(st.lists(st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0]), min_size=n_rows, max_size=n_rows))
    return {
        "mask": mask,
        "d": d,
        "old": draw(
            st.lists(
                st.lists(st.integers(-32, 0).map(lambda k: k / 8), min_size=n_cols, max_size=n_cols),
                min_size=n_rows,
                max_size=n_rows,
            )
        ),
        "adv": adv,
        "answer": draw(cells),
        "weight": draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])),
        "gate": draw(st.sampled_from(["action", "response", "token"])),
        "normalize": draw(st.sampled_from(["loss_tokens", "preserving_tokens"])),
        "per_token_adv": draw(st.booleans()),
    }


@settings(max_examples=80, deadline=None)
@given(_batches())
def test_llds_matches_naive_loop(case: dict[str, object]) -> None:
    mask_l: list[list[int]] = case["mask"]  # type: ignore[assignment]
    d_l: list[list[float]] = case["d"]  # type: ignore[assignment]
    adv_l: list[float] = case["adv"]  # type: ignore[assignment]
    answer_l: list[list[int]] = case["answer"]  # type: ignore[assignment]
    weight: float = case["weight"]  # type: ignore[assignment]
    gate: str = case["gate"]  # type: ignore[assignment]
    normalize: str = case["normalize"]  # type: ignore[assignment]

    mask = torch.tensor(mask_l)
    d = torch.tensor(d_l, dtype=torch.float64)
    old = torch.tensor(case["old"], dtype=torch.float64)
    # Garbage on mask == 0 tokens (tool feedback / padding) must not matter.
    logp = torch.where(mask != 0, old - d, torch.full_like(d, X)).requires_grad_(True)
    adv = torch.tensor(adv_l, dtype=torch.float64)
    if case["per_token_adv"]:
        adv = torch.where(mask != 0, adv[:, None], torch.full_like(d, -7.0))

    ref = _reference(d_l, mask_l, adv_l, answer_l, weight, gate)
    loss, stats = llds_loss(
        logp,
        old,
        mask,
        adv,
        gate=gate,  # type: ignore[arg-type]
        answer_mask=torch.tensor(answer_l),
        answer_weight=weight,
        normalize=normalize,  # type: ignore[arg-type]
    )
    count = max(ref.count_all if normalize == "loss_tokens" else ref.count_pres, 1)
    assert loss.item() == pytest.approx(ref.total / count, abs=1e-12)
    assert stats.penalty_sum.item() == pytest.approx(ref.total, abs=1e-12)
    assert int(stats.n_preserving_tokens) == ref.count_pres
    assert int(stats.n_preserving_actions) == ref.n_actions
    assert stats.gated_action_frac.item() == pytest.approx(ref.n_gated / max(ref.n_actions, 1))

    loss.backward()
    assert logp.grad is not None
    expected = -torch.tensor(ref.grad_weight, dtype=torch.float64) / count
    assert torch.allclose(logp.grad, expected, atol=1e-15, rtol=0)
    # Support: exactly the tokens with d > 0 in gated actions of A >= 0 responses (w > 0).
    assert torch.equal(logp.grad != 0, expected != 0)
    assert bool((logp.grad <= 0).all())


# ----------------------------------------------------------------------------------------------
# SAPO (reported form)
#
#   row 0, A = +1, mask 1 1 1 0, log r = logp - old = (log 0.5, 0, log 0.9, X)
#   row 1, A = -1, mask 1 1 0 0, r = 0.1 (not preserving: never selected)
#   threshold 0.8: selected row 0 token 0 only; -log r = log 2; counts: all 5, preserving 3
#   threshold 1.0: also row 0 tokens 1 (r = 1 <= 1, -log r = 0) and 2 (r = 0.9, -log r = -log 0.9)


def _sapo_case() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    old = torch.full((2, 4), -1.0, dtype=torch.float64)
    log_r = torch.tensor(
        [[math.log(0.5), 0.0, math.log(0.9), X], [math.log(0.1), math.log(0.1), X, X]],
        dtype=torch.float64,
    )
    logp = (old + log_r).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    return logp, old, mask, torch.tensor([1.0, -1.0])


@pytest.mark.parametrize(("normalize", "count"), [("loss_tokens", 5), ("preserving_tokens", 3)])
def test_sapo_hand_values(normalize: str, count: int) -> None:
    logp, old, mask, adv = _sapo_case()
    loss, stats = sapo_kl_loss(logp, old, mask, adv, threshold=0.8, normalize=normalize)  # type: ignore[arg-type]
    assert loss.item() == pytest.approx(math.log(2) / count)
    assert stats.penalty_sum.item() == pytest.approx(math.log(2))
    assert stats.selected_token_frac.item() == pytest.approx(1 / 3)
    assert int(stats.n_preserving_tokens) == 3


def test_sapo_gradient_support_and_sign() -> None:
    logp, old, mask, adv = _sapo_case()
    loss, stats = sapo_kl_loss(logp, old, mask, adv, threshold=1.0, normalize="loss_tokens")
    assert loss.item() == pytest.approx((math.log(2) - math.log(0.9)) / 5)
    assert stats.selected_token_frac.item() == pytest.approx(1.0)
    loss.backward()
    assert logp.grad is not None
    expected = torch.zeros(2, 4, dtype=torch.float64)
    expected[0, :3] = -1 / 5  # selected tokens (even r = 1): minimising pushes logp up
    assert torch.equal(logp.grad, expected)


def test_sapo_per_token_advantages_and_large_ratios() -> None:
    logp, old, mask, adv = _sapo_case()
    with torch.no_grad():
        logp[0, 2] = old[0, 2] + 1000.0  # huge ratio: no overflow, not selected
    adv_bt = torch.where(mask != 0, adv[:, None], torch.full((2, 4), 5.0))
    loss, _ = sapo_kl_loss(logp, old, mask, adv_bt, threshold=0.8, normalize="loss_tokens")
    assert loss.item() == pytest.approx(math.log(2) / 5)


def test_sapo_empty_keeps_graph() -> None:
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, stats = sapo_kl_loss(logp, torch.zeros(2, 3), torch.ones(2, 3), -torch.ones(2), threshold=2.0)
    assert loss.item() == 0.0
    loss.backward()
    assert logp.grad is not None
    assert torch.equal(logp.grad, torch.zeros(2, 3))
    assert stats.selected_token_frac.item() == 0.0


def test_sapo_normalises_by_preserving_tokens_by_default_whatever_llds_does() -> None:
    """SAPO's normalisation is its own setting; its default is the reported form's population."""
    logp, old, mask, adv = _sapo_case()
    default, _ = sapo_kl_loss(logp, old, mask, adv, threshold=0.8)
    explicit, _ = sapo_kl_loss(logp, old, mask, adv, threshold=0.8, normalize="preserving_tokens")
    assert default.item() == explicit.item() == pytest.approx(math.log(2) / 3)
    llds_default, _ = llds_loss(logp, old, mask, adv)
    llds_explicit, _ = llds_loss(logp, old, mask, adv, normalize="loss_tokens")
    assert llds_default.item() == llds_explicit.item()  # LLDS keeps the authors' code's default


@pytest.mark.parametrize("threshold", [0.0, -1.0, math.nan])
def test_sapo_rejects_bad_threshold(threshold: float) -> None:
    logp, old, mask, adv = _sapo_case()
    with pytest.raises(ValueError, match="threshold"):
        sapo_kl_loss(logp, old, mask, adv, threshold=threshold)


# ----------------------------------------------------------------------------------------------
# ma_beta (paper schedule beta = min(V_s / 2, 1))


@pytest.mark.parametrize(
    ("v", "beta"),
    [
        (0.0, 0.0),
        (0.5, 0.25),
        (1.0, 0.5),
        (1.5, 0.75),
        (2.0, 1.0),
        (3.7, 1.0),
        (-2.0, 0.0),
        (-math.inf, 0.0),
        (math.inf, 1.0),
        (math.nan, 1.0),
    ],
)
def test_ma_beta(v: float, beta: float) -> None:
    assert ma_beta(v) == beta


@pytest.mark.parametrize(
    ("v", "beta"),
    [
        (0.0, 0.0),
        (0.5, 0.0),
        (1.0, 0.0),
        (1.25, 0.25),
        (1.5, 0.5),
        (2.0, 1.0),
        (3.7, 1.0),
        (-2.0, 0.0),
        (-math.inf, 0.0),
        (math.inf, 1.0),
        (math.nan, 1.0),
    ],
)
def test_ma_beta_code_schedule(v: float, beta: float) -> None:
    """The authors' code: answer coefficient min(lambda_answer * max(V_s - 1, 0), lambda) / lambda."""
    assert ma_beta(v, "code") == beta


def test_ma_beta_defaults_to_the_paper_schedule() -> None:
    assert ma_beta(1.0) == ma_beta(1.0, "paper") == 0.5
    assert ma_beta(1.0, schedule="code") == 0.0


def _naive_beta(v: float, schedule: str, scale: float) -> float:
    """Reference: the formulas as written (paper Eq. 5 schedule; dp_actor.py `mask_adaptive`)."""
    if math.isnan(v):
        return 1.0
    if schedule == "paper":
        return min(max(v, 0.0) / 2.0, 1.0)
    lam = 0.2  # any lambda: beta is the answer coefficient relative to it
    answer_weight = max(v - 1.0, 0.0)
    coefficient = min(scale * lam * answer_weight, lam)  # lambda_answer = scale * lambda
    return coefficient / lam


@settings(max_examples=200, deadline=None)
@given(
    v=st.floats(min_value=-5.0, max_value=20.0, allow_nan=False),
    schedule=st.sampled_from(["paper", "code"]),
    scale=st.floats(min_value=0.0, max_value=10.0),
)
def test_ma_beta_matches_naive_formulas(v: float, schedule: str, scale: float) -> None:
    beta = ma_beta(v, schedule, code_scale=scale)  # type: ignore[arg-type]
    assert 0.0 <= beta <= 1.0
    assert beta == pytest.approx(_naive_beta(v, schedule, scale), abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(
    a=st.floats(min_value=-5.0, max_value=20.0, allow_nan=False),
    b=st.floats(min_value=-5.0, max_value=20.0, allow_nan=False),
    schedule=st.sampled_from(["paper", "code"]),
)
def test_ma_beta_is_monotone_in_the_search_count(a: float, b: float, schedule: str) -> None:
    lo, hi = sorted((a, b))
    assert ma_beta(lo, schedule) <= ma_beta(hi, schedule)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"schedule": "linear"}, "schedule"),
        ({"code_scale": -1.0}, "code_scale"),
        ({"code_scale": math.inf}, "code_scale"),
    ],
)
def test_ma_beta_rejects_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ma_beta(1.5, **kwargs)  # type: ignore[arg-type]

"""Tests of the LLDS / SAPO term of `trainer_hooks.trl.MonitoredGRPOTrainer`: real tiny TRL runs on CPU.

The runs use `tests.trainer_hooks.tiny` (random 2-layer Qwen2, in-memory BPE tokenizer, a `search`
tool) with `steps_per_generation > gradient_accumulation_steps`, so every second optimizer step
trains on drifted log-probs and the LLDS gate can open.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from contracts import metrics as M
from trainer_hooks.client import Directive, LLDSDirective
from trainer_hooks.regularizers import llds_loss, ma_beta, sapo_kl_loss
from trainer_hooks.trl.regularizer_parts import (
    GLOBAL_TOKEN_LOSS_TYPES,
    SAPO_LOSS,
    RegularizerSettings,
    answer_token_mask,
    term_scale,
    valid_searches_from_mask,
)

trl = pytest.importorskip("trl")

from tests.trainer_hooks import tiny  # noqa: E402
from tests.trainer_hooks.test_trl import RecordingSink  # noqa: E402
from trainer_hooks.trl import MonitoredGRPOTrainer  # noqa: E402

trl_warnings = pytest.mark.filterwarnings(
    r"ignore:`\w*gradient_checkpointing\w*` is deprecated:FutureWarning"
)

LLDS_NAMES = {M.LLDS_ACTIVE, M.LLDS_LAMBDA, M.LLDS_LOSS, M.LLDS_GATED_ACTION_FRAC}


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class DirectiveSink(RecordingSink):
    """A sink with a `directive`, switched by the steps logged so far (as the service's acks would)."""

    def __init__(self, schedule: Mapping[int, Directive]) -> None:
        super().__init__()
        self.schedule = schedule
        self.reads = 0

    @property
    def directive(self) -> Directive:
        self.reads += 1
        logged = max((step for step, _ in self.metrics), default=0)
        current = Directive()
        for step in sorted(self.schedule):
            if logged >= step:
                current = self.schedule[step]
        return current


def _trainer_kwargs(tmp: Path, *, answer: bool = False, **config: Any) -> dict[str, Any]:
    tok = tiny.build_tokenizer(answer_token=answer)
    if answer:
        config.setdefault("generation_kwargs", tiny.generation_kwargs(tok, answer_bias=5.0))
    return {
        "model": tiny.build_model(tok),
        "reward_funcs": tiny.hashed_reward,
        "args": tiny.grpo_config(tmp, tok, **config),
        "train_dataset": tiny.build_dataset(),
        "processing_class": tok,
        "tools": [tiny.search],
    }


class Spy(MonitoredGRPOTrainer):
    """Records, per micro-batch, what the loss saw: log-probs, inputs, losses and gradients wrt logp."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.micro: list[dict[str, Any]] = []
        self._spy_logp: list[torch.Tensor] = []
        self._spy_base: list[torch.Tensor] = []

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if torch.is_grad_enabled() and self.model.training:
            self._spy_logp.append(result[0])
        return result

    def _compute_loss(self, model: Any, inputs: Any) -> Any:
        self._spy_logp, self._spy_base = [], []
        loss = super()._compute_loss(model, inputs)
        logp, base = self._spy_logp[0], self._spy_base[0]
        (g_base,) = torch.autograd.grad(base, logp, retain_graph=True)
        (g_total,) = torch.autograd.grad(loss, logp, retain_graph=True)
        mask = inputs["completion_mask"] * inputs["tool_mask"]
        self.micro.append(
            {
                "step": self.state.global_step + 1,
                "total": loss.detach().clone(),
                "base": base.detach().clone(),
                "g_delta": (g_total - g_base).detach(),
                "logp": logp.detach().clone(),
                "old": inputs.get("old_per_token_logps"),
                "drifted": self.rollout_drifted(),
                "mask": mask,
                "advantages": inputs["advantages"],
                "answer_mask": inputs.get("lldmon_answer_mask"),
                "completion_ids": inputs["completion_ids"],
                "completion_mask": inputs["completion_mask"],
                "num_items": inputs["num_items_in_batch"],
                "beta": self.llds.beta,
            }
        )
        return loss


@pytest.fixture
def base_loss_spy(monkeypatch: pytest.MonkeyPatch) -> None:
    """GRPOTrainer's own `_compute_loss` result, recorded for the Spy (the LLDS term comes on top)."""
    original = trl.GRPOTrainer._compute_loss

    def recording(self: Any, model: Any, inputs: Any) -> Any:
        loss = original(self, model, inputs)
        if isinstance(self, Spy):
            self._spy_base.append(loss)
        return loss

    monkeypatch.setattr(trl.GRPOTrainer, "_compute_loss", recording)


def _expected_scale(trainer: Spy, micro: Mapping[str, Any], normalize: str = "loss_tokens") -> float:
    args = trainer.args
    ga, spg = args.gradient_accumulation_steps, args.steps_per_generation
    if trainer.loss_type in ("dapo", "cispo", "vespo") and normalize == "loss_tokens":
        n_tok = float((micro["mask"] != 0).sum())
        return n_tok / (float(micro["num_items"]) * ga / spg)
    return 1.0 / ga


CASES = {
    # default loss (dapo: window-global token normalisation), one micro-batch per step
    "dapo": {"llds": "on", "llds_lambda": 0.5},
    # per-micro-batch loss with 2 accumulation steps, LLDS-MA on a real <answer> span
    "grpo-accum-ma": {
        "llds": "on",
        "llds_lambda": 0.3,
        "llds_answer_weight": "ma",
        "config": {
            "loss_type": "grpo",
            "per_device_train_batch_size": 2,
            "gradient_accumulation_steps": 2,
            "steps_per_generation": 4,
            "max_steps": 2,
        },
        "answer": True,
    },
    # SAPO's term alone (threshold 1: every preserving token whose likelihood fell)
    "sapo": {"llds": "off", "sapo_weight": 2.0, "sapo_threshold": 1.0},
}


def _run_case(tmp: Path, name: str, sink: RecordingSink | None) -> Spy:
    case = CASES[name]
    config = dict(case.get("config", {}))
    kwargs = _trainer_kwargs(tmp, answer=bool(case.get("answer")), **config)
    options = {k: v for k, v in case.items() if k not in ("config", "answer")}
    trainer = Spy(**kwargs, lldmon_sink=sink, probe_size=0, **options)
    trainer.train()
    return trainer


@trl_warnings
@pytest.mark.parametrize("name", list(CASES))
def test_backpropagated_loss_is_grpo_plus_scaled_term(tmp_path: Path, name: str, base_loss_spy: None) -> None:
    sink = RecordingSink()
    trainer = _run_case(tmp_path, name, sink)
    case = CASES[name]
    assert trainer.micro
    nonzero = 0
    per_step: dict[int, list[float]] = {}
    for micro in trainer.micro:
        assert micro["old"] is not None  # steps_per_generation > accumulation: TRL keeps old log-probs
        logp = micro["logp"].clone().requires_grad_(True)
        # before the first update after the rollout there is no displacement: old = the loss's own
        old = micro["old"] if micro["drifted"] else micro["logp"]
        normalize = "loss_tokens"
        if name == "sapo":
            normalize = "preserving_tokens"  # SAPO's own default
            reg, _ = sapo_kl_loss(
                logp, old, micro["mask"], micro["advantages"], threshold=1.0, normalize=normalize
            )
            weight = case["sapo_weight"]
        else:
            answer_mask = micro["answer_mask"]
            reg, _ = llds_loss(
                logp,
                old,
                micro["mask"],
                micro["advantages"],
                answer_mask=answer_mask,
                answer_weight=micro["beta"] if answer_mask is not None else 1.0,
            )
            weight = case["llds_lambda"]
        scale = _expected_scale(trainer, micro, normalize)
        expected = weight * scale * reg
        (g_expected,) = torch.autograd.grad(expected, logp)
        # the value TRL backpropagates is its own loss plus the scaled term, with the same graph
        assert float(micro["total"] - micro["base"]) == pytest.approx(
            float(expected.detach()), rel=1e-4, abs=1e-7
        )
        torch.testing.assert_close(micro["g_delta"], g_expected, rtol=1e-4, atol=1e-7)
        value = float(reg.detach())
        nonzero += value > 0
        per_step.setdefault(micro["step"], []).append(value)
    assert nonzero > 0, "the term never mattered: the test would not see a wrong scaling"

    if name == "sapo":
        assert not LLDS_NAMES & sink.names()
        losses = sink.series(SAPO_LOSS)
    else:
        assert sink.series(M.LLDS_ACTIVE) == dict.fromkeys(per_step, 1.0)
        assert sink.series(M.LLDS_LAMBDA) == dict.fromkeys(per_step, case["llds_lambda"])
        fracs = sink.series(M.LLDS_GATED_ACTION_FRAC)
        assert all(0.0 <= v <= 1.0 for v in fracs.values()) and any(v > 0 for v in fracs.values())
        losses = sink.series(M.LLDS_LOSS)
    for step, values in per_step.items():  # mean over the step's micro-batches, before lambda
        assert losses[step] == pytest.approx(sum(values) / len(values), rel=1e-5, abs=1e-8)

    if name == "grpo-accum-ma":
        # beta from TRL's tool metrics of the rollout (search/valid_per_traj), answer mask = final answer token
        v_s = sink.series(M.SEARCH_VALID_PER_TRAJ)[1]
        assert trainer.llds.beta == pytest.approx(ma_beta(v_s))
        answer_id = tiny.answer_token_id(trainer.processing_class)
        marked = 0
        for micro in trainer.micro:
            ids, answer_mask = micro["completion_ids"], micro["answer_mask"]
            assert answer_mask is not None
            for row in range(ids.shape[0]):
                valid = micro["completion_mask"][row].nonzero().flatten()
                hits = [int(i) for i in valid if int(ids[row, i]) == answer_id]
                expected_row = torch.zeros_like(answer_mask[row])
                if hits:
                    expected_row[hits[-1]] = True
                assert torch.equal(answer_mask[row], expected_row)
                marked += bool(hits)
        assert marked > 0


@trl_warnings
def test_training_differs_from_off_only_where_actions_are_gated(tmp_path: Path) -> None:
    def history(trainer: Any) -> dict[int, tuple[Any, ...]]:
        return {
            h["step"]: (h.get("loss"), h.get("grad_norm"), h.get("reward"))
            for h in trainer.state.log_history
            if "loss" in h
        }

    on_sink = RecordingSink()
    on = MonitoredGRPOTrainer(
        **_trainer_kwargs(tmp_path / "on"), lldmon_sink=on_sink, probe_size=0, llds="on"
    )
    on.train()
    off = MonitoredGRPOTrainer(**_trainer_kwargs(tmp_path / "off"), lldmon_sink=RecordingSink(), probe_size=0)
    off.train()
    gated = on_sink.series(M.LLDS_GATED_ACTION_FRAC)
    h_on, h_off = history(on), history(off)
    assert sorted(h_on) == sorted(gated) == [1, 2, 3, 4]
    first_gated = min(step for step, frac in gated.items() if frac > 0)
    for step in sorted(h_on):
        if step < first_gated:  # no action gated yet: LLDS added exactly 0, training identical
            assert on_sink.series(M.LLDS_LOSS)[step] == 0.0
            assert h_on[step] == h_off[step]
        elif step == first_gated:
            assert on_sink.series(M.LLDS_LOSS)[step] > 0.0
            assert h_on[step][0] != h_off[step][0]


@trl_warnings
def test_auto_mode_follows_the_directive_from_the_next_optimizer_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = DirectiveSink(
        {
            2: Directive(llds=LLDSDirective(enabled=True, lam=0.3), version=2, reason="phase II: LLD"),
            3: Directive(llds=LLDSDirective(enabled=True, lam=0.1), version=3, reason="lambda down"),
        }
    )
    trainer = MonitoredGRPOTrainer(**_trainer_kwargs(tmp_path), lldmon_sink=sink, probe_size=0)
    assert trainer.llds_settings.mode == "auto"  # default with a directive-capable sink
    sink.reads = 0
    with caplog.at_level(logging.INFO, logger="lldmon.trl"):
        trainer.train()
    # read once per optimizer step for LLDS and once at its end for the levers (never per micro-batch)
    assert trainer.state.global_step == 4 and sink.reads == 2 * 4
    # the directive logged with step 2 turns LLDS on from step 3; step 3's lambda change from step 4
    assert sink.series(M.LLDS_ACTIVE) == {1: 0.0, 2: 0.0, 3: 1.0, 4: 1.0}
    assert sink.series(M.LLDS_LAMBDA) == {1: 0.0, 2: 0.0, 3: 0.3, 4: 0.1}
    assert sorted(sink.series(M.LLDS_LOSS)) == [3, 4]
    changes = [
        r.getMessage() for r in caplog.records if r.name == "lldmon.trl" and "directive" in r.getMessage()
    ]
    assert len(changes) == 3, changes  # initial state, on, lambda change
    assert "off from optimizer step 1" in changes[0] and "version 0" in changes[0]
    assert "on from optimizer step 3" in changes[1] and "version 2" in changes[1]
    assert "phase II: LLD" in changes[1] and "lambda=0.3" in changes[1]
    assert "optimizer step 4" in changes[2] and "version 3" in changes[2] and "lambda=0.1" in changes[2]


@trl_warnings
def test_on_policy_llds_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="lldmon.trl"):
        trainer = MonitoredGRPOTrainer(
            **_trainer_kwargs(tmp_path, steps_per_generation=1, max_steps=2), llds="on"
        )
        trainer.train()
        trainer.train()  # a second train() on the same trainer does not warn again
    warnings = [r.getMessage() for r in caplog.records if r.name == "lldmon.trl"]
    assert len(warnings) == 1, warnings
    assert "no-op" in warnings[0] and "steps_per_generation > gradient_accumulation_steps" in warnings[0]


@trl_warnings
def test_a_failing_term_never_stops_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainer_hooks.trl.regularizer as trl_hooks

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("llds bug")

    monkeypatch.setattr(trl_hooks, "llds_loss", boom)
    sink = RecordingSink()
    with caplog.at_level(logging.WARNING, logger="lldmon.trl"):
        trainer = MonitoredGRPOTrainer(
            **_trainer_kwargs(tmp_path, max_steps=2), lldmon_sink=sink, probe_size=0, llds="on"
        )
        trainer.train()
    assert trainer.state.global_step == 2 and not trainer.llds_active
    messages = [
        r.getMessage()
        for r in caplog.records
        if r.name == "lldmon.trl" and "probe is off" not in r.getMessage()
    ]
    assert len(messages) == 1 and "switched off" in messages[0], messages
    assert sink.series(M.LLDS_ACTIVE) == {1: 0.0, 2: 0.0}
    assert sorted(sink.series(M.LOSS)) == [1, 2]


# ----------------------------------------------------------------------------------------------
# answer spans, settings, scaling (no training)


def _char_spans(tok: Any, ids: list[int]) -> list[tuple[int, int]]:
    """Per-token character spans by decoding prefixes one token at a time (the slow reference)."""
    spans, prev = [], 0
    for k in range(1, len(ids) + 1):
        cur = len(tok.decode(ids[:k], skip_special_tokens=False, clean_up_tokenization_spaces=False))
        spans.append((prev, cur))
        prev = cur
    return spans


def test_answer_mask_marks_the_final_span_only() -> None:
    tok = tiny.build_tokenizer()
    texts = [
        "first <answer>paris</answer> then, on reflection, <answer>london</answer> done<|im_end|>",
        "no answer here, just <answer without a close<|im_end|>",
        "multi\nline <answer>caf\u00e9\nau lait</answer><|im_end|>",
        "<answer>cut</answer> padding follows",
    ]
    rows = [tok(t)["input_ids"] for t in texts]
    width = max(map(len, rows)) + 3
    ids = torch.full((len(rows), width), tok.pad_token_id)
    mask = torch.zeros(len(rows), width, dtype=torch.int64)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = torch.tensor(row)
        mask[r, : len(row)] = 1
    # the last row's completion ends before its answer closes: the span is outside the completion
    cut = len(tok("<answer>cut</answer")["input_ids"])
    mask[3, cut:] = 0

    pattern = re.compile(r"<answer>.*?</answer>", re.DOTALL)
    out = answer_token_mask(tok, ids, mask, pattern)
    assert out.shape == ids.shape and out.dtype == torch.bool

    def marked_text(r: int) -> str:
        return str(tok.decode(ids[r][out[r]].tolist()))

    assert marked_text(0) == "<answer>london</answer>"
    assert not out[1].any()
    assert marked_text(2) == "<answer>caf\u00e9\nau lait</answer>"
    assert not out[3].any()
    # reference: tokens whose character span overlaps the final match
    for r in (0, 2):
        text = tok.decode(rows[r], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        start, end = [m.span() for m in pattern.finditer(text)][-1]
        expected = [s < end and e > start for s, e in _char_spans(tok, rows[r])]
        assert out[r, : len(rows[r])].tolist() == expected
        assert not out[r, len(rows[r]) :].any()
    # the multi-byte character is split over byte tokens: both are marked, nothing else
    assert len(tok("\u00e9")["input_ids"]) > 1


def test_answer_mask_custom_pattern_and_empty_batch() -> None:
    tok = tiny.build_tokenizer()
    row = tok("so \\boxed{4} and \\boxed{5}.")["input_ids"]
    ids = torch.tensor([row])
    out = answer_token_mask(tok, ids, torch.ones_like(ids), re.compile(r"\\boxed\{[^}]*\}"))
    assert tok.decode(ids[0][out[0]].tolist()) == "\\boxed{5}"
    empty = torch.zeros(0, 5, dtype=torch.int64)
    assert answer_token_mask(tok, empty, empty, re.compile("x")).shape == (0, 5)


def test_valid_searches_counted_from_the_mask() -> None:
    mask = torch.tensor([[1, 1, 0, 1, 0, 1], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    assert valid_searches_from_mask(mask) == pytest.approx(1.0)  # (2 + 0) / 2 rows with actions
    assert math.isnan(valid_searches_from_mask(torch.zeros(2, 3)))


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"llds": "maybe"}, "llds"),
        ({"llds": "on", "llds_lambda": -0.1}, "llds_lambda"),
        ({"llds": "on", "llds_lambda": math.nan}, "llds_lambda"),
        ({"llds": "on", "llds_gate": "chunk"}, "llds_gate"),
        ({"llds": "on", "llds_normalize": "tokens"}, "llds_normalize"),
        ({"llds": "on", "llds_answer_weight": -1.0}, "llds_answer_weight"),
        ({"llds": "on", "llds_answer_weight": "mab"}, "llds_answer_weight"),
        ({"llds": "on", "answer_pattern": "<answer>(.*"}, "answer_pattern"),
        ({"sapo_weight": -1.0, "sapo_threshold": 0.9}, "sapo_weight"),
        ({"sapo_weight": 0.5}, "sapo_threshold"),
        ({"sapo_weight": 0.5, "sapo_threshold": 0.0}, "sapo_threshold"),
        ({"llds": "auto", "lldmon_sink": RecordingSink()}, "llds"),
    ],
)
def test_invalid_static_arguments_raise_at_construction(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError, match=rf"\b{argument}\b"):
        MonitoredGRPOTrainer(model=None, **kwargs)  # raised before GRPOTrainer builds anything


def test_default_mode_depends_on_the_sink() -> None:
    common: dict[str, Any] = {
        "llds_lambda": 0.2,
        "llds_gate": "action",
        "llds_answer_weight": 1.0,
        "llds_normalize": "loss_tokens",
        "answer_pattern": r"<answer>.*?</answer>",
        "sapo_weight": 0.0,
        "sapo_threshold": None,
    }
    assert RegularizerSettings.build(llds=None, sink_has_directive=True, **common).mode == "auto"
    assert RegularizerSettings.build(llds=None, sink_has_directive=False, **common).mode == "off"
    ma = RegularizerSettings.build(
        llds="on", sink_has_directive=False, **{**common, "llds_answer_weight": "MA"}
    )
    assert ma.answer_weight == "ma" and ma.needs_answer_mask


def test_term_scale_matches_trl_normalisation() -> None:
    n_tok = torch.tensor(30)
    items = torch.tensor(240.0)  # generation batch over 2 processes, 4 micro-batches each
    for loss_type in ("grpo", "bnpo", "dr_grpo", "sapo", "luspo"):
        assert term_scale(
            loss_type=loss_type,
            normalize="loss_tokens",
            grad_accum=2,
            n_loss_tokens=n_tok,
            num_items_in_batch=items,
            num_processes=2,
            steps_per_generation=4,
        ) == pytest.approx(0.5)
    for loss_type in GLOBAL_TOKEN_LOSS_TYPES:
        scale = term_scale(
            loss_type=loss_type,
            normalize="loss_tokens",
            grad_accum=2,
            n_loss_tokens=n_tok,
            num_items_in_batch=items,
            num_processes=2,
            steps_per_generation=4,
        )
        # window = 240 / 2 processes * 2 / 4 = 60 loss tokens; this micro-batch holds 30 of them
        assert float(scale) == pytest.approx(0.5)
        assert term_scale(
            loss_type=loss_type,
            normalize="preserving_tokens",
            grad_accum=2,
            n_loss_tokens=n_tok,
            num_items_in_batch=items,
            num_processes=2,
            steps_per_generation=4,
        ) == pytest.approx(0.5)


def test_non_main_ranks_follow_the_main_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Multi-process: the mode agreed at construction, the directive broadcast at every step."""
    from types import SimpleNamespace

    import accelerate.utils

    from trainer_hooks.trl.regularizer import RegularizerDriver
    from trainer_hooks.trl.regularizer_parts import LLDSSwitch

    sent: list[list[float]] = []
    from_main: dict[str, list[float]] = {}

    def fake_broadcast(tensor: torch.Tensor, from_process: int = 0) -> torch.Tensor:
        assert from_process == 0
        sent.append(tensor.tolist())
        return torch.tensor(from_main["value"], dtype=tensor.dtype)

    monkeypatch.setattr(accelerate.utils, "broadcast", fake_broadcast)
    # a non-main rank, without building TRL: the driver only needs the trainer's accelerator
    rank1: Any = SimpleNamespace(
        accelerator=SimpleNamespace(num_processes=2, device=torch.device("cpu"), is_main_process=False)
    )
    off = RegularizerSettings()  # this rank got no sink: llds defaulted to "off"
    from_main["value"] = [2.0]  # the main process runs "auto"
    with caplog.at_level(logging.WARNING, logger="lldmon.trl"):
        driver = RegularizerDriver(rank1, off, sink=None, queue_metrics=None, drifted=lambda: True)
    assert driver.settings.mode == "auto" and sent == [[0.0]]
    assert any("main process" in r.getMessage() for r in caplog.records)

    from_main["value"] = [1.0, 1.0, 0.25, 7.0]  # main read: enabled, lam 0.25, version 7
    driver.step_begin(3)
    assert sent[-1] == [0.0, 0.0, 0.0, -1.0]  # this rank read nothing itself
    assert driver.switch == LLDSSwitch(enabled=True, lam=0.25, version=7, reason="")
    from_main["value"] = [0.0, 0.0, 0.0, -1.0]  # main had no readable directive: keep the setting
    driver.step_begin(4)
    assert driver.switch is not None and driver.switch.lam == 0.25 and driver.switch.enabled


class RecomputedOld(MonitoredGRPOTrainer):
    """On-policy TRL with `old_per_token_logps` from a separate forward, as with vLLM's
    importance-sampling correction: here the rollout's log-probs plus recompute noise."""

    def _generate_and_score_completions(self, inputs: Any) -> Any:
        output = super()._generate_and_score_completions(inputs)
        with torch.no_grad():
            prompt_completion = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
            attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
            logp, _, _ = super()._get_per_token_logps_and_entropies(
                self.model, prompt_completion, attention, output["completion_ids"].shape[1]
            )
        noise = 1e-3 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(0))
        output["old_per_token_logps"] = logp + noise
        return output


@trl_warnings
def test_llds_ignores_recompute_noise_on_policy(tmp_path: Path) -> None:
    """No optimizer step since the rollout means no displacement: LLDS must not gate on the noise of a
    recomputed old log-prob (before the fix ~half the actions were gated and llds/loss > 0)."""
    sink = RecordingSink()
    trainer = RecomputedOld(
        **_trainer_kwargs(tmp_path, steps_per_generation=1, max_steps=3),
        lldmon_sink=sink,
        probe_size=0,
        llds="on",
    )
    trainer.train()
    assert sink.series(M.LLDS_ACTIVE) == {1: 1.0, 2: 1.0, 3: 1.0}
    assert sink.series(M.LLDS_LOSS) == {1: 0.0, 2: 0.0, 3: 0.0}
    assert sink.series(M.LLDS_GATED_ACTION_FRAC) == {1: 0.0, 2: 0.0, 3: 0.0}

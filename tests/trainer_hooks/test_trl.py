"""Tests of trainer_hooks.trl: the TRL-name mapping, the step bookkeeping, and real TRL GRPO runs on CPU.

The real runs use `tests.trainer_hooks.tiny`: a random 2-layer Qwen2, an in-memory BPE tokenizer and a
`search` tool that the (biased) sampler calls, so every run is multi-turn with TRL's `tool_mask`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from contracts import metrics as M
from contracts.wire import ACTION_COLUMNS
from trainer_hooks.trl.measurement_parts import (
    EXACT_DELTA_METRICS,
    TRL_PROVIDED_METRICS,
    MicroBatch,
    ProbeBatch,
    StepAccumulator,
    in_loss_deltas_structurally_zero,
)

trl = pytest.importorskip("trl")

from tests.trainer_hooks import tiny  # noqa: E402
from trainer_hooks.trl import (  # noqa: E402
    TRL_TO_CANONICAL,
    LLDMonitorCallback,
    MonitoredGRPOTrainer,
    map_trl_logs,
)

# transformers 5.x deprecates the gradient_checkpointing names that TRL 1.16 itself still uses.
trl_warnings = pytest.mark.filterwarnings(
    r"ignore:`\w*gradient_checkpointing\w*` is deprecated:FutureWarning"
)

XMB_DELTAS = frozenset(M.EXACT_TO_XMB.values())


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The tiny model gains nothing from intra-op threads; on 2 busy cores they cost 5x the CPU time."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class RecordingSink:
    """In-memory `MetricSink`."""

    def __init__(self) -> None:
        self.metrics: list[tuple[int, dict[str, float]]] = []
        self.actions: list[tuple[int, dict[str, list[Any]]]] = []
        self.flushes = 0

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.metrics.append((step, dict(metrics)))

    def log_actions(self, step: int, columns: Mapping[str, Sequence[Any]]) -> None:
        self.actions.append((step, {k: list(v) for k, v in columns.items()}))

    def flush(self, timeout: float) -> None:
        self.flushes += 1

    def close(self) -> None:
        pass

    def series(self, name: str) -> dict[int, float]:
        return {step: m[name] for step, m in self.metrics if name in m}

    def names(self) -> set[str]:
        return {name for _, m in self.metrics for name in m}

    def records(self, source: str) -> list[dict[str, Any]]:
        rows = []
        for _, cols in self.actions:
            for i in range(len(cols["step"])):
                if cols["source"][i] == source:
                    rows.append({k: v[i] for k, v in cols.items()})
        return rows


def run_grpo(
    tmp: Path,
    *,
    sink: RecordingSink | None,
    monitored: bool = True,
    probe_size: int = 0,
    probe_interval: int = 1,
    anchor_interval: int = 2,
    **config: Any,
) -> Any:
    """Train the tiny model with TRL tool calling; returns the trainer."""
    tok = tiny.build_tokenizer()
    model = tiny.build_model(tok)
    if config.get("beta", 0.0) != 0.0:  # TRL loads the reference model from the model's path
        tiny.make_loadable(model, tmp / "model")
    kwargs: dict[str, Any] = {
        "model": model,
        "reward_funcs": tiny.hashed_reward,
        "args": tiny.grpo_config(tmp, tok, **config),
        "train_dataset": tiny.build_dataset(),
        "processing_class": tok,
        "tools": [tiny.search],
    }
    if monitored:
        trainer = MonitoredGRPOTrainer(
            **kwargs,
            lldmon_sink=sink,
            probe_size=probe_size,
            probe_interval=probe_interval,
            anchor_interval=anchor_interval,
        )
    else:
        trainer = trl.GRPOTrainer(
            **kwargs, callbacks=[LLDMonitorCallback(sink)] if sink is not None else None
        )
    trainer.train()
    return trainer


# ----------------------------------------------------------------------------------------------
# name mapping and the callback


def test_map_trl_logs_renames_passes_through_and_drops_non_scalars() -> None:
    logs: dict[str, object] = {
        "loss": 0.25,
        "grad_norm": math.inf,
        "reward": 0.5,
        "reward_std": 0.1,
        "frac_reward_zero_std": 0.25,
        "entropy": np.float32(1.5),
        "completions/mean_length": 12,
        "completions/clipped_ratio": 0.0,
        "kl": torch.tensor(0.01),
        "clip_ratio/region_mean": math.nan,
        "learning_rate": 1e-6,
        "rewards/accuracy/mean": 0.5,
        "tools/call_frequency": 2.0,
        "tools/failure_frequency": 0.25,
        "clip_ratio/low_mean": 0.0,
        "eval_reward": 0.3,
        "flag": True,
        "none": None,
        "text": "hello",
        "vector": [1.0, 2.0],
        "matrix": torch.ones(2),
        "x" * 300: 1.0,
    }
    out = map_trl_logs(logs)
    assert out[M.LOSS] == 0.25
    assert out[M.GRAD_NORM] == math.inf
    assert out[M.REWARD_MEAN] == 0.5
    assert out[M.REWARD_STD] == 0.1
    assert out[M.ADV_FRAC_ZERO_STD_GROUPS] == 0.25
    assert out[M.ENTROPY_MEAN] == 1.5
    assert out[M.RESPONSE_LENGTH_MEAN] == 12.0
    assert out[M.RESPONSE_CLIP_RATIO] == 0.0
    assert out[M.KL_REF] == pytest.approx(0.01)
    assert math.isnan(out[M.CLIP_FRAC])
    assert out[M.SEARCH_VALID_PER_TRAJ] == 1.5
    for passthrough in ("learning_rate", "rewards/accuracy/mean", "tools/call_frequency", "eval_reward"):
        assert out[passthrough] == logs[passthrough]
    assert out["clip_ratio/low_mean"] == 0.0
    assert out["flag"] == 1.0
    for dropped in ("none", "text", "vector", "matrix", "x" * 300):
        assert dropped not in out
    # renamed keys do not also appear under their TRL names
    assert not {k for k, v in TRL_TO_CANONICAL.items() if k != v} & set(out)
    assert set(TRL_TO_CANONICAL.values()) <= set(M.CANONICAL_METRICS)


def test_callback_sends_on_main_process_only_and_flushes(tmp_path: Path) -> None:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    sink = RecordingSink()
    callback = LLDMonitorCallback(sink, flush_timeout=1.5)
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    control = TrainerControl()
    callback.on_log(
        args, TrainerState(global_step=3, is_world_process_zero=False), control, logs={"loss": 1.0}
    )
    assert sink.metrics == []
    main = TrainerState(global_step=3, is_world_process_zero=True)
    callback.on_log(args, main, control, logs={"loss": 1.0, "reward": 0.5, "epoch": 0.1})
    assert sink.metrics == [(3, {M.LOSS: 1.0, M.REWARD_MEAN: 0.5, "epoch": 0.1})]
    callback.on_train_end(args, main, control)
    assert sink.flushes == 1


def test_callback_survives_a_failing_sink(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    class Broken(RecordingSink):
        def log(self, step: int, metrics: Mapping[str, float]) -> None:
            raise ConnectionError("down")

    sink = Broken()
    callback = LLDMonitorCallback(sink)
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    state = TrainerState(global_step=1, is_world_process_zero=True)
    with caplog.at_level(logging.WARNING, logger="lldmon.trl"):
        for _ in range(3):
            callback.on_log(args, state, TrainerControl(), logs={"loss": 1.0})
        callback.on_train_end(args, state, TrainerControl())
    failures = [r for r in caplog.records if r.name == "lldmon.trl"]
    assert len(failures) == 1 and "switched off" in failures[0].getMessage()
    assert sink.flushes == 0


# ----------------------------------------------------------------------------------------------
# step bookkeeping (pure torch)


@pytest.mark.parametrize(
    ("accumulation", "per_generation", "iterations", "zero"),
    [
        (1, 1, 1, True),
        (4, 4, 1, True),
        (4, 2, 1, True),
        (1, 2, 1, False),
        (2, 4, 1, False),
        (2, 1, 2, True),
        (1, 1, 2, False),
        (3, 2, 1, False),
    ],
)
def test_structural_zero_condition(
    accumulation: int, per_generation: int, iterations: int, zero: bool
) -> None:
    assert in_loss_deltas_structurally_zero(accumulation, per_generation, iterations) is zero


def test_estimator_names_are_apart() -> None:
    """Every exact delta name has its own cross-mini-batch proxy name, and none is both."""
    assert set(M.EXACT_TO_XMB) == EXACT_DELTA_METRICS
    assert not XMB_DELTAS & EXACT_DELTA_METRICS
    assert all(name.startswith("lld/xmb/") for name in XMB_DELTAS)
    assert set(M.CANONICAL_METRICS) >= (XMB_DELTAS | EXACT_DELTA_METRICS)


def _micro(
    rows: list[tuple[list[int], list[float], list[float], float]], first_id: int, drift: bool
) -> MicroBatch:
    """rows: (mask, old, new, advantage)."""
    return MicroBatch(
        new_logp=torch.tensor([r[2] for r in rows]),
        old_logp=torch.tensor([r[1] for r in rows]),
        mask=torch.tensor([r[0] for r in rows]),
        advantages=torch.tensor([r[3] for r in rows]),
        rewards=torch.tensor([1.0 if r[3] > 0 else 0.0 for r in rows]),
        traj_id=torch.arange(first_id, first_id + len(rows)),
        drift=drift,
    )


def test_accumulator_takes_deltas_and_records_from_drifted_rows_only() -> None:
    acc = StepAccumulator(max_action_records=None)
    # Not drifted (first micro-batch of a rollout): new == old. Width 3.
    acc.add(_micro([([1, 1, 0], [-1.0, -1.0, 0.0], [-1.0, -1.0, 0.0], 1.0)], first_id=10, drift=False))
    # Drifted, width 4 (another rollout batch in the same step): two actions separated by a tool token.
    acc.add(
        _micro(
            [
                ([1, 0, 1, 1], [-2.0, -9.0, -1.0, -1.0], [-2.5, 5.0, -1.0, -0.5], 1.0),
                ([1, 1, 0, 0], [-3.0, -3.0, 0.0, 0.0], [-2.0, -3.0, 0.0, 0.0], -1.0),
            ],
            first_id=20,
            drift=True,
        )
    )
    result = acc.finish(step=7)
    assert result is not None and len(acc) == 0
    # levels over all rows: pos rows 10 and 20 -> old sum (-2) + (-4) over 5 tokens
    assert result.metrics[M.LOGP_POS] == pytest.approx(-6.0 / 5)
    assert result.metrics[M.LOGP_NEG] == pytest.approx(-3.0)
    # correct = reward >= 1 (here the A > 0 rows): the same level
    assert result.metrics[M.LOGP_CORRECT] == pytest.approx(-6.0 / 5)
    # deltas over drifted rows only, under the cross-mini-batch names: pos row 20 D_traj = -0.5 + 0.5
    assert result.metrics[M.XMB_DELTA_TRAJ_POS] == pytest.approx(0.0)
    assert result.metrics[M.XMB_DELTA_TRAJ_NEG] == pytest.approx(1.0)
    assert result.metrics[M.XMB_DELTA_ACTION_POS] == pytest.approx(0.0)
    assert result.metrics[M.XMB_FRAC_ACTION_DECREASED_POS] == pytest.approx(0.5)
    assert result.metrics[M.XMB_DELTA_TRAJ_CORRECT] == pytest.approx(0.0)
    assert not EXACT_DELTA_METRICS & set(result.metrics)  # never under the exact names
    assert not TRL_PROVIDED_METRICS & set(result.metrics)
    assert result.actions is not None
    assert set(result.actions) == set(ACTION_COLUMNS)
    assert result.actions["traj_index"] == [20, 20, 21]
    assert result.actions["action_index"] == [0, 1, 0]
    assert result.actions["delta"] == pytest.approx([-0.5, 0.5, 1.0])
    assert result.actions["source"] == ["loss"] * 3 and result.actions["step"] == [7] * 3
    assert acc.finish(step=8) is None


def test_accumulator_without_drift_has_levels_but_no_deltas_or_records() -> None:
    acc = StepAccumulator()
    acc.add(_micro([([1, 1], [-1.0, -2.0], [-1.0, -2.0], 1.0)], first_id=0, drift=False))
    result = acc.finish(step=1)
    assert result is not None
    assert result.metrics[M.LOGP_POS] == pytest.approx(-1.5)
    assert not (EXACT_DELTA_METRICS | XMB_DELTAS) & set(result.metrics)
    assert M.RATIO_POS_MEAN not in result.metrics
    assert result.actions is None


def test_probe_batch_captures_rollout_logps_and_measures_exact_deltas() -> None:
    batch, width = 6, 3
    completion = torch.arange(batch * width).reshape(batch, width)
    mask = torch.tensor([[1, 1, 0]] * batch)
    probe = ProbeBatch.select(
        prompt_ids=torch.zeros(batch, 2, dtype=torch.int64),
        prompt_mask=torch.ones(batch, 2, dtype=torch.int64),
        completion_ids=completion,
        completion_mask=torch.ones(batch, width, dtype=torch.int64),
        loss_mask=mask,
        advantages=torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0]),
        rewards=None,
        traj_id=torch.arange(100, 100 + batch),
        old_logp=None,
        size=4,
        generator=torch.Generator().manual_seed(0),
    )
    assert probe.size == 4 and probe.input_ids.shape == (4, 2 + width)
    assert not probe.known[:4].any()
    # micro-batches arrive shuffled; each row's log-probs are -traj_id / 100 per token
    for ids in ([103, 100, 105], [101, 104, 102]):
        traj = torch.tensor(ids)
        probe.capture(traj, (-traj.float() / 100)[:, None].expand(-1, width))
    assert probe.known[:4].all()
    expected_old = (-probe.traj_id.float() / 100)[:, None].expand(-1, width)
    assert torch.equal(probe.old_logp[:4], expected_old)
    result = probe.measure(expected_old + 0.25, step=3)
    assert result.actions is not None
    assert result.actions["source"] == ["probe"] * 4
    assert sorted(result.actions["traj_index"]) == sorted(probe.traj_id.tolist())
    assert result.actions["delta"] == pytest.approx([0.5] * 4)
    # only exact delta metrics, under their canonical names (no ratios, no levels)
    assert set(result.metrics) <= EXACT_DELTA_METRICS and result.metrics
    assert result.metrics[M.DELTA_TRAJ_POS] == pytest.approx(0.5)


# ----------------------------------------------------------------------------------------------
# real TRL runs


@pytest.fixture(scope="module")
def drift_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[RecordingSink, Any]:
    """4 steps, 2 per rollout batch (in-loss deltas on every 2nd step), probe of every row each step."""
    sink = RecordingSink()
    trainer = run_grpo(tmp_path_factory.mktemp("drift"), sink=sink, probe_size=8, probe_interval=1)
    return sink, trainer


def _assert_sane(sink: RecordingSink) -> None:
    for step, metrics in sink.metrics:
        for name, value in metrics.items():
            if (
                name.startswith(("lld/", "ratio/", "adv/", "garbled/", "turns/"))
                and name != M.ADV_POS_NEG_MASS_RATIO
            ):
                assert math.isfinite(value), (step, name, value)
            if name in (M.LOGP_POS, M.LOGP_NEG):
                assert value <= 0.0
            if "frac" in name and name.startswith(("lld/", "ratio/", "garbled/", "adv/")):
                assert 0.0 <= value <= 1.0, (name, value)
            if name.startswith("ratio/") and not name.endswith("frac_low"):
                assert value > 0.0


def _assert_records(sink: RecordingSink) -> None:
    assert sink.actions
    for step, cols in sink.actions:
        assert set(cols) == set(ACTION_COLUMNS)
        n = len(cols["step"])
        assert n > 0 and all(len(v) == n for v in cols.values())
        assert cols["step"] == [step] * n
        assert all(k > 0 for k in cols["n_tokens"])
        assert all(math.isfinite(x) for x in cols["delta"] + cols["old_logp_mean"] + cols["advantage"])
        assert all(x <= 0.0 for x in cols["old_logp_mean"])
        assert all(math.isfinite(r) for r in cols["reward"])
        assert set(cols["source"]) <= {"loss", "probe"}
        seen: dict[int, list[int]] = {}
        for traj, action in zip(cols["traj_index"], cols["action_index"], strict=True):
            seen.setdefault(traj, []).append(action)
        assert all(actions == list(range(len(actions))) for actions in seen.values())


@trl_warnings
def test_real_run_sends_canonical_metrics(drift_run: tuple[RecordingSink, Any]) -> None:
    sink, trainer = drift_run
    assert trainer.state.global_step == 4
    names = sink.names()
    for name in (
        M.LOSS,
        M.GRAD_NORM,
        M.REWARD_MEAN,
        M.REWARD_STD,
        M.ENTROPY_MEAN,
        M.RESPONSE_LENGTH_MEAN,
        M.ADV_FRAC_ZERO_STD_GROUPS,
        M.CLIP_FRAC,
        M.SEARCH_VALID_PER_TRAJ,
        M.LOGP_POS,
        M.LOGP_NEG,
        M.TURNS_MEAN,
        M.GARBLED_FRAC,
        M.DELTA_TRAJ_POS,
        M.DELTA_TRAJ_NEG,
        M.DELTA_ACTION_POS,
        M.FRAC_TRAJ_DECREASED_POS,
        M.FRAC_ACTION_DECREASED_POS,
        M.XMB_DELTA_TRAJ_POS,
        M.RATIO_POS_MEAN,
        M.LOGP_CORRECT,
        M.ADV_POS_NEG_MASS_RATIO,
        M.ANCHOR_LOGP,
        M.ANCHOR_SIZE,
    ):
        assert name in names, name
    assert "learning_rate" in names and "tools/call_frequency" in names  # pass-through
    # level metrics and exact (probe) deltas every step; the cross-mini-batch proxy only on the steps
    # that train a drifted micro-batch
    assert sorted(sink.series(M.LOGP_POS)) == [1, 2, 3, 4]
    assert sorted(sink.series(M.DELTA_TRAJ_POS)) == [1, 2, 3, 4]
    assert sorted(sink.series(M.XMB_DELTA_TRAJ_POS)) == [2, 4]
    assert any(v != 0.0 for v in sink.series(M.XMB_DELTA_TRAJ_POS).values())
    # the anchor set is re-scored every anchor_interval (2) steps; its delta needs an older baseline
    assert sorted(sink.series(M.ANCHOR_LOGP)) == [2, 4]
    assert sorted(sink.series(M.ANCHOR_DELTA)) == [4]
    # the tool made trajectories multi-action (tool_mask gaps)
    assert max(sink.series(M.TURNS_MEAN).values()) > 1.0
    # TRL-logged metrics arrive once per step, under canonical names only
    assert sorted(sink.series(M.GRAD_NORM)) == [1, 2, 3, 4]
    assert "grad_norm" not in names and "reward" not in names
    _assert_sane(sink)
    assert sink.flushes == 1


@trl_warnings
def test_real_run_action_records_and_probe(drift_run: tuple[RecordingSink, Any]) -> None:
    sink, _ = drift_run
    _assert_records(sink)
    loss, probe = sink.records("loss"), sink.records("probe")
    assert {r["step"] for r in loss} == {2, 4}
    assert {r["step"] for r in probe} == {1, 2, 3, 4}
    assert max(r["action_index"] for r in loss) >= 1
    # the probe's exact deltas own the canonical names, whatever the in-loss deltas do
    assert sorted(sink.series(M.DELTA_TRAJ_POS)) == [1, 2, 3, 4]
    assert any(r["delta"] != 0.0 for r in probe)
    # Consistency of the two paths: the probe after step 1 and the loss of step 2 see the same model
    # (updated once) and the same rollout-time old log-probs, so their action deltas agree.
    probe_1 = {(r["traj_index"], r["action_index"]): r for r in probe if r["step"] == 1}
    loss_2 = [r for r in loss if r["step"] == 2]
    assert loss_2
    for r in loss_2:
        p = probe_1[(r["traj_index"], r["action_index"])]
        assert r["delta"] == pytest.approx(p["delta"], abs=1e-4)
        assert r["old_logp_mean"] == pytest.approx(p["old_logp_mean"], abs=1e-5)
        assert (r["n_tokens"], r["advantage"], r["reward"]) == (p["n_tokens"], p["advantage"], p["reward"])


@trl_warnings
def test_monitoring_does_not_change_training(drift_run: tuple[RecordingSink, Any], tmp_path: Path) -> None:
    """Same seed, same losses with and without the hooks; the bare callback gives the degraded mode."""
    _, monitored = drift_run
    sink = RecordingSink()
    plain = run_grpo(tmp_path, sink=sink, monitored=False)
    assert {M.LOSS, M.GRAD_NORM, M.REWARD_MEAN, M.ENTROPY_MEAN} <= sink.names()
    assert not any(name.startswith("lld/") for name in sink.names()) and sink.actions == []
    assert sink.flushes == 1

    def history(trainer: Any) -> list[tuple[Any, ...]]:
        return [
            (h["step"], h.get("loss"), h.get("reward"), h.get("grad_norm"), h.get("entropy"))
            for h in trainer.state.log_history
            if "loss" in h
        ]

    assert history(monitored) == history(plain)


@trl_warnings
def test_on_policy_without_probe_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sink = RecordingSink()
    with caplog.at_level(logging.WARNING, logger="lldmon.trl"):
        trainer = run_grpo(tmp_path, sink=sink, probe_size=0, steps_per_generation=1, max_steps=3)
        trainer.train()  # a second train() call on the same trainer does not warn again
    warnings = [r for r in caplog.records if r.name == "lldmon.trl"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "probe is off" in warnings[0].getMessage()
    names = sink.names()
    assert M.LOGP_POS in names or M.LOGP_NEG in names
    assert not (EXACT_DELTA_METRICS | XMB_DELTAS | {M.RATIO_POS_MEAN}) & names
    assert sink.actions == []
    _assert_sane(sink)


@trl_warnings
def test_on_policy_probe_owns_canonical_delta_names(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sink = RecordingSink()
    with caplog.at_level(logging.WARNING, logger="lldmon.trl"):
        run_grpo(
            tmp_path,
            sink=sink,
            probe_size=4,
            probe_interval=1,
            steps_per_generation=1,
            max_steps=2,
            logging_steps=2,
        )
    assert not [r for r in caplog.records if r.name == "lldmon.trl"]
    # logging_steps=2: every optimizer step still gets its own values
    assert sorted(sink.series(M.DELTA_TRAJ_POS) or sink.series(M.DELTA_TRAJ_NEG)) == [1, 2]
    assert sorted(sink.series(M.LOGP_POS) or sink.series(M.LOGP_NEG)) == [1, 2]
    assert sorted(sink.series(M.GRAD_NORM)) == [1, 2]
    assert not XMB_DELTAS & sink.names()
    assert {s for _, cols in sink.actions for s in cols["source"]} == {"probe"}
    _assert_records(sink)
    _assert_sane(sink)


@trl_warnings
@pytest.mark.parametrize(
    ("loss_type", "level", "beta"),
    [
        ("grpo", "token", 0.0),
        ("dapo", "token", 0.0),
        ("dr_grpo", "token", 0.0),
        ("bnpo", "token", 0.0),
        ("cispo", "token", 0.0),
        ("sapo", "token", 0.0),
        ("grpo", "sequence", 0.05),
        ("sapo", "sequence", 0.0),
    ],
)
def test_every_objective(tmp_path: Path, loss_type: str, level: str, beta: float) -> None:
    sink = RecordingSink()
    run_grpo(
        tmp_path,
        sink=sink,
        probe_size=2,
        max_steps=2,
        loss_type=loss_type,
        importance_sampling_level=level,
        beta=beta,
    )
    names = sink.names()
    assert M.DELTA_TRAJ_POS in names or M.DELTA_TRAJ_NEG in names
    assert sorted(sink.series(M.LOSS)) == [1, 2]
    assert (M.KL_REF in names) == (beta != 0.0)
    assert {s for _, cols in sink.actions for s in cols["source"]} == {"loss", "probe"}
    _assert_records(sink)
    _assert_sane(sink)


@trl_warnings
def test_measurement_failure_never_stops_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainer_hooks.trl.measurement_parts as trl_measure

    def boom(**kwargs: Any) -> Any:
        raise RuntimeError("measurement bug")

    monkeypatch.setattr(trl_measure, "measure_step", boom)
    sink = RecordingSink()
    with caplog.at_level(logging.WARNING, logger="lldmon.trl"):
        trainer = run_grpo(tmp_path, sink=sink, probe_size=2, max_steps=2)
    assert trainer.state.global_step == 2
    messages = [r.getMessage() for r in caplog.records if r.name == "lldmon.trl"]
    assert len(messages) == 2, messages  # measurement and probe: each warns once, then stays off
    assert all("switched off" in m for m in messages)
    assert not trainer.lldmon_active and not trainer.lldmon_probe_enabled
    # TRL's own metrics still flow
    assert sorted(sink.series(M.LOSS)) == [1, 2]
    # the anchor set is guarded apart (it does not use measure_step) and goes on
    assert not any(name.startswith("lld/") and not name.startswith("lld/anchor/") for name in sink.names())


@trl_warnings
def test_end_to_end_with_the_client_and_a_live_server(tmp_path: Path) -> None:
    from tests.live_server import LiveServer
    from trainer_hooks.client import MonitorClient

    with LiveServer(tmp_path / "server").start() as server:
        client = MonitorClient(
            server.url,
            "tiny-grpo",
            project="e2e",
            config={"loss_type": "dapo"},
            spool_dir=tmp_path / "spool",
            flush_interval=0.05,
            timeout=5.0,
            enabled=True,
        )
        try:
            run_grpo(tmp_path / "run", sink=client, probe_size=4, probe_interval=2)
            assert client.flush(30)
            run_id = client.run_id
            assert run_id is not None
            series = server.series(run_id)
            assert series[M.GRAD_NORM]["steps"] == [1, 2, 3, 4]
            assert series[M.LOGP_POS]["steps"] == [1, 2, 3, 4] or series[M.LOGP_NEG]["steps"] == [1, 2, 3, 4]
            assert series[M.XMB_DELTA_TRAJ_POS]["steps"] == [2, 4] or series[M.XMB_DELTA_TRAJ_NEG][
                "steps"
            ] == [
                2,
                4,
            ]
            assert series[M.DELTA_TRAJ_POS]["steps"] == [2, 4]  # the probe, every probe_interval = 2 steps
            assert all(v <= 0 for v in series.get(M.LOGP_POS, {"values": []})["values"])
            probe = server.get(f"/runs/{run_id}/actions", source="probe")
            loss = server.get(f"/runs/{run_id}/actions", source="loss")
            assert set(probe["step"]) == {2, 4} and set(probe["source"]) == {"probe"}
            assert set(loss["step"]) == {2, 4} and set(loss["source"]) == {"loss"}
            assert len(set(loss["traj_index"])) == 8  # every drifted trajectory of both rollouts
        finally:
            client.close(timeout=10)


# ----------------------------------------------------------------------------------------------
# TRL's default schedule and logging: every optimizer step still delivers


def _per_step(history: list[dict[str, Any]], key: str) -> dict[int, float]:
    return {int(h["step"]): float(h[key]) for h in history if key in h}


@trl_warnings
def test_default_schedule_and_logging_deliver_every_step(tmp_path: Path) -> None:
    """TRL's defaults (steps_per_generation == gradient_accumulation_steps, logging_steps=10) and a
    trainer given nothing but a sink: the exact delta, reward, entropy, grad norm, the correct-response
    level and a varying per-token advantage mass ratio arrive at every optimizer step, with the values
    TRL itself logs when asked to log every step."""
    steps = 6
    sink = RecordingSink()
    tok = tiny.build_tokenizer()
    trainer = MonitoredGRPOTrainer(
        model=tiny.build_model(tok),
        reward_funcs=tiny.hashed_reward,
        args=tiny.grpo_config(
            tmp_path / "monitored", tok, steps_per_generation=1, logging_steps=10, max_steps=steps
        ),
        train_dataset=tiny.build_dataset(),
        processing_class=tok,
        tools=[tiny.search],
        lldmon_sink=sink,
    )
    trainer.train()
    every = list(range(1, steps + 1))
    for name in (M.REWARD_MEAN, M.ENTROPY_MEAN, M.GRAD_NORM, M.LOSS, M.ADV_POS_NEG_MASS_RATIO):
        assert sorted(sink.series(name)) == every, name
    assert sorted(set(sink.series(M.DELTA_TRAJ_POS)) | set(sink.series(M.DELTA_TRAJ_NEG))) == every
    # The probe's 2 rows are drawn by advantage sign: a step whose batch has A > 0 (A < 0) responses,
    # seen in the rollout-time level of that population, gets that population's exact delta.
    for level, delta in ((M.LOGP_POS, M.DELTA_TRAJ_POS), (M.LOGP_NEG, M.DELTA_TRAJ_NEG)):
        assert sorted(sink.series(delta)) == sorted(sink.series(level)), delta
    assert sorted(set(sink.series(M.LOGP_POS)) & set(sink.series(M.LOGP_NEG))), "no step had both signs"
    assert len(sink.series(M.LOGP_CORRECT)) >= steps - 1  # a batch may have no correct answer
    assert sorted(sink.series(M.ANCHOR_LOGP)) == [5]  # anchor_interval defaults to 5
    assert trainer.lldmon_settings.probe_size == 2 and trainer.lldmon_anchors is not None  # 4 rows per step
    assert trainer.lldmon_anchors.capacity == 8
    assert len(set(sink.series(M.ADV_POS_NEG_MASS_RATIO).values())) > 1
    assert not XMB_DELTAS & sink.names()  # on-policy: no cross-mini-batch drift exists
    # TRL's window means never overwrite the per-step values
    assert all(len(m) > 0 for _, m in sink.metrics)
    assert sum(1 for step, m in sink.metrics if M.GRAD_NORM in m) == steps

    # The same training logged by TRL at every step: identical per-step values.
    plain = run_grpo(tmp_path / "plain", sink=None, monitored=False, steps_per_generation=1, max_steps=steps)
    history = plain.state.log_history
    for key, name in (("reward", M.REWARD_MEAN), ("grad_norm", M.GRAD_NORM), ("entropy", M.ENTROPY_MEAN)):
        expected = _per_step(history, key)
        assert sink.series(name) == pytest.approx(expected, rel=1e-6), key
    assert sink.series(M.LOSS) == pytest.approx(_per_step(history, "loss"), rel=1e-5, abs=1e-7)


@trl_warnings
def test_sink_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer_hooks.client import MonitorClient

    tok = tiny.build_tokenizer()
    kwargs: dict[str, Any] = {
        "model": tiny.build_model(tok),
        "reward_funcs": tiny.hashed_reward,
        "args": tiny.grpo_config(tmp_path, tok, run_name="grpo-nq-7"),
        "train_dataset": tiny.build_dataset(),
        "processing_class": tok,
        "tools": [tiny.search],
    }
    monkeypatch.delenv("LLDMON_URL", raising=False)
    assert MonitoredGRPOTrainer(**kwargs).lldmon_sink is None  # no environment: monitoring off
    monkeypatch.setenv("LLDMON_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("LLDMON_PROJECT", "nq")
    monkeypatch.setenv("RANK", "1")  # a disabled client: nothing is sent from this test
    trainer = MonitoredGRPOTrainer(**kwargs)
    sink = trainer.lldmon_sink
    assert isinstance(sink, MonitorClient)
    try:
        assert sink.url == "http://127.0.0.1:9"
        assert sink.identity.run_name == "grpo-nq-7" and sink.identity.project == "nq"
        assert sink.identity.config["learning_rate"] == pytest.approx(5e-2)
        assert trainer.llds_settings.mode == "auto"  # the client has a directive
    finally:
        sink.close(timeout=1)
    assert MonitoredGRPOTrainer(**kwargs, lldmon_sink=None).lldmon_sink is None


@pytest.mark.parametrize(
    ("rows", "probe", "anchors"), [(1, 2, 8), (8, 2, 8), (16, 4, 16), (32, 8, 32), (256, 8, 32)]
)
def test_auto_sizes_follow_rows_per_step(rows: int, probe: int, anchors: int) -> None:
    from trainer_hooks.trl import auto_anchor_size, auto_probe_size

    assert auto_probe_size(rows) == probe and auto_anchor_size(rows) == anchors


@trl_warnings
def test_bad_arguments_fail_before_a_client_is_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    monkeypatch.setenv("LLDMON_URL", "http://127.0.0.1:9")
    tok = tiny.build_tokenizer()
    before = {t.ident for t in threading.enumerate() if t.name == "lldmon-sender"}
    with pytest.raises(ValueError, match="llds_gate"):
        MonitoredGRPOTrainer(
            model=tiny.build_model(tok),
            reward_funcs=tiny.hashed_reward,
            args=tiny.grpo_config(tmp_path, tok),
            train_dataset=tiny.build_dataset(),
            processing_class=tok,
            llds_gate="everywhere",
        )
    with pytest.raises(ValueError, match="anchor_size"):
        MonitoredGRPOTrainer(model=None, anchor_size=-1)
    after = {t.ident for t in threading.enumerate() if t.name == "lldmon-sender"}
    assert after == before

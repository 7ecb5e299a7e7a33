"""Signals, phase transitions, hysteresis, findings, NaN handling, config and online == offline."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import math
from pathlib import Path

import numpy as np
import pytest

from contracts import metrics as M
from lldmon_lab.lab.fixtures import read_fixture
from lldmon_lab.labels import collapse_step
from lldmon_lab.replay import thin
from lldmon_lab.scenarios import Scenario, collapse_scenario, noisy_stagnant_scenario
from monitor.detector import (
    ADVANTAGE_COLLAPSE,
    CLIP_RATIO_SATURATED,
    COLLAPSE,
    DECAY,
    ENTROPY_COLLAPSE,
    ENTROPY_EXPLOSION,
    GARBLED_OUTPUTS,
    HEALTHY,
    KL_BLOWUP,
    LENGTH_COLLAPSE,
    LLD_COLLAPSE,
    LLD_DECAY,
    NONFINITE_GRAD,
    NONFINITE_LOSS,
    PATHOLOGY_KINDS,
    RATIO_BLOWUP,
    REWARD_ZERO,
    SEVERITY,
    STAGNATION,
    TERMINAL_KINDS,
    TRAINING_COLLAPSE,
    WARMUP,
    DetectorConfig,
    DetectorState,
    OfflineResult,
    SeriesWindow,
    detect_offline,
    signals,
    update,
)
from monitor.detector import config as config_module
from monitor.detector.signals import History

LAB_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "lab"

CFG = DetectorConfig(
    reward_floor=0.0
)  # the rewards here are success rates: their floor, declared as a user would
Series = dict[str, np.ndarray]


def base(n: int, seed: int = 0, hooks: bool = False) -> Series:
    """A calm run: reward rising and saturating, stable grad norm / entropy / length."""
    rng = np.random.default_rng(seed)
    t = np.arange(n, dtype=np.float64)
    values: Series = {
        M.REWARD_MEAN: 0.2 + 0.4 * (1 - np.exp(-t / 40)) + rng.normal(0, 0.01, n),
        M.GRAD_NORM: np.exp(rng.normal(0, 0.1, n)),
        M.ENTROPY_MEAN: 0.5 * (1 + rng.normal(0, 0.02, n)),
        M.RESPONSE_LENGTH_MEAN: 300 * (1 + rng.normal(0, 0.03, n)),
        M.RESPONSE_CLIP_RATIO: np.abs(rng.normal(0.02, 0.005, n)),
        M.KL_OLD: np.abs(rng.normal(0.002, 0.0005, n)),
        M.KL_REF: np.abs(np.random.default_rng(seed + 1000).normal(0.01, 0.002, n)),
        M.LOSS: rng.normal(0, 0.02, n),
    }
    if hooks:
        values[M.LOGP_POS] = -0.3 + rng.normal(0, 0.01, n)
        values[M.FRAC_TRAJ_DECREASED_POS] = 0.3 + rng.normal(0, 0.02, n)
        values[M.DELTA_TRAJ_POS] = 0.03 + rng.normal(0, 0.01, n)
    return values


def run(
    values: Series, present: dict[str, np.ndarray] | None = None, config: DetectorConfig = CFG
) -> OfflineResult:
    n = next(iter(values.values())).size
    return detect_offline(np.arange(n), values, config, present)


def entered(result: OfflineResult, phase: str) -> int | None:
    return next((c.step for c in result.phase_changes if c.phase == phase), None)


def spans(result: OfflineResult, kind: str) -> list[tuple[int, int]]:
    return [(f.first_step, f.last_step) for f in result.findings if f.kind == kind]


# --- phases -------------------------------------------------------------------------------------------


def test_warmup_then_healthy() -> None:
    result = run(base(60))
    assert result.phases.shape == (60,)
    # the warm-up counts steps from the run's first step (not points)
    assert result.phases[: CFG.warmup_steps].tolist() == [WARMUP] * CFG.warmup_steps
    assert [(c.step, c.phase, c.previous_phase) for c in result.phase_changes] == [
        (CFG.warmup_steps, HEALTHY, WARMUP)
    ]
    assert result.findings == [] and result.degraded


def test_stagnation_when_likelihood_flat_and_reward_rises() -> None:
    values = base(150, hooks=True)
    values[M.REWARD_MEAN] = np.linspace(0.1, 0.7, 150) + np.random.default_rng(1).normal(0, 0.01, 150)
    result = run(values)
    assert STAGNATION in result.phases
    change = next(c for c in result.phase_changes if c.phase == STAGNATION)
    assert set(change.evidence["reasons"]) == {"logp_pos_flat", "reward_rising"}
    assert "degraded" not in change.evidence
    assert not result.kinds() & {LLD_DECAY, LLD_COLLAPSE}


def declining(
    n: int = 160, onset: int = 60, slope: float = -0.003, seed: int = 2, correct: bool = True
) -> Series:
    """`lld/logp_pos` declining from `onset`; with `correct`, `lld/logp_correct` too (LLD), else only the
    A > 0 population's mean (population shift)."""
    values = base(n, seed, hooks=True)
    t = np.arange(n, dtype=np.float64)
    values[M.LOGP_POS] = values[M.LOGP_POS] + slope * np.clip(t - onset, 0, None)
    noise = np.random.default_rng(seed + 50).normal(0, 0.01, n)
    values[M.LOGP_CORRECT] = (values[M.LOGP_POS] if correct else np.full(n, -0.3)) + noise
    return values


def test_decay_on_a_steady_likelihood_decline() -> None:
    result = run(declining())
    start = entered(result, DECAY)
    assert start is not None and 60 < start <= 95
    assert COLLAPSE not in result.phases
    ((first, last),) = spans(result, LLD_DECAY)
    assert first == start and last == 159
    finding = next(f for f in result.findings if f.kind == LLD_DECAY)
    assert finding.severity == "warning"
    change = next(c for c in result.phase_changes if c.phase == DECAY)
    assert "logp_correct_decline" in change.evidence["reasons"]
    signal = change.evidence["signals"]["logp_correct_decline"]
    assert signal["fired"] and signal["statistic"] <= -CFG.decay_z and signal["cusum"] >= CFG.cusum_h
    assert signal["window"] == CFG.trend_window and "degraded" not in change.evidence


def test_population_shift_alone_is_not_decay() -> None:
    """The A > 0 population's mean log-prob falls (easy groups leave it) while the correct responses keep
    their likelihood: `logp_pos_decline` fires but only supports; the run stays healthy."""
    values = declining(correct=False)
    result = run(values)
    assert DECAY not in result.phases and COLLAPSE not in result.phases
    assert LLD_DECAY not in result.kinds()
    assert signals.likelihood_decline(history({M.LOGP_POS: values[M.LOGP_POS]}), CFG)[0].fired


def test_decay_on_the_anchor_set() -> None:
    """The anchor set (scored every 5 steps) falling 0.3+ nats below its peak with a downward trend."""
    values = base(200, 8, hooks=True)
    t = np.arange(200, dtype=np.float64)
    anchor = -0.3 - 0.006 * np.clip(t - 80, 0, None) + np.random.default_rng(9).normal(0, 0.01, 200)
    anchor[t % 5 != 0] = np.nan
    values[M.ANCHOR_LOGP] = anchor
    result = run(values)
    change = next(c for c in result.phase_changes if c.phase == DECAY)
    assert change.evidence["reasons"][0] == "anchor_decline"
    # 0.3 nats below the peak at ~step 130, confirmed over decay_confirm steps
    assert 125 <= change.step <= 150
    signal = change.evidence["signals"]["anchor_decline"]
    assert signal["statistic"] >= CFG.anchor_drop and signal["recent"] < signal["baseline"]


def test_decay_from_frac_rising_and_negative_delta() -> None:
    values = base(160, 3, hooks=True)
    del values[M.LOGP_POS]
    t = np.arange(160, dtype=np.float64)
    values[M.FRAC_TRAJ_DECREASED_POS] += 0.004 * np.clip(t - 60, 0, None)
    values[M.DELTA_TRAJ_POS] = np.where(t < 60, 0.03, -0.02) + np.random.default_rng(4).normal(0, 0.01, 160)
    result = run(values)
    change = next(c for c in result.phase_changes if c.phase == DECAY)
    assert set(change.evidence["reasons"]) == {"frac_decreased_rising", "delta_traj_pos_negative"}
    assert 60 < change.step <= 110


def test_sharp_drop_and_grad_surge_warn_until_the_reward_follows() -> None:
    """Phase III needs outcome damage: a likelihood crash with a grad-norm surge while the reward holds
    keeps the run in phase II; when the reward follows, the run enters collapse, attributed to LLD (it
    came through phase II)."""
    values = declining(200, onset=60)
    t = np.arange(200, dtype=np.float64)
    after = np.clip(t - 130, 0, None)
    values[M.LOGP_POS] -= 0.05 * (np.exp(after / 6) - 1)
    values[M.GRAD_NORM] *= np.minimum(np.exp(after / 4), 50)
    intact = run(values)
    assert entered(intact, DECAY) is not None and COLLAPSE not in intact.phases
    assert not [f for f in intact.findings if f.severity == "critical"]
    values[M.REWARD_MEAN] = np.where(t < 145, values[M.REWARD_MEAN], 0.02)
    result = run(values)
    start = entered(result, COLLAPSE)
    assert start is not None and 145 <= start <= 150
    assert result.first(LLD_COLLAPSE) == start and TRAINING_COLLAPSE not in result.kinds()
    assert next(f for f in result.findings if f.kind == LLD_COLLAPSE).severity == "critical"


def test_degraded_collapse_on_grad_and_entropy_surge_explains_itself() -> None:
    """Grad-norm and entropy surges with the reward intact: an entropy explosion warning, no collapse;
    once the reward drops with them (a corroborated drop), a training collapse that explains itself."""
    values = base(160, 5)
    t = np.arange(160, dtype=np.float64)
    after = np.clip(t - 100, 0, None)
    values[M.GRAD_NORM] *= np.minimum(np.exp(after / 4), 100)
    values[M.ENTROPY_MEAN] *= np.minimum(np.exp(after / 8), 4)
    intact = run(values)
    assert COLLAPSE not in intact.phases and ENTROPY_EXPLOSION in intact.kinds()
    assert not [f for f in intact.findings if f.severity == "critical"]
    values[M.REWARD_MEAN] = np.where(t < 110, values[M.REWARD_MEAN], 0.25)
    result = run(values)
    change = next(c for c in result.phase_changes if c.phase == COLLAPSE)
    assert 110 <= change.step <= 115
    assert change.evidence["reasons"][0] == "reward_crash"
    assert {"grad_surge", "entropy_surge"} & set(change.evidence["reasons"])
    assert change.evidence["degraded"] is True
    assert "Phases I-II (stagnation, decay) cannot be seen" in change.evidence["explanation"]
    # no likelihood evidence: a training collapse, not an "LLD collapse"
    assert LLD_COLLAPSE not in result.kinds()
    finding = next(f for f in result.findings if f.kind == TRAINING_COLLAPSE)
    assert finding.evidence["degraded"] is True and "cannot be seen" in str(finding.evidence["explanation"])
    assert STAGNATION not in result.phases and DECAY not in result.phases


def test_degraded_reward_crash_within_five_steps() -> None:
    values = base(200, 6)
    t = np.arange(200, dtype=np.float64)
    values[M.REWARD_MEAN] *= np.exp(-((np.clip(t - 140, 0, None) / 10) ** 2))
    crash = collapse_step(np.arange(200), values[M.REWARD_MEAN])
    assert crash is not None
    start = run(values).first(TRAINING_COLLAPSE)
    # no later than 5 steps after the label, and not before the reward turns down (step 140); the label
    # (10-step mean below 20 % of its peak) lags the drop by several steps, so finding it earlier is fine
    assert start is not None and 140 < start <= crash + 5


def test_isolated_grad_spikes_are_not_a_collapse() -> None:
    values = base(250, 7, hooks=True)
    values[M.GRAD_NORM][[40, 120, 121]] *= [66.0, 30.0, 20.0]  # like verl GSM8K Qwen step 16
    values[M.ENTROPY_MEAN][121] *= 5
    result = run(values)
    assert COLLAPSE not in result.phases and DECAY not in result.phases
    assert not [f for f in result.findings if f.severity == "critical"]


def test_no_flapping_on_stationary_noise() -> None:
    rng = np.random.default_rng(8)
    n = 600
    values = base(n, 8, hooks=True)
    values[M.REWARD_MEAN] = 0.4 + rng.normal(0, 0.05, n)
    result = run(values)
    assert set(result.phases) <= {WARMUP, HEALTHY, STAGNATION}
    assert len(result.phase_changes) <= 3
    assert not result.kinds() & {LLD_DECAY, LLD_COLLAPSE, *TERMINAL_KINDS}


def test_collapse_is_sticky_until_a_clear_recovery() -> None:
    n = 260
    values = base(n, 9)
    reward = values[M.REWARD_MEAN]
    reward[100:] = 0.05
    reward[112:117] = 0.6  # a brief bounce is not a recovery
    reward[160:] = 0.6 + np.random.default_rng(9).normal(0, 0.01, n - 160)
    result = run(values)
    start = entered(result, COLLAPSE)
    assert start is not None and 100 <= start <= 105
    assert (result.phases[start:175] == COLLAPSE).all()
    back = next(c for c in result.phase_changes if c.previous_phase == COLLAPSE)
    assert (
        back.phase == HEALTHY
        and 160 + CFG.recovery_confirm - 1 <= back.step <= 160 + CFG.recovery_confirm + 5
    )
    assert back.evidence["reasons"] == ["recovered"]


# --- terminal flags and NaN handling --------------------------------------------------------------------


def test_nan_grad_norm_is_a_terminal_finding_with_a_latch() -> None:
    values = base(120, 10)
    values[M.GRAD_NORM][50] = np.nan
    present = {k: np.ones(120, dtype=bool) for k in values}
    result = run(values, present)
    assert spans(result, NONFINITE_GRAD) == [(50, 50 + CFG.nonfinite_clear - 1)]
    finding = next(f for f in result.findings if f.kind == NONFINITE_GRAD)
    assert finding.severity == "critical" and finding.evidence["value"] == "nan"
    # one batch spanning the NaN: over by its last step, but reported in `started`
    window = SeriesWindow.from_columns(np.arange(120), values, present)
    head = SeriesWindow.from_columns(
        np.arange(40), {k: v[:40] for k, v in values.items()}, {k: v[:40] for k, v in present.items()}
    )
    before = update(head, None, CFG)
    after = update(window, before.state, CFG)
    assert NONFINITE_GRAD not in {f.kind for f in after.findings}
    assert [f.step for f in after.started if f.kind == NONFINITE_GRAD] == [50]


def test_nan_not_logged_is_not_terminal_but_inf_is() -> None:
    values = base(80, 11)
    values[M.GRAD_NORM][30] = np.nan  # without `present`, NaN means "not logged"
    values[M.LOSS][40] = np.inf
    result = run(values)
    assert NONFINITE_GRAD not in result.kinds()
    assert spans(result, NONFINITE_LOSS)[0][0] == 40
    assert next(f for f in result.findings if f.kind == NONFINITE_LOSS).evidence["value"] == "inf"


def test_nan_in_unused_or_empty_metrics_does_not_crash() -> None:
    values = base(120, 12, hooks=True)
    values["timing/gen"] = np.full(120, np.nan)
    values[M.SEARCH_VALID_PER_TRAJ] = np.where(np.arange(120) % 3 == 0, np.nan, np.inf)
    values[M.ENTROPY_MEAN] = np.full(120, np.nan)
    values[M.KL_OLD] = np.full(120, -np.inf)
    values[M.KL_REF] = np.full(120, np.nan)
    values[M.FRAC_TRAJ_DECREASED_POS][::2] = np.nan
    present = {k: np.ones(120, dtype=bool) for k in values}
    result = run(values, present)  # warnings are errors in pytest: no RuntimeWarning either
    assert not [f for f in result.findings if f.severity == "critical"]


def test_all_nan_window_and_empty_window() -> None:
    empty = SeriesWindow.from_columns(np.array([], dtype=np.int64), {M.GRAD_NORM: []})
    result = update(empty, None, CFG)
    assert result.state.last_step is None and result.findings == []
    nan = {name: np.full(50, np.nan) for name in (M.REWARD_MEAN, M.GRAD_NORM, M.LOGP_POS)}
    assert set(run(nan).phases) <= {WARMUP, HEALTHY}


def step_change(metric: str, before: float, after: float, at: int = 100, n: int = 140) -> Series:
    values = base(n, 13)
    noise = 1 + np.random.default_rng(13).normal(0, 0.02, n)
    values[metric] = np.where(np.arange(n) < at, before, after) * noise
    return values


@pytest.mark.parametrize(
    ("kind", "metric", "before", "after"),
    [
        (LENGTH_COLLAPSE, M.RESPONSE_LENGTH_MEAN, 300.0, 40.0),
        (CLIP_RATIO_SATURATED, M.RESPONSE_CLIP_RATIO, 0.03, 0.97),
        (RATIO_BLOWUP, M.RATIO_POS_MEAN, 1.0, 3.0),
        (RATIO_BLOWUP, M.RATIO_POS_MEAN, 1.0, 0.3),
        (KL_BLOWUP, M.KL_OLD, 0.002, 0.5),
        (KL_BLOWUP, M.KL_REF, 0.01, 0.8),
        (GARBLED_OUTPUTS, M.GARBLED_FRAC, 0.01, 0.6),
    ],
)
def test_terminal_signatures(kind: str, metric: str, before: float, after: float) -> None:
    result = run(step_change(metric, before, after))
    ((first, last),) = spans(result, kind)
    assert 100 <= first <= 100 + CFG.terminal_window and last == 139
    finding = next(f for f in result.findings if f.kind == kind)
    assert finding.evidence["metric"] == metric
    # outcome damage and terminal signatures are critical (phase III); pathologies of the training with the
    # reward intact are warnings
    assert finding.severity == ("warning" if kind in PATHOLOGY_KINDS else "critical")
    assert (COLLAPSE in result.phases) == (kind not in PATHOLOGY_KINDS)
    # the same values without the change: nothing
    assert kind not in run(step_change(metric, before, before)).kinds()


def test_kl_blowup_judges_each_kl_against_its_own_baseline() -> None:
    values = base(140, 13)
    values[M.KL_REF] = 0.3 * (1 + np.random.default_rng(3).normal(0, 0.02, 140))  # high, but its normal
    assert KL_BLOWUP not in run(values).kinds()
    values[M.KL_OLD] = np.where(np.arange(140) < 100, 0.002, 0.5)
    result = run(values)
    ((first, last),) = spans(result, KL_BLOWUP)
    assert 100 <= first <= 100 + CFG.terminal_window and last == 139
    evidence = next(f for f in result.findings if f.kind == KL_BLOWUP).evidence
    assert evidence["metric"] == M.KL_OLD
    assert evidence["baselines"][M.KL_REF] == pytest.approx(0.3, rel=0.05)
    assert evidence["baselines"][M.KL_OLD] == pytest.approx(0.002, rel=0.05)


def test_kl_blowup_in_the_first_steps_warns_at_once_on_the_absolute_scale() -> None:
    """No baseline exists before `min_start_points` + `min_recent_points` values: a KL of several nats is
    judged against the absolute scale of a KL, and stays judged there while it lasts (a baseline taken
    from the blown-up values would absorb it)."""
    values = base(80, 21)
    values[M.KL_REF] = np.where(np.arange(80) < 2, 0.001, 3.0)
    result = run(values)
    ((first, last),) = spans(result, KL_BLOWUP)
    assert first <= 1 + CFG.min_recent_points and last == 79
    finding = next(f for f in result.findings if f.kind == KL_BLOWUP)
    assert finding.severity == "warning" and finding.evidence["baselines"][M.KL_REF] is None
    assert finding.evidence["threshold"] == CFG.kl_blowup_early_abs
    # a KL that is high from its first step, but at a scale healthy runs reach, is no blow-up
    values[M.KL_REF] = np.full(80, 0.3)
    assert KL_BLOWUP not in run(values).kinds()


def test_a_declared_reward_series_is_judged_as_the_reward() -> None:
    """A shaped reward (a format bonus holding it level) hides a collapse of the answers; with the
    task-success series declared as `reward_metric` (and its floor), that series' collapse is the reward
    collapse, and the evidence names it."""
    values = base(150, 14)
    success = "rewards/exact_match/mean"
    values[success] = values[M.REWARD_MEAN].copy()
    values[success][100:] = 0.0
    assert REWARD_ZERO not in run(values).kinds()  # reward/mean is intact
    declared = dataclasses.replace(CFG, reward_metric=success, reward_floor=0.0)
    result = detect_offline(np.arange(150), values, declared)
    ((first, _),) = spans(result, REWARD_ZERO)
    assert 100 <= first <= 100 + CFG.reward_zero_window
    evidence = next(f for f in result.findings if f.kind == REWARD_ZERO).evidence
    assert evidence["metric"] == success
    assert COLLAPSE in result.phases


@pytest.mark.parametrize("name", ["", "bad\ud800key", "a\nb", 3])
def test_a_reward_series_that_is_no_metric_name_is_refused(name: object) -> None:
    with pytest.raises(ValueError, match="reward_metric"):
        CFG.with_overrides({"reward_metric": name})


def test_reward_to_zero() -> None:
    values = base(150, 14)
    values[M.REWARD_MEAN][100:] = 0.0
    result = run(values)
    ((first, _),) = spans(result, REWARD_ZERO)
    assert 100 <= first <= 100 + CFG.reward_zero_window
    never_rose = base(150, 14)
    never_rose[M.REWARD_MEAN] = np.zeros(150)
    assert REWARD_ZERO not in run(never_rose).kinds()


def test_entropy_collapse_needs_a_slide_and_a_plateau() -> None:
    values = base(300, 15)
    t = np.arange(300, dtype=np.float64)
    values[M.REWARD_MEAN] = 0.6 + np.random.default_rng(15).normal(0, 0.01, 300)
    values[M.ENTROPY_MEAN] = 0.6 * np.exp(-t / 40) + 0.002
    result = run(values)
    finding = next(f for f in result.findings if f.kind == ENTROPY_COLLAPSE)
    assert finding.severity == "warning" and finding.first_step > 100
    healthy = base(300, 15)
    healthy[M.ENTROPY_MEAN] = 0.6 * (0.15 + 0.85 * np.exp(-t / 40))  # like the verl GSM8K logs
    assert ENTROPY_COLLAPSE not in run(healthy).kinds()


def test_advantage_collapse_with_hysteresis() -> None:
    """Most groups without reward variance while the reward is flat: a warning after `plateau_window`
    steps of it, kept inside the hysteresis band; with the reward still rising (every lab run early on,
    when most groups are all-wrong), nothing."""
    values = base(260, 16)
    values[M.REWARD_MEAN] = 0.5 + np.random.default_rng(16).normal(0, 0.01, 260)
    share = np.full(260, 0.2)
    share[60:180] = 0.7
    share[180:] = 0.45  # inside the hysteresis band: stays raised
    values[M.ADV_FRAC_ZERO_STD_GROUPS] = share
    result = run(values)
    ((first, last),) = spans(result, ADVANTAGE_COLLAPSE)
    assert 60 + CFG.plateau_window <= first <= 60 + CFG.adv_zero_std_window + CFG.plateau_window
    assert last == 259
    share[180:] = 0.1
    ((first2, last2),) = spans(run(values), ADVANTAGE_COLLAPSE)
    assert first2 == first and last2 < 259
    rising = base(260, 16)
    rising[M.REWARD_MEAN] = np.linspace(0.1, 0.7, 260) + np.random.default_rng(16).normal(0, 0.01, 260)
    rising[M.ADV_FRAC_ZERO_STD_GROUPS] = share
    assert ADVANTAGE_COLLAPSE not in run(rising).kinds()


# --- config, state, window ----------------------------------------------------------------------------


def test_overrides_are_validated() -> None:
    cfg = CFG.with_overrides({"warmup_steps": 30, "decay_z": 2, "trend_window": 50.0})
    assert cfg.warmup_steps == 30 and cfg.decay_z == 2.0 and isinstance(cfg.decay_z, float)
    assert cfg.trend_window == 50 and isinstance(cfg.trend_window, int)
    assert cfg.longest_window > CFG.longest_window
    assert cfg.required_history == CFG.history_steps  # the history covers every window
    with pytest.raises(ValueError, match="'nope'"):
        CFG.with_overrides({"nope": 1})
    for bad in (
        {"warmup_steps": "10"},
        {"warmup_steps": 2.5},
        {"decay_z": True},
        {"frac_majority": 1.5},
        {"grad_surge_ratio": 0.5},
        {"trend_window": 0},
        {"decay_z": float("nan")},
        {"reward_floor": "0"},
        {"reward_floor": float("inf")},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            CFG.with_overrides(bad)


def test_every_default_documents_its_provenance() -> None:
    tree = ast.parse(inspect.getsource(config_module))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DetectorConfig")
    body = cls.body
    fields = [n for n in body if isinstance(n, ast.AnnAssign)]
    assert len(fields) == len(CFG.to_dict())
    for node in fields:
        nxt = body[body.index(node) + 1]
        assert isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant), node.target
    assert CFG.required_history >= CFG.trend_window + CFG.reference_window


def test_state_roundtrip_is_json() -> None:
    s = collapse_scenario(3)
    state = run(s.values, s.present).state
    data = json.loads(json.dumps(state.to_dict(), allow_nan=False))
    restored = DetectorState.from_dict(data)
    assert restored.to_dict() == state.to_dict()
    with pytest.raises(ValueError, match="version"):
        DetectorState.from_dict({**data, "version": 99})
    with pytest.raises(ValueError, match="unknown"):
        DetectorState.from_dict({**data, "extra": 1})


def test_window_validation() -> None:
    with pytest.raises(ValueError, match="ascending"):
        SeriesWindow.from_columns([1, 1], {M.LOSS: [0.0, 0.0]})
    with pytest.raises(ValueError, match="points"):
        SeriesWindow.from_columns([1, 2], {M.LOSS: [0.0]})


def test_evidence_is_strict_json() -> None:
    s = collapse_scenario(4)
    result = run(s.values, s.present)
    assert {LLD_DECAY, LLD_COLLAPSE} <= result.kinds()
    for change in result.phase_changes:
        json.dumps(change.evidence, allow_nan=False)
    for f in result.findings:
        json.dumps(f.evidence, allow_nan=False)
        assert f.severity == SEVERITY[f.kind]


# --- online == offline --------------------------------------------------------------------------------


def _lab_run(pattern: str, every: int = 1) -> Scenario:
    """A committed lab fixture (a real GRPO run: reward every 4 steps, anchors every 5) as a scenario,
    optionally thinned to one log line per `every` steps."""
    fixture = read_fixture(next(LAB_FIXTURES.glob(pattern))).to_labelled_run()
    steps, values, present = thin(fixture.steps, fixture.values, fixture.present, every)
    return Scenario(fixture.name, "collapse", True, 0, steps, values, present, fixture.collapse_step)


@pytest.mark.parametrize(
    "scenario",
    [
        collapse_scenario(5),
        noisy_stagnant_scenario(6).without_hooks(),
        _lab_run("*lr0.0007*_s3.jsonl.gz"),
        _lab_run("*lr0.001_spg4_g4_len96_llds-off_n80_s0.jsonl.gz", every=10),
    ],
    ids=["collapse", "noisy-degraded", "lab-late-sparse-rewards", "lab-early-every-10-steps"],
)
def test_online_batches_equal_offline(scenario: Scenario) -> None:
    """Any batching gives what `detect_offline` gives, when each batch comes with the points of the
    `required_history` steps before it (what the service reads back: steps, not points)."""
    offline = detect_offline(scenario.steps, scenario.values, CFG, scenario.present)
    full = SeriesWindow.from_columns(scenario.steps, scenario.values, scenario.present)
    rng = np.random.default_rng(0)
    horizon = CFG.required_history
    for _ in range(2):
        state: DetectorState | None = None
        changes = []
        started = []
        end = 0
        while end < len(full):
            start, end = end, min(len(full), end + int(rng.integers(1, 60)))
            # the service's read: steps > last judged step - required_history
            lo = 0 if start == 0 else int(np.searchsorted(full.steps, full.steps[start - 1] - horizon + 1))
            window = SeriesWindow(
                full.steps[lo:end],
                {k: v[lo:end] for k, v in full.values.items()},
                {k: v[lo:end] for k, v in full.present.items()},
            )
            before = None if state is None else state.to_dict()
            result = update(window, state, CFG)
            if state is not None:
                assert state.to_dict() == before  # the input state is not modified
            state = result.state
            changes += result.phase_changes
            started += result.started
            expected_phase = str(offline.phases[end - 1])
            assert state.phase == expected_phase
            active = {(f.kind, f.step) for f in result.findings}
            offline_active = {
                (f.kind, f.first_step)
                for f in offline.findings
                if f.first_step <= full.steps[end - 1] <= f.last_step
            }
            assert active == offline_active
        assert state is not None and state.to_dict() == offline.state.to_dict()
        assert changes == offline.phase_changes
        assert sorted((f.kind, f.step) for f in started) == sorted(
            (f.kind, f.first_step) for f in offline.findings
        )


def test_update_skips_points_already_seen() -> None:
    values = base(80, 17)
    window = SeriesWindow.from_columns(np.arange(80), values)
    first = update(window, None, CFG)
    again = update(window, first.state, CFG)
    assert again.state.to_dict() == first.state.to_dict()
    assert again.phase_changes == [] and again.started == []


def test_detector_modules_are_pure() -> None:
    folder = Path(config_module.__file__).parent
    banned = {
        "logging",
        "sqlalchemy",
        "httpx",
        "requests",
        "socket",
        "torch",
        "monitor.store",
        "monitor.db",
        "open(",
    }
    for path in folder.glob("*.py"):
        text = path.read_text()
        tree = ast.parse(text)
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {b for b in banned if any(x == b or x.startswith(b + ".") for x in names)}, path
        assert "open(" not in text and "print(" not in text, path
    assert math.isfinite(CFG.required_history)


# --- single signals on small synthetic series ----------------------------------------------------------


def history(values: Series) -> History:
    n = next(iter(values.values())).size
    return History(
        steps=np.arange(n, dtype=np.float64) - (n - 1),
        values=values,
        present={k: ~np.isnan(v) for k, v in values.items()},
        step=n - 1,
    )


def test_surge_signal_needs_most_recent_points_high() -> None:
    rng = np.random.default_rng(20)
    grad = np.exp(rng.normal(0, 0.1, 70))
    grad[-5:] *= 10
    ind = signals.surge(
        history({M.GRAD_NORM: grad}),
        "grad_surge",
        M.GRAD_NORM,
        CFG,
        CFG.grad_surge_ratio,
        CFG.grad_idle_ratio,
    )
    assert ind.fired and ind.statistic == pytest.approx(10, rel=0.3) and ind.detail["robust_z"] > CFG.surge_z
    grad[-5:-2] /= 10  # only 2 of the last 5 high: a spike pair, not a surge
    assert not signals.surge(history({M.GRAD_NORM: grad}), "g", M.GRAD_NORM, CFG, 5.0, 0.05).fired


def test_surge_signal_ignores_idle_steps() -> None:
    rng = np.random.default_rng(21)
    grad = np.exp(rng.normal(0, 0.1, 70))
    grad[::2] = 0.0  # zero-advantage steps log a zero grad norm (TRL FinQA)
    ind = signals.surge(history({M.GRAD_NORM: grad}), "g", M.GRAD_NORM, CFG, 5.0, CFG.grad_idle_ratio)
    assert not ind.fired and ind.detail["baseline"] == pytest.approx(1.0, rel=0.1)


def test_reward_crash_signal_needs_a_drop_beyond_noise() -> None:
    rng = np.random.default_rng(22)
    reward = 0.6 + rng.normal(0, 0.01, 70)
    reward[-3:] = 0.1
    h = history({M.REWARD_MEAN: reward})
    span = signals.RewardRange(low=0.0, peak=0.62)
    ind = signals.reward_crash(h, CFG, 0.1, span, corroborated=False)
    assert ind.fired and ind.detail["drop_in_noise_sd"] > CFG.reward_crash_z
    noisy = np.clip(0.4 + rng.normal(0, 0.25, 70), 0, 1)  # small batches: per-step rewards all over
    noisy[-3:] = 0.0
    h2 = history({M.REWARD_MEAN: noisy})
    assert not signals.reward_crash(h2, CFG, 0.0, signals.RewardRange(low=0.0, peak=0.9), False).fired
    assert not signals.reward_crash(h, CFG, 0.5, span, corroborated=True).fired  # above half the range
    # the same in other units (3r - 1): the same decision and the same drop in noise SDs
    h3 = history({M.REWARD_MEAN: 3 * reward - 1})
    moved = signals.reward_crash(
        h3, CFG, 3 * 0.1 - 1, signals.RewardRange(low=-1.0, peak=3 * 0.62 - 1), False
    )
    assert moved.fired and moved.detail["drop_in_noise_sd"] == pytest.approx(ind.detail["drop_in_noise_sd"])


def test_likelihood_signals() -> None:
    rng = np.random.default_rng(23)
    t = np.arange(71, dtype=np.float64)
    flat = -0.3 + rng.normal(0, 0.01, 71)
    slow = flat - 0.003 * np.clip(t - 40, 0, None)
    sharp = slow - 0.03 * np.clip(t - 60, 0, None)
    d_flat, _ = signals.likelihood_decline(history({M.LOGP_POS: flat}), CFG)
    d_slow, fit = signals.likelihood_decline(history({M.LOGP_POS: slow}), CFG)
    assert not d_flat.fired and d_slow.fired and fit.slope < 0
    fit_flat, _ = signals.trend(history({M.LOGP_POS: flat}), M.LOGP_POS, 30)
    assert signals.likelihood_flat(fit_flat, CFG).fired
    assert not signals.likelihood_acceleration(history({M.LOGP_POS: slow}), CFG).fired
    assert signals.likelihood_acceleration(history({M.LOGP_POS: sharp}), CFG).fired


def test_share_and_sign_signals() -> None:
    rng = np.random.default_rng(24)
    t = np.arange(71, dtype=np.float64)
    frac = 0.3 + 0.005 * np.clip(t - 40, 0, None) + rng.normal(0, 0.02, 71)
    h = history({M.FRAC_TRAJ_DECREASED_POS: frac, M.DELTA_TRAJ_POS: -0.02 + rng.normal(0, 0.005, 71)})
    assert signals.frac_rising(h, CFG).fired
    assert not signals.frac_majority(h, CFG).fired  # 0.45 at the end
    assert signals.delta_negative(h, CFG).fired
    high = history({M.FRAC_TRAJ_DECREASED_POS: np.full(71, 0.7)})
    assert signals.frac_majority(high, CFG).fired and not signals.frac_rising(high, CFG).fired
    zero = history({M.DELTA_TRAJ_POS: np.zeros(71)})  # one mini-batch per rollout: in-loss deltas are 0
    assert not signals.delta_negative(zero, CFG).fired

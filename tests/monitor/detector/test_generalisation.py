"""The detector on runs it was not shaped on: any reward units, severity that follows the outcome, warnings
from the signals every hook version sends, runs that never learned (issue 23)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts import metrics as M
from lldmon_lab.eval_harder import affine
from lldmon_lab.evaluation import LabelledRun, found_runs, run_config
from lldmon_lab.lab.fixtures import read_fixture
from lldmon_lab.scenarios import collapse_scenario, noisy_stagnant_scenario
from monitor.detector import (
    COLLAPSE,
    ENTROPY_RISE,
    LLD_COLLAPSE,
    LLD_CRASH,
    NOT_LEARNING,
    REWARD_DECLINE,
    TRAINING_COLLAPSE,
    DetectorConfig,
    OfflineResult,
    detect_offline,
)

LAB = Path(__file__).resolve().parents[2] / "fixtures" / "lab"
CFG = DetectorConfig()
Series = dict[str, np.ndarray]


def findings(run: LabelledRun, config: DetectorConfig = CFG) -> list[tuple[str, str, int, int]]:
    result = detect_offline(run.steps, run.values, run_config(run, config), run.present)
    return sorted((f.kind, f.severity, f.first_step, f.last_step) for f in result.findings)


def phases(run: LabelledRun) -> list[str]:
    return detect_offline(run.steps, run.values, run_config(run, CFG), run.present).phases.tolist()


def _runs() -> list[LabelledRun]:
    """Runs of every kind: a generated collapse with hooks, a noisy stagnant control, a lab collapse and
    a lab control (their exact-match floor declared), a lab collapse of a composite reward (its task
    success declared as the reward series, with its floor), and a real run with a signed score
    (scale-free)."""
    signed = next(r for r in found_runs() if r.name.endswith("yeu8r64c"))
    return [
        LabelledRun.from_scenario(collapse_scenario(3)),
        LabelledRun.from_scenario(noisy_stagnant_scenario(4)),
        read_fixture(LAB / "tiny_lr0.001_spg4_g4_len96_llds-off_n80_s3.jsonl.gz").to_labelled_run(),
        read_fixture(LAB / "tiny_lr0.0003_spg4_g4_len96_llds-off_n300_s0.jsonl.gz").to_labelled_run(),
        read_fixture(
            LAB / "tiny_lr0.001_spg4_g4_len96_rw-composite_llds-off_n80_s2.jsonl.gz"
        ).to_labelled_run(),
        replace(signed, reward_floor=None),
    ]


RUNS = _runs()
BASE = [findings(r) for r in RUNS]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(0, len(RUNS) - 1),
    a=st.sampled_from([0.25, 0.5, 2.0, 3.0, 10.0]),
    b=st.sampled_from([-5.0, -1.0, 0.0, 0.5, 2.0]),
)
def test_an_affine_change_of_the_reward_changes_no_finding(which: int, a: float, b: float) -> None:
    """r -> a*r + b (a > 0) is a change of units: every finding (kind, severity, first and last step) is
    the same, with the run's declared floor moved along or with no floor at all."""
    run = RUNS[which]
    assert findings(affine(run, a, b)) == BASE[which]
    assert findings(affine(replace(run, reward_floor=None), a, b)) == findings(
        replace(run, reward_floor=None)
    )


def test_a_signed_centred_noisy_reward_is_not_a_collapse() -> None:
    """Batch-2 noise around zero (-0.9..+0.6), slowly improving over 700 steps: no critical finding (it
    used to get `reward_zero` from step 9: "20 % of the way from 0 to the peak" means nothing here)."""
    rng = np.random.default_rng(7)
    n = 700
    t = np.arange(n, dtype=np.float64)
    p = 0.35 + 0.15 * t / n
    wins = rng.binomial(2, p) / 2.0
    reward = wins - 0.45 + rng.normal(0, 0.1, n)  # centred on a running baseline
    values: Series = {
        M.REWARD_MEAN: reward,
        M.GRAD_NORM: np.exp(rng.normal(0, 0.3, n)),
        M.ENTROPY_MEAN: 0.8 * (1 + rng.normal(0, 0.05, n)),
        M.RESPONSE_LENGTH_MEAN: 400 * (1 + rng.normal(0, 0.05, n)),
    }
    result = detect_offline(np.arange(n), values, CFG)
    assert [f.kind for f in result.findings if f.severity == "critical"] == []
    assert COLLAPSE not in result.phases


def half_lost(n: int = 160, to: float = 0.15, back: int | None = None) -> Series:
    """A success rate that rose to 0.4, slid to `to` over steps 80-110 (back to 0.4 from `back`), in
    small-batch noise."""
    rng = np.random.default_rng(3)
    t = np.arange(n, dtype=np.float64)
    level = np.where(t < 40, 0.05 + 0.35 * t / 40, 0.4 - (0.4 - to) * np.clip((t - 80) / 30, 0, 1))
    if back is not None:
        level = np.where(t >= back, 0.4, level)
    return {
        M.REWARD_MEAN: np.clip(level + rng.normal(0, 0.02, n), 0, 1),
        M.GRAD_NORM: np.exp(rng.normal(0, 0.1, n)),
        M.ENTROPY_MEAN: 0.8 * (1 + rng.normal(0, 0.03, n)),
        M.RESPONSE_LENGTH_MEAN: 200 * (1 + rng.normal(0, 0.03, n)),
    }


def test_a_reward_that_lost_half_of_its_gains_warns_without_a_page() -> None:
    """0.4 -> 0.15 (below half of its range, above the floor level): a warning once the trailing mean has
    held there for `reward_decline_hold_steps`, one episode while it stays, no critical and no phase
    change; the same fall lasting less than the hold warns of nothing, and a fall to the floor is paged as
    before, with the warning open beside it."""
    cfg = replace(CFG, reward_floor=0.0)
    result = detect_offline(np.arange(160), half_lost(), cfg)
    decline = [f for f in result.findings if f.kind == REWARD_DECLINE]
    assert len(decline) == 1 and decline[0].severity == "warning"
    # below half of 0..0.41 from ~step 109; 4 noise SDs (0.063: the rise and the slide count in it) below
    # the best from ~117
    assert 112 <= decline[0].first_step <= 125 and decline[0].last_step == 159
    assert not [f for f in result.findings if f.severity == "critical"] and COLLAPSE not in result.phases
    assert "lost more than half" in decline[0].message
    assert decline[0].evidence["held_steps"] >= cfg.reward_decline_hold_steps
    dip = detect_offline(np.arange(160), half_lost(back=decline[0].first_step - 4), cfg)
    assert REWARD_DECLINE not in dip.kinds()
    floor = detect_offline(np.arange(160), half_lost(to=0.0), cfg)
    zero = floor.first("reward_zero")
    assert zero is not None and floor.first(REWARD_DECLINE) is not None
    assert floor.first(REWARD_DECLINE) <= zero and COLLAPSE in floor.phases


def test_a_collapse_that_falls_in_steps_is_warned_twenty_steps_before_its_label() -> None:
    """Lab early regime, penalty design (task success declared, floor 0, a reward every 4 steps): 0.33 at
    step 1, 0.09 at step 5, at the floor level only from step 25 and labelled at 41. The decline warning
    comes by step 21 and stays open, one episode, not one per logged reward."""
    run = read_fixture(
        LAB / "tiny_lr0.001_spg4_g4_len96_rw-penalty_llds-off_n80_s4.jsonl.gz"
    ).to_labelled_run()
    result = detect_offline(run.steps, run.values, run_config(run, CFG), run.present)
    decline = [f for f in result.findings if f.kind == REWARD_DECLINE]
    assert run.collapse_step == 41 and len(decline) == 1
    assert decline[0].first_step <= run.collapse_step - 20
    assert result.phases[list(run.steps).index(decline[0].first_step)] != COLLAPSE


def test_a_first_batch_above_the_rest_is_no_peak_to_fall_from() -> None:
    """Late-lab seed 7 (never collapsed): the success of its first batch right after the warm-up is 0.36,
    then 0.09-0.20 for 80 steps with one batch at 0.03 (a reward every 4 steps). Its one-batch first value
    set the running peak, and the dip read as "every recent value at the floor" (a `reward_zero` page and
    phase III at step 85 without a declared floor). Measured from the smoothed reward of >= 3 rewards,
    nothing is critical, with or without the floor; a real rise to 0.36 that falls to 0 is still paged
    (floor declared)."""
    steps = np.arange(1, 121)
    flat = [0.11, 0.09, 0.17, 0.09, 0.11, 0.17, 0.09, 0.11, 0.17, 0.13, 0.11, 0.17, 0.09, 0.13, 0.11, 0.09]
    rewards = [0.36, *flat, 0.17, 0.20, 0.09, 0.03, 0.14, 0.20, 0.06, 0.14, 0.22, 0.08, 0.13, 0.25, 0.19]
    reward = np.full(steps.size, np.nan)
    reward[0 : 4 * len(rewards) : 4] = rewards
    values: Series = {M.REWARD_MEAN: reward, M.GRAD_NORM: np.full(steps.size, 0.5)}
    for floor in (None, 0.0):
        result = detect_offline(steps, values, replace(CFG, reward_floor=floor))
        assert not [f.kind for f in result.findings if f.severity == "critical"], floor
        assert COLLAPSE not in result.phases
    risen = [0.05, 0.2, 0.36, 0.36, 0.35, 0.36, 0.37, 0.36, 0.35, *([0.0] * 20)]
    dead = np.full(steps.size, np.nan)
    dead[0 : 4 * len(risen) : 4] = risen
    floor = replace(CFG, reward_floor=0.0)
    result = detect_offline(steps, {M.REWARD_MEAN: dead, M.GRAD_NORM: np.full(steps.size, 0.5)}, floor)
    assert "reward_zero" in result.kinds() and COLLAPSE in result.phases


def old_hook_crash(n: int = 110, crash: int = 70) -> Series:
    """A lab run recorded before the anchor set existed: exact deltas and `lld/logp_pos` only. The A > 0
    likelihood crashes from -0.2 to -1.7 nats within ~15 steps with entropy 0.7 -> 1.9 and length x3, and
    the reward holds (for now)."""
    rng = np.random.default_rng(11)
    t = np.arange(n, dtype=np.float64)
    ramp = np.clip((t - crash) / 15, 0, 1)
    return {
        M.REWARD_MEAN: 0.4 + rng.normal(0, 0.02, n),
        M.GRAD_NORM: np.exp(rng.normal(0, 0.1, n)),
        M.LOGP_POS: -0.2 - 1.5 * ramp + rng.normal(0, 0.01, n),
        M.DELTA_TRAJ_POS: 0.01 - 0.05 * ramp + rng.normal(0, 0.005, n),
        M.FRAC_TRAJ_DECREASED_POS: 0.3 + 0.4 * ramp + rng.normal(0, 0.02, n),
        M.ENTROPY_MEAN: (0.7 + 1.2 * ramp) * (1 + rng.normal(0, 0.02, n)),
        M.RESPONSE_LENGTH_MEAN: 30 * (1 + 2 * ramp) * (1 + rng.normal(0, 0.03, n)),
    }


def test_a_likelihood_crash_with_an_entropy_surge_warns_with_its_caveat() -> None:
    result = detect_offline(np.arange(110), old_hook_crash(), CFG)
    crash = next(f for f in result.findings if f.kind == LLD_CRASH)
    assert crash.severity == "warning" and 70 < crash.first_step <= 85
    assert "not proof of phase II" in crash.message and "population" in crash.evidence["caveat"]
    assert set(crash.evidence["with"]) & {"entropy_surge", "length_surge"}
    # the outcome is intact: no page, no phase III
    assert not [f for f in result.findings if f.severity == "critical"] and COLLAPSE not in result.phases
    # without the surges the same likelihood slide is no crash warning
    calm = old_hook_crash()
    calm[M.ENTROPY_MEAN] = 0.7 * np.ones(110)
    calm[M.RESPONSE_LENGTH_MEAN] = 30 * np.ones(110)
    assert LLD_CRASH not in detect_offline(np.arange(110), calm, CFG).kinds()


def entropy_doubling(n: int, reward_sd: float) -> Series:
    """A 7B agent: entropy ~1.0 -> 2.1 over ~15 steps from step 80, invalid actions 4 % -> 15 %, clipped
    responses 2 % -> 12 %, the reward at 0.5 in noise of `reward_sd`."""
    rng = np.random.default_rng(5)
    t = np.arange(n, dtype=np.float64)
    ramp = np.clip((t - 80) / 15, 0, 1)
    return {
        M.REWARD_MEAN: 0.5 + rng.normal(0, reward_sd, n),
        M.GRAD_NORM: np.exp(rng.normal(0, 0.1, n)),
        M.ENTROPY_MEAN: (1.0 + 1.1 * ramp) * (1 + rng.normal(0, 0.1, n)),
        M.ACTION_VALID_RATIO: 0.96 - 0.11 * ramp + rng.normal(0, 0.01, n),
        M.RESPONSE_CLIP_RATIO: 0.02 + 0.10 * ramp + np.abs(rng.normal(0, 0.005, n)),
        M.RESPONSE_LENGTH_MEAN: 300 * (1 + rng.normal(0, 0.03, n)),
    }


def test_a_slow_entropy_doubling_with_degrading_validity_warns() -> None:
    """The reward not yet down (the 2x / z >= 4 explosion rule missed it)."""
    n = 120
    values = entropy_doubling(n, 0.02)
    result = detect_offline(np.arange(n), values, CFG)
    rise = next(f for f in result.findings if f.kind == ENTROPY_RISE)
    assert rise.severity == "warning" and 80 < rise.first_step <= 100
    assert not [f for f in result.findings if f.severity == "critical"]
    steady = dict(values, **{M.ACTION_VALID_RATIO: np.full(n, 0.96), M.RESPONSE_CLIP_RATIO: np.full(n, 0.02)})
    assert ENTROPY_RISE not in detect_offline(np.arange(n), steady, CFG).kinds()


def never_learned(n: int = 120) -> Series:
    """A freshly initialised model: garbled outputs from the first step, reward ~0 with a rare lucky 1."""
    rng = np.random.default_rng(9)
    reward = np.where(rng.random(n) < 0.03, 0.125, 0.0)
    return {
        M.REWARD_MEAN: reward,
        M.GRAD_NORM: np.where(reward > 0, 0.5, 0.0),
        M.GARBLED_FRAC: 0.8 + rng.normal(0, 0.02, n),
        M.RESPONSE_LENGTH_MEAN: 80 * (1 + rng.normal(0, 0.05, n)),
        M.ENTROPY_MEAN: 3.0 * (1 + rng.normal(0, 0.02, n)),
    }


def test_a_run_that_never_learned_is_not_learning_not_collapsed() -> None:
    result = detect_offline(np.arange(120), never_learned(), DetectorConfig(reward_floor=0.0))
    assert COLLAPSE not in result.phases and NOT_LEARNING in result.phases
    finding = next(f for f in result.findings if f.kind == NOT_LEARNING)
    assert finding.severity == "warning" and finding.first_step <= 10
    assert not [f for f in result.findings if f.severity == "critical"]


def test_a_run_that_learned_and_then_garbled_is_a_collapse() -> None:
    values = never_learned(200)
    t = np.arange(200)
    values[M.GARBLED_FRAC] = np.where(t < 150, 0.01, 0.8)
    values[M.REWARD_MEAN] = np.where(t < 150, 0.1 + 0.4 * np.minimum(t / 60, 1), 0.0)
    values[M.GRAD_NORM] = np.ones(200)
    result = detect_offline(t, values, DetectorConfig(reward_floor=0.0))
    assert NOT_LEARNING not in result.phases and COLLAPSE in result.phases
    assert 150 <= (result.first(TRAINING_COLLAPSE, LLD_COLLAPSE) or 0) <= 156


def test_a_training_collapse_becomes_an_lld_collapse_when_likelihood_evidence_appears() -> None:
    """The attribution follows the evidence: a collapse entered on a reward crash alone, then the correct
    responses' likelihood declines significantly: the finding is now `lld_collapse`."""
    rng = np.random.default_rng(3)
    n = 200
    t = np.arange(n, dtype=np.float64)
    values: Series = {
        M.REWARD_MEAN: np.where(t < 100, 0.6, 0.02) + rng.normal(0, 0.01, n),
        M.GRAD_NORM: np.exp(rng.normal(0, 0.1, n)),
        M.LOGP_POS: -0.3 + rng.normal(0, 0.01, n),
        M.LOGP_CORRECT: -0.3 - 0.02 * np.clip(t - 110, 0, None) + rng.normal(0, 0.01, n),
    }
    result: OfflineResult = detect_offline(t, values, DetectorConfig(reward_floor=0.0))
    training = result.first(TRAINING_COLLAPSE)
    lld = result.first(LLD_COLLAPSE)
    assert training is not None and 100 <= training <= 105
    assert lld is not None and lld > training + 5


@pytest.mark.parametrize("a", [0.5, 3.0])
def test_declared_floor_moves_with_the_units(a: float) -> None:
    run = LabelledRun.from_scenario(collapse_scenario(5))
    assert run.reward_floor == 0.0
    moved = affine(run, a, -1.0)
    assert moved.reward_floor == pytest.approx(-1.0)
    assert findings(moved) == findings(run)


def test_the_latest_trailing_mean_averages_the_whole_window() -> None:
    """The recovery and dead-run rules read the reward's latest trailing mean: the mean of every reward of
    the last `reward_zero_mean_window` steps, not the last value alone (a noisy run was held in phase III
    for 1,700 steps by its single low steps)."""
    from monitor.detector.signals import History, latest_trailing_mean

    rewards = np.array([0.0, 1.0] * 20)
    steps = np.arange(40, dtype=np.float64)
    h = History(
        steps=steps - steps[-1],
        values={M.REWARD_MEAN: rewards},
        present={M.REWARD_MEAN: np.ones(40, dtype=bool)},
        step=39,
    )
    assert latest_trailing_mean(h, CFG) == pytest.approx(0.5)


def test_a_slow_slide_with_a_pathology_escalates_to_a_collapse() -> None:
    """A real ReTool run (signed score, floor -1 declared): the score slides from -0.5 to -0.9 over 30 steps
    while entropy rises (0.24 -> 0.84) and lengths grow x4. The crash test measures from the level just
    before, which slides along; measured from the best trailing mean, the slide escalates the entropy
    warning to phase III by its label (31) + 5. Without the pathology (entropy held at its start) the
    same reward gives no critical finding: the slide alone is no page."""
    run = next(r for r in found_runs() if r.name.endswith("yeu8r64c"))
    result = detect_offline(run.steps, run.values, run_config(run, CFG), run.present)
    entered = next(c for c in result.phase_changes if c.phase == COLLAPSE)
    assert run.collapse_step == 31 and 28 <= entered.step <= 36
    assert entered.evidence["reasons"][0] == "reward_slide"
    assert (result.first(ENTROPY_RISE) or 99) < entered.step
    calm = dict(run.values)
    calm[M.ENTROPY_MEAN] = np.full(run.steps.size, np.nanmedian(run.values[M.ENTROPY_MEAN][:20]))
    quiet = detect_offline(run.steps, calm, run_config(run, CFG), run.present)
    assert not [f for f in quiet.findings if f.severity == "critical"]


def test_a_flat_noisy_reward_with_a_pathology_is_no_slide() -> None:
    """A reward that holds its level in batch noise while entropy doubles: its trailing mean is below the
    middle of its own (noise-wide) range half the time, a few SDs under its running best; a slide needs as
    many SDs as "reward to 0" does, so nothing is critical."""
    n = 140
    result = detect_offline(np.arange(n), entropy_doubling(n, 0.05), CFG)
    assert ENTROPY_RISE in result.kinds()
    assert not [f for f in result.findings if f.severity == "critical"] and COLLAPSE not in result.phases

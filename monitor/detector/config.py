"""Detector thresholds and windows, each with where its default comes from.

Windows count *steps*, not logged points: a run that logs every 10 steps is judged on the same time
scales as one that logs every step. Where a metric is logged more sparsely than a window is long, the
window reaches back to the `min_*_points` most recent values (never beyond `history_steps`). Sources:
[LLD] = docs/science.md sections 2-3 (Deng et al., arXiv 2512.04220, Fig. 2-4); "real logs" =
../shared/datasets/real_runs (healthy verl GSM8K PPO, noisy Search-R1 GRPO/GiGPO, stagnant TRL FinQA), read
with `monitor.importers`; "scenarios" = `lldmon_lab.scenarios` (calibrated to docs/science.md
section 3). The figures quoted for the real logs were measured with `benchmarks/detection.py`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contracts import metrics as M


@dataclass(frozen=True)
class DetectorConfig:
    # --- warm-up ---------------------------------------------------------------------------------------
    warmup_steps: int = 20
    """Steps after the run's first logged step before phases I-II are judged. Terminal flags, dead runs,
    reward-to-zero and blow-ups fire from the first point (against the run's own start and absolute
    levels), so a run that dies at step 5 is flagged at step 5-10, not never ([LLD] phase I lasts to ~step
    60, so nothing of phases I-II is lost)."""
    history_steps: int = 240
    """Steps of history each point is judged on (the service reads this many steps back): the longest
    window stretched to its minimum points at one log line every 10 steps. Project choice."""
    min_baseline_points: int = 15
    """Fewest finite (non-idle) reference values for a baseline median / MAD to be trusted."""
    min_start_points: int = 5
    """A young run (fewer than `min_baseline_points` values so far) is judged against its own first values
    once it has this many: a collapse inside the first 20 steps is not learnt as the normal state."""
    min_recent_points: int = 3
    """Fewest values in a "recent" window (a median of 3 values: one outlier cannot move it)."""
    min_trend_points: int = 10
    """Fewest values for a Mann-Kendall trend (n = 10: the smallest n whose |z| can pass 3 with margin)."""

    # --- likelihood trend: phases I-II (needs the lld/* hook metrics) ------------------------------------
    trend_window: int = 30
    """Theil-Sen / CUSUM window (steps) for `lld/logp_pos`, `lld/logp_correct`, the decreased shares and
    the exact deltas.
    [LLD] phase II (steady decay) lasts ~60 steps (60-120); a 30-point window confirms a decay inside its
    first half, which leaves >= 40 steps before the reward collapse."""
    reference_window: int = 40
    """Points before the trend window that give the reference level and noise scale of the CUSUM."""
    decay_z: float = 3.0
    """|Theil-Sen slope| / robust SE for a significant trend (one-sided p ~ 0.001 for normal noise)."""
    cusum_k: float = 0.5
    """CUSUM allowance in noise SDs: half of the 1-SD shift to detect (Page 1954; Montgomery's standard)."""
    cusum_h: float = 5.0
    """CUSUM decision interval in noise SDs: in-control ARL ~ 900 points for k = 0.5 (Montgomery)."""
    flat_z: float = 2.0
    """|slope z| below this counts as a flat likelihood ([LLD] phase I: flat despite rising reward)."""
    reward_rise_z: float = 3.0
    """Reward Theil-Sen slope z above this counts as rising ([LLD] phases I-II: reward still rising)."""
    delta_negative_share: float = 0.8
    """Share of the trend window with `lld/delta_traj_pos` < 0 (D_traj <= eps on correct responses is the
    LLD definition, docs/science.md section 2); 24 of 30 has p = 0.0007 under a fair coin."""
    anchor_window: int = 60
    """Steps of the anchor set's trend (`lld/anchor/logp` is scored every 5 steps: 12 values)."""
    anchor_min_points: int = 8
    """Fewest anchor values for its trend."""
    anchor_smooth_points: int = 3
    """The anchor's current level is the median of its last this-many values; the peak is the running
    maximum of that median."""
    anchor_drop: float = 0.3
    """Phase II on the anchor set: its mean per-token log-prob this many nats below its running peak (and a
    significant downward trend). Lab (tests/fixtures/lab, `python -m benchmarks.detection`): healthy lr 3e-4
    runs fall <= 0.2 in 300 steps, the late regime's runs 0.5-2.5 before their collapse. Project choice."""
    accel_window: int = 10
    """Short window for the phase-III likelihood slope ([LLD] Fig. 2: the sharp drop takes ~10-20 steps; the scenarios use an exponential with a 5-12 step time scale)."""
    accel_ratio: float = 3.0
    """Phase III: the short-window slope is this many times steeper than the preceding trend ([LLD]:
    "accelerated collapse" after a "slow, consistent decline")."""
    accel_z: float = 4.0
    """Short-window slope z (noise from the reference window) for a sharp likelihood drop."""
    frac_majority: float = 0.5
    """[LLD] (docs/science.md section 3): > 50 % of correct samples show a likelihood drop in steps
    120-140 (phase III)."""

    # --- surges vs the run's own baseline (grad norm, entropy) -------------------------------------------
    surge_recent: int = 5
    """Recent points whose median is compared with the baseline: 3 of 5 must be high, so an isolated spike
    (real logs: GSM8K Qwen grad norm 66 = 30x its median at step 16) cannot fire."""
    baseline_window: int = 60
    """Reference points before the recent ones for the baseline median / MAD (log scale)."""
    surge_z: float = 4.0
    """Robust z (log scale, MAD of the baseline) a surge must also exceed."""
    grad_surge_ratio: float = 5.0
    """Median of the recent grad norms / baseline median. Real logs: at most 2.9x (the healthy GSM8K Qwen
    run, whose spike clusters at steps 25-90 lift its 5-point median), 2.2-2.3x on Search-R1, 2.0x on TRL
    FinQA; [LLD] Fig. 3 shows an explosion of an order of magnitude or more."""
    grad_idle_ratio: float = 0.05
    """Grad norms below this share of the baseline's 75th percentile are idle steps (every group had zero
    reward variance) and are left out. Real logs: Search-R1 idle steps log 0.001-0.003 against 0.1-0.9;
    TRL FinQA logs exactly 0 on 59 % of its steps."""
    entropy_surge_ratio: float = 1.5
    """Median of the recent entropies / baseline median (docs/science.md section 3: entropy surges in
    phase III).
    Real logs: <= 1.3x, except TRL FinQA whose spiky entropy reaches 10x but with a robust z <= 2.1."""
    entropy_eps: float = 1e-3
    """Added before taking logs of the entropy (TRL FinQA logs entropies of 0.000)."""

    # --- reward crash ------------------------------------------------------------------------------------
    reward_smooth: int = 3
    """Steps of the reward's trailing median, so a single noisy step is never a crash (the labelled
    collapse step of the evaluation is another, slower rule: `lldmon_lab.labels.collapse_step`)."""
    reward_smooth_points: int = 3
    """...holding at least this many reward values (a reward logged every 4 steps: the last 3 rollouts)."""
    reward_crash_frac: float = 0.5
    """Crash: smoothed reward below low + this share of (running peak - low), where "low" is the lowest
    level the run's smoothed reward has held (its own floor: 0 for a success rate that starts at 0, the
    penalty floor of a reward with invalid-action penalties, whatever the start of a signed reward).
    Every reward level is judged against the run's own range and noise, never against a fixed value, so
    an affine change of the reward's units (a*r + b, a > 0) changes no finding."""
    reward_crash_z: float = 6.0
    """A crash on its own must also be this many reward-noise SDs (around the Theil-Sen trend of the
    baseline window) below the baseline median. Real logs: at most 1.8 (TRL FinQA; Search-R1 1.6-1.75,
    with smoothed rewards often below half their peak); scenarios: median 9, min 5.3 at the labelled
    crash (the 2 smoothing steps after it add more)."""
    reward_corroborated_z: float = 3.0
    """A half-peak drop with a grad-norm or entropy surge needs only this many noise SDs."""

    # --- hysteresis ----------------------------------------------------------------------------------------
    stagnation_confirm: int = 8
    """Steps of consecutive support to enter stagnation (phase I) (`phases.confirmed`)."""
    decay_confirm: int = 5
    """Steps of consecutive support to enter decay (phase II)."""
    collapse_confirm: int = 3
    """Consecutive confirmations to enter collapse (phase III); with the 3-point reward median this keeps
    the degraded-mode delay after a reward crash <= 5 steps (target)."""
    exit_confirm: int = 10
    """Consecutive steps without the condition to leave stagnation / decay."""
    recovery_confirm: int = 20
    """Collapse is sticky: this many consecutive recovered steps to leave it."""
    recovery_frac: float = 0.5
    """Recovered: smoothed reward >= floor + this share of (peak - floor), no surge or sharp drop and no
    critical finding. Lab late regime seed 2: the reward fell from 0.28 to ~0.03 for 50 steps, then came
    back to 0.15-0.3 and trained for 200 steps more. Project choice."""

    # --- terminal signatures (docs/science.md section 3: what users report) -------------------------------
    terminal_window: int = 5
    """Points whose median must cross a terminal threshold (sustained, not one step)."""
    nonfinite_clear: int = 5
    """A non-finite grad norm / loss finding stays active until this many finite values follow."""
    reward_zero_window: int = 10
    """Steps inspected for "reward to 0"..."""
    reward_zero_points: int = 3
    """...holding at least this many reward values."""
    reward_zero_share: float = 1.0
    """Share of those values at the floor: all of them (>= 3 values over >= 10 steps). Real logs: TRL FinQA
    (reward 0-2, 5 % of its steps at 0) has 9 of 10 steps below 20 % of its peak once in 2,400 steps and
    never 10 of 10; Search-R1 has ~15 % zero-score steps."""
    reward_zero_level: float = 0.2
    """"At the floor of its range": reward <= low + this share of (running peak - low), the fraction of
    the one collapse rule (`lldmon_lab.labels`), so the alert and the label speak of the same level.
    With `reward_zero_share` of >= 3 values. Lab early regime: 0.27 -> 0.03 within 12 steps."""
    reward_metric: str = M.REWARD_MEAN
    """The series every reward rule judges. The optimised reward by default; a run whose optimised reward
    is shaped (a format bonus, penalties, a running baseline: a collapse of the answers can leave it
    level) names its task-success series instead, as logged (TRL logs each reward function as
    `rewards/<name>/mean`), and `reward_floor` is then that series' floor."""
    reward_floor: float | None = None
    """The reward's floor, where a reward design has a known one (0 for a success rate or exact match):
    levels are then judged against it instead of the run's own low. None (default): the run's own range
    and noise, in any units."""
    reward_floor_min_rise: float = 0.05
    """With a `reward_floor`: the trailing mean must first have risen this far above it, in the reward's
    units like the floor (the collapse label's `min_peak` for a success rate); a run whose reward is in
    other units declares both in them (`lldmon_lab.eval_harder.affine` moves both)."""
    reward_floor_noise: float = 4.0
    """With a `reward_floor`, once the noise is measured: the trailing mean must also be this many noise SDs
    below its best (a weak run, best trailing mean 0.17, dips to 0.02 for a few steps in its noise; a real
    collapse from 0.3 to ~0 is 5-20 SDs). Project choice, measured with `lldmon eval --harder`."""
    reward_rise_noise: float = 4.0
    """The reward must first have risen above its low this many noise SDs of its trailing mean for "reward
    to 0", a dead run or a crash to mean anything (the noise SD: the SD of the reward's step-to-step changes
    over the history, / sqrt 2, / sqrt of the values in a trailing mean). Replaces an absolute minimum peak,
    which meant nothing for rewards in other units. A run whose reward never rose that far cannot
    collapse; with garbled or empty outputs from its start it is `not_learning`."""
    reward_zero_noise: float = 8.0
    """...and, without a `reward_floor`, the trailing mean must be this many of those noise SDs below its
    best. The running best of a wandering series drifts away from its typical level: a success rate
    wandering as an AR(1) process (phi 0.9, the generated noisy-stagnant runs) spans 6-7 SDs of its
    trailing mean within 400 steps, real small-batch runs (Search-R1, TRL FinQA) up to 6.5. Measured with
    the harness of `lldmon_lab.evaluation` (`lldmon eval --scale-free`); 8 is the smallest whole number with
    no critical finding on any control of any source. Project choice."""
    reward_zero_mean_window: int = 10
    """Second way to "reward to 0", the collapse label's own statistic (`lldmon_lab.labels`): the
    reward's trailing mean over this many steps (labels.WINDOW)..."""
    reward_zero_hold_steps: int = 4
    """...has stayed below `reward_zero_level` of the way from its lowest to its best trailing mean so far
    (the label's fraction) at every logged point over at least this many steps..."""
    reward_zero_hold_points: int = 2
    """...and at least this many logged points. Lab early regime seed 3 (reward logged every 4 steps,
    0.27 -> 0.016 at step 13, labelled 13): fires at 17. Controls (27 lab runs, 10 real logs, 40 generated;
    also thinned to every 10 steps): never. Holding 4 steps is what the sparse lab logging allows (two
    points 4 steps apart); with every-step logging that is 5 points. Project choice, measured with
    `benchmarks/detection.py`."""
    reward_decline_level: float = 0.5
    """Reward decline (a warning): the trailing mean held below this share of the way from its lowest to
    its best (over `reward_decline_hold_steps`): half of what the run had is gone. The fraction of the
    damaged-run label (`lldmon_lab.labels`: below 50 % of its running peak) and of the crash rule
    (`reward_crash_frac`). Lab early regime, shaped designs: 4 collapses whose task success fell from
    0.17-0.33 to 0.03-0.09 within 4-12 steps and reached the floor level 20-30 steps later were first
    flagged 16 steps before their labels; this warns at step 17-21, 24-32 steps before them."""
    reward_decline_hold_steps: int = 8
    """Steps the trailing mean must stay below `reward_decline_level`..."""
    reward_decline_hold_points: int = 3
    """...over at least this many logged rewards. Twice the floor rule's hold: a warning may come later
    than a page but should not come for a dip. Controls with the warning at some point (`benchmarks/
    detection.py` runs, one point per step; spans of 2-16 steps): 14 of 79 with 4 steps / 2 points, 9 with
    8 / 3, 5 with 12 / 3, which warns one lab collapse too late (label 41: first warning at step 25).
    Project choice."""
    length_collapse_ratio: float = 0.25
    """Response-length collapse: recent median < this share of the baseline median."""
    clip_ratio_saturated: float = 0.9
    """Response-length clip ratio "to 1". Real logs: at most 0.28 (Search-R1)."""
    ratio_low: float = 0.5
    """Importance ratio of A>0 tokens drifting toward 0 ([SAPO] drift signature, docs/science.md
    section 5)."""
    ratio_high: float = 2.0
    """Importance-ratio blow-up (PPO clips at 1.2; a median beyond 2 means clipping no longer holds)."""
    kl_blowup_abs: float = 0.1
    """KL blow-up: recent median above this absolute value... Real logs: |ppo_kl| <= 0.006."""
    kl_blowup_factor: float = 10.0
    """...and this many times the baseline median |KL| (slow growth of a KL-to-reference is not a blow-up)."""
    kl_blowup_early_abs: float = 1.0
    """Before a run has a KL baseline (its first `min_start_points` + `min_recent_points` values), a recent
    median |KL| above this many nats is a blow-up at once. A policy step that healthy training takes moves
    far less: real logs |ppo_kl| <= 0.006, KL to the reference in GRPO runs with beta 0.001-0.04 of the
    order of 0.001-0.1 (docs/science.md section 5), a test run starting at 0.3. Project choice: 3x above
    the highest healthy level seen."""
    dead_window: int = 6
    """Dead run: over the last this-many steps every logged grad norm is idle (no learning signal: every
    group had zero reward variance) and every logged reward is at ~0 (`reward_zero_level`). GRPO cannot
    leave that state by itself: all-zero rewards give zero advantages. Lab early regime: grad norm 0 from
    the labelled collapse on. Project choice."""
    dead_min_points: int = 3
    """Fewest grad-norm values (and 2 reward values) in the dead-run window."""
    grad_idle_abs: float = 1e-6
    """A grad norm at or below this is idle whatever the baseline (trainers log exactly 0)."""
    length_explosion_ratio: float = 3.0
    """Length explosion: recent median response length >= this times its baseline..."""
    length_explosion_clip: float = 0.5
    """...with at least this share of responses hitting the length limit (without a clip ratio logged:
    `length_explosion_ratio` + 1 times the baseline). Lab late regime seed 3: length 13 -> 61 with 58 %
    clipped at step 332, 9 steps before its labelled collapse. Real logs: clip ratio <= 0.28."""
    entropy_explosion_ratio: float = 2.0
    """Entropy explosion (warning): recent median entropy >= this times its baseline, with a robust z >=
    `surge_z`; the run enters phase III when the outcome follows (valid actions or searches fall, the
    reward drops). Real logs: <= 1.3x on healthy runs (docs/science.md section 3)."""
    entropy_explosion_validity_drop: float = 0.15
    """...phase III when, with it, valid actions / searches fall this share below their baseline (a real
    agent run: entropy 0.57 -> 3.3 with invalid actions to 28 %). Project choice."""
    entropy_explosion_window: int = 10
    """Steps of the recent entropy median for the explosion (slower than the 5-step surge)."""
    entropy_rise_ratio: float = 1.5
    """Entropy rise (warning): recent median (`surge_recent` steps) >= this times its baseline..."""
    entropy_rise_window: int = 20
    """...with a significant upward trend (Mann-Kendall z >= `decay_z`) over this many steps..."""
    entropy_rise_validity_drop: float = 0.05
    """...and valid actions / searches this share below their baseline..."""
    entropy_rise_clip_rise: float = 0.05
    """...or the share of clipped responses this much above its baseline. A slow doubling (a 7B agent:
    entropy 1.0 -> 2.1 over ~15 steps, invalid actions 4 -> 15 %, clipped 2 -> 12 %) passes all three;
    healthy real logs stay below 1.3x (docs/science.md section 3). Project choice."""
    length_surge_ratio: float = 2.0
    """Response length surge (supports the `lld_crash` warning): recent median / baseline median, with the
    robust z of `surge_z`. Old-hook lab run: length x3 within the ~15 steps of its likelihood crash."""
    empty_response_tokens: float = 2.0
    """A median response length at or below this many tokens from the run's start means empty outputs
    (with garbled outputs, what makes a run that never learned `not_learning`)."""
    validity_collapse_ratio: float = 0.5
    """Invalid-action surge / tool-use collapse: recent median of valid actions (`action/valid_ratio`) or
    valid searches per trajectory below this share of its baseline. Lab late regime seed 2: valid searches
    0.9 -> 0.08 within 30 steps, 80 steps before its labelled collapse. Project choice."""
    validity_min_baseline: float = 0.2
    """The validity baseline must be at least this for its fall to mean anything."""
    garbled_max: float = 0.3
    """Share of garbled responses ([CalibAdv]: an action with perplexity >= 50)."""

    # --- separate diagnoses (warnings) ---------------------------------------------------------------------
    entropy_collapse_ratio: float = 0.05
    """Entropy collapse: smoothed entropy below this share of its running peak (a 20x slide toward ~0).
    Real logs: the healthy GSM8K Qwen PPO run ends at 0.098 of its peak with the reward saturated and the
    TRL FinQA run dips to 0.104 (20-point medians), so 0.05 keeps a 2x margin from both."""
    entropy_collapse_window: int = 20
    """Trailing median length of the entropy for the entropy-collapse diagnosis (entropy collapse is slow;
    a 10-point median of the spiky TRL FinQA entropy dips to 0.03 of its peak for a few steps)."""
    plateau_window: int = 50
    """Reward window that must not rise significantly (z < reward_rise_z) for a plateau."""
    adv_zero_std_window: int = 20
    """Points averaged of `adv/frac_zero_std_groups`."""
    adv_zero_std_enter: float = 0.5
    """Advantage collapse: most groups (mean share > this) have zero reward variance, so no advantage."""
    adv_zero_std_exit: float = 0.4
    """Hysteresis band: the warning clears once the mean share is below this."""
    diagnosis_confirm: int = 10
    """Steps of consecutive support to raise / clear the entropy- and advantage-collapse warnings."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "reward_floor" and value is None:
                continue
            if f.name == "reward_metric":
                problem = M.metric_name_problem(value)
                if problem is not None:
                    raise ValueError(f"reward_metric: {problem}")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{f.name}: expected a number, got {type(value).__name__}")
            if f.type == "int" and not isinstance(value, int):
                raise ValueError(f"{f.name}: expected an int, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{f.name}: must be finite")
            if value < 0 and f.name != "reward_floor":
                raise ValueError(f"{f.name}: must be >= 0")
        positive_ints = [f.name for f in dataclasses.fields(self) if f.type == "int"]
        for name in positive_ints:
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1")
        for name in (
            "delta_negative_share",
            "frac_majority",
            "reward_crash_frac",
            "recovery_frac",
            "reward_zero_share",
            "reward_zero_level",
            "reward_decline_level",
            "clip_ratio_saturated",
            "entropy_collapse_ratio",
            "adv_zero_std_enter",
            "adv_zero_std_exit",
            "grad_idle_ratio",
            "length_explosion_clip",
            "validity_collapse_ratio",
            "entropy_explosion_validity_drop",
            "entropy_rise_validity_drop",
            "entropy_rise_clip_rise",
        ):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name}: must be in (0, 1]")
        if self.accel_window < 3 or self.trend_window < 5:
            raise ValueError("accel_window must be >= 3 and trend_window >= 5")
        if self.adv_zero_std_exit > self.adv_zero_std_enter:
            raise ValueError("adv_zero_std_exit must be <= adv_zero_std_enter")
        for name in (
            "grad_surge_ratio",
            "entropy_surge_ratio",
            "accel_ratio",
            "kl_blowup_factor",
            "length_explosion_ratio",
            "entropy_explosion_ratio",
            "entropy_rise_ratio",
            "length_surge_ratio",
        ):
            if getattr(self, name) <= 1:
                raise ValueError(f"{name}: must be > 1")
        if self.ratio_low >= 1 or self.ratio_high <= 1:
            raise ValueError("ratio_low must be < 1 < ratio_high")

    @property
    def required_history(self) -> int:
        """How many recent steps `update` looks at for each new point (the current one included)."""
        return max(self.history_steps, 1 + self.longest_window)

    @property
    def longest_window(self) -> int:
        """The longest span of steps one signal looks at, before any stretching to minimum points."""
        return max(
            self.reference_window + self.trend_window,
            self.trend_window + self.accel_window,
            self.anchor_window,
            self.baseline_window + self.surge_recent,
            self.baseline_window + self.reward_smooth,
            self.baseline_window + self.terminal_window,
            self.baseline_window + self.entropy_explosion_window,
            self.plateau_window,
            self.adv_zero_std_window,
            self.reward_zero_window,
            self.reward_zero_mean_window + self.reward_zero_hold_steps,
            self.reward_zero_mean_window + self.reward_decline_hold_steps,
            self.entropy_collapse_window,
            self.baseline_window + self.entropy_rise_window,
        )

    def with_overrides(self, overrides: Mapping[str, Any]) -> DetectorConfig:
        """A copy with some fields replaced. Unknown names and wrong types raise ValueError naming the key."""
        known = {f.name: f for f in dataclasses.fields(self)}
        changes: dict[str, Any] = {}
        for key, value in overrides.items():
            f = known.get(key)
            if f is None:
                raise ValueError(f"unknown detector setting {key!r}")
            if key == "reward_metric":
                changes[key] = value  # checked by __post_init__
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{key}: expected a number, got {type(value).__name__}")
            if f.type == "int":
                if isinstance(value, float) and not value.is_integer():
                    raise ValueError(f"{key}: expected an int, got {value!r}")
                value = int(value)
            else:
                value = float(value)
            changes[key] = value
        try:
            return dataclasses.replace(self, **changes)
        except ValueError as exc:
            raise ValueError(str(exc)) from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

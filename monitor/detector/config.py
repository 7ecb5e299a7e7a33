"""Detector thresholds and windows, each with where its default comes from.

Windows count *logged points* (one per training step when a trainer logs every step). Sources:
[LLD] = lld-reference.md sections 2-3 (Deng et al., arXiv 2512.04220, Fig. 2-4); "real logs" =
../shared/datasets/real_runs (healthy verl GSM8K PPO, noisy Search-R1 GRPO/GiGPO, stagnant TRL FinQA), read
with `monitor.importers`; "scenarios" = `monitor.detector.scenarios` (calibrated to [LLD] section 3). The
figures quoted for the real logs were measured with `benchmarks/detection.py`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DetectorConfig:
    # --- warm-up ---------------------------------------------------------------------------------------
    warmup_steps: int = 20
    """Points processed before any phase is judged (terminal flags fire from the first point). Gives the
    grad-norm / entropy baselines >= 15 points; [LLD] phase I lasts to ~step 60, so nothing is lost."""
    min_baseline_points: int = 15
    """Fewest finite (non-idle) reference points for a baseline median / MAD to be trusted."""

    # --- likelihood trend: phases I-II (needs the lld/* hook metrics) ------------------------------------
    trend_window: int = 30
    """Theil-Sen / CUSUM window for `lld/logp_pos`, `lld/frac_traj_decreased_pos`, `lld/delta_traj_pos`.
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
    LLD definition, lld-reference.md section 2); 24 of 30 has p = 0.0007 under a fair coin."""
    accel_window: int = 10
    """Short window for the phase-III likelihood slope ([LLD] Fig. 2: the sharp drop takes ~10-20 steps; the scenarios use an exponential with a 5-12 step time scale)."""
    accel_ratio: float = 3.0
    """Phase III: the short-window slope is this many times steeper than the preceding trend ([LLD]:
    "accelerated collapse" after a "slow, consistent decline")."""
    accel_z: float = 4.0
    """Short-window slope z (noise from the reference window) for a sharp likelihood drop."""
    frac_majority: float = 0.5
    """[LLD] section 3: > 50 % of correct samples show a likelihood drop in steps 120-140 (phase III)."""

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
    """Median of the recent entropies / baseline median ([LLD] section 3: entropy surges in phase III).
    Real logs: <= 1.3x, except TRL FinQA whose spiky entropy reaches 10x but with a robust z <= 2.1."""
    entropy_eps: float = 1e-3
    """Added before taking logs of the entropy (TRL FinQA logs entropies of 0.000)."""

    # --- reward crash ------------------------------------------------------------------------------------
    reward_smooth: int = 3
    """Trailing median length of the reward, so a single noisy step is never a crash (the labelled
    collapse step of the evaluation is another, slower rule: `monitor.detector.labels.collapse_step`)."""
    reward_crash_frac: float = 0.5
    """Crash: smoothed reward below floor + this share of (running peak - floor)."""
    reward_floor: float = 0.0
    """The reward's "zero" (0 for the 0/1 exact-match rewards of Search-R1)."""
    reward_crash_z: float = 6.0
    """A crash on its own must also be this many reward-noise SDs (around the Theil-Sen trend of the
    baseline window) below the baseline median. Real logs: at most 1.8 (TRL FinQA; Search-R1 1.6-1.75,
    with smoothed rewards often below half their peak); scenarios: median 9, min 5.3 at the labelled
    crash (the 2 smoothing steps after it add more)."""
    reward_corroborated_z: float = 3.0
    """A half-peak drop with a grad-norm or entropy surge needs only this many noise SDs."""

    # --- hysteresis ----------------------------------------------------------------------------------------
    stagnation_confirm: int = 8
    """Consecutive confirmations to enter stagnation (phase I)."""
    decay_confirm: int = 5
    """Consecutive confirmations to enter decay (phase II)."""
    collapse_confirm: int = 3
    """Consecutive confirmations to enter collapse (phase III); with the 3-point reward median this keeps
    the degraded-mode delay after a reward crash <= 5 steps (target)."""
    exit_confirm: int = 10
    """Consecutive steps without the condition to leave stagnation / decay."""
    recovery_confirm: int = 20
    """Collapse is sticky: this many consecutive recovered steps to leave it."""
    recovery_frac: float = 0.8
    """Recovered: smoothed reward >= floor + this share of (peak - floor), and no surge or sharp drop."""

    # --- terminal signatures (lld-reference.md section 3: what users report) -------------------------------
    terminal_window: int = 5
    """Points whose median must cross a terminal threshold (sustained, not one step)."""
    nonfinite_clear: int = 5
    """A non-finite grad norm / loss finding stays active until this many finite values follow."""
    reward_zero_window: int = 10
    """Points inspected for "reward to 0"."""
    reward_zero_share: float = 0.9
    """Share of those points at ~0. Real logs: Search-R1 has ~15 % zero-score steps and TRL FinQA ~20 %
    steps <= 0.1, so 9 of 10 never happens by chance there."""
    reward_zero_level: float = 0.05
    """"~0": reward <= floor + this share of (peak - floor)."""
    reward_zero_min_peak: float = 0.05
    """The run must first have reached floor + this (absolute) for "reward to 0" to mean anything."""
    length_collapse_ratio: float = 0.25
    """Response-length collapse: recent median < this share of the baseline median."""
    clip_ratio_saturated: float = 0.9
    """Response-length clip ratio "to 1". Real logs: at most 0.28 (Search-R1)."""
    ratio_low: float = 0.5
    """Importance ratio of A>0 tokens drifting toward 0 ([SAPO] drift signature, section 5)."""
    ratio_high: float = 2.0
    """Importance-ratio blow-up (PPO clips at 1.2; a median beyond 2 means clipping no longer holds)."""
    kl_blowup_abs: float = 0.1
    """KL blow-up: recent median above this absolute value... Real logs: |ppo_kl| <= 0.006."""
    kl_blowup_factor: float = 10.0
    """...and this many times the baseline median |KL| (slow growth of a KL-to-reference is not a blow-up)."""
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
    """Consecutive confirmations to raise / clear the entropy- and advantage-collapse warnings."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{f.name}: expected a number, got {type(value).__name__}")
            if f.type == "int" and not isinstance(value, int):
                raise ValueError(f"{f.name}: expected an int, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{f.name}: must be finite")
            if f.name != "reward_floor" and value < 0:
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
            "clip_ratio_saturated",
            "entropy_collapse_ratio",
            "adv_zero_std_enter",
            "adv_zero_std_exit",
            "grad_idle_ratio",
        ):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name}: must be in (0, 1]")
        if self.accel_window < 3 or self.trend_window < 5:
            raise ValueError("accel_window must be >= 3 and trend_window >= 5")
        if self.adv_zero_std_exit > self.adv_zero_std_enter:
            raise ValueError("adv_zero_std_exit must be <= adv_zero_std_enter")
        for name in ("grad_surge_ratio", "entropy_surge_ratio", "accel_ratio", "kl_blowup_factor"):
            if getattr(self, name) <= 1:
                raise ValueError(f"{name}: must be > 1")
        if self.ratio_low >= 1 or self.ratio_high <= 1:
            raise ValueError("ratio_low must be < 1 < ratio_high")

    @property
    def required_history(self) -> int:
        """How many recent points `update` looks at for each new point (the current one included)."""
        return 1 + max(
            self.reference_window + self.trend_window,
            self.trend_window + self.accel_window,
            self.baseline_window + self.surge_recent,
            self.baseline_window + self.reward_smooth,
            self.baseline_window + self.terminal_window,
            self.plateau_window,
            self.adv_zero_std_window,
            self.reward_zero_window,
            self.entropy_collapse_window,
        )

    def with_overrides(self, overrides: Mapping[str, Any]) -> DetectorConfig:
        """A copy with some fields replaced. Unknown names and wrong types raise ValueError naming the key."""
        known = {f.name: f for f in dataclasses.fields(self)}
        changes: dict[str, Any] = {}
        for key, value in overrides.items():
            f = known.get(key)
            if f is None:
                raise ValueError(f"unknown detector setting {key!r}")
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

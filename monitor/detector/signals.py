"""Per-point signals computed from the recent history of a run (pure functions of the window).

Each signal is an `Indicator`: whether it fired, its statistic and threshold, the window it looked at,
and a few numbers worth showing a user. Phases (`phases.py`) and findings (`findings.py`) combine them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from contracts import metrics as M
from monitor.detector import stats
from monitor.detector.config import DetectorConfig
from monitor.detector.stats import FloatArray, IntArray
from monitor.detector.types import BoolArray

DEGRADED_EXPLANATION: Final = (
    "this run has never sent likelihood metrics (lld/* from lldmon's trainer hooks: lld/anchor/logp, "
    "lld/logp_correct, lld/logp_pos, ...) - an imported trainer log or hooks switched off. Phases I-II "
    "(stagnation, decay) cannot be seen without them; only collapses and terminal signatures are detected, "
    "from reward, grad norm, entropy, response length, KL, validity and clip fraction."
)

HOOK_METRICS: Final = (
    M.LOGP_POS,
    M.FRAC_TRAJ_DECREASED_POS,
    M.DELTA_TRAJ_POS,
    M.LOGP_CORRECT,
    M.DELTA_TRAJ_CORRECT,
    M.ANCHOR_LOGP,
)
"""Likelihood metrics only lldmon's hooks send: a run that ever logged one is judged with phases I-II."""

USED_METRICS: Final = (
    *HOOK_METRICS,
    M.REWARD_MEAN,
    M.GRAD_NORM,
    M.ENTROPY_MEAN,
    M.LOSS,
    M.KL_REF,
    M.KL_OLD,
    M.RESPONSE_LENGTH_MEAN,
    M.RESPONSE_CLIP_RATIO,
    M.RATIO_POS_MEAN,
    M.GARBLED_FRAC,
    M.ADV_FRAC_ZERO_STD_GROUPS,
    M.SEARCH_VALID_PER_TRAJ,
    M.ACTION_VALID_RATIO,
)
"""The metrics the detector reads (the hook metrics and the trainer's own); everything else is ignored."""


def num(x: float | None, digits: int = 6) -> float | None:
    """A JSON-safe rounded float (None for missing / non-finite)."""
    if x is None or not math.isfinite(x):
        return None
    return round(float(x), digits) if x != 0 else 0.0


@dataclass(frozen=True)
class Indicator:
    name: str
    fired: bool
    metric: str | None = None
    statistic: float | None = None
    threshold: float | None = None
    window: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fired", bool(self.fired))

    def evidence(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fired": self.fired}
        if self.metric is not None:
            out["metric"] = self.metric
        out["statistic"] = num(self.statistic)
        out["threshold"] = num(self.threshold)
        if self.window is not None:
            out["window"] = self.window
        out.update(self.detail)
        return out


def off(name: str, metric: str | None = None, why: str = "not enough data") -> Indicator:
    return Indicator(name=name, fired=False, metric=metric, detail={"note": why})


@dataclass(frozen=True)
class History:
    """The points a step is judged on: the current point is the last one. Every window is counted in
    steps (not points), so a run that logs every 10 steps is judged on the same time scales as one that
    logs every step; `span` stretches a window back to a minimum number of logged points when the metric
    is logged more sparsely than the window is long."""

    steps: FloatArray
    """Step numbers relative to the current step (<= 0), as floats for the regressions."""
    values: Mapping[str, FloatArray]
    present: Mapping[str, BoolArray]
    step: int
    reward: str = M.REWARD_MEAN
    """The series judged as the run's reward (`DetectorConfig.reward_metric`): every reward rule reads it."""
    cache: dict[tuple[Any, ...], Any] = field(default_factory=dict, compare=False, repr=False)
    """Fits and index sets computed for this point (several signals share them)."""

    def get(self, name: str) -> FloatArray | None:
        return self.values.get(name)

    def logged_now(self, name: str) -> tuple[bool, float]:
        """(was a value logged at the current point, that value)."""
        pres = self.present.get(name)
        vals = self.values.get(name)
        if pres is None or vals is None or pres.size == 0 or not bool(pres[-1]):
            return False, float("nan")
        return True, float(vals[-1])

    def finite_index(self, name: str) -> IntArray:
        """Indices of the points where `name` has a finite value (memoised)."""
        key = ("finite", name)
        idx: IntArray | None = self.cache.get(key)
        if idx is None:
            v = self.values.get(name)
            idx = np.empty(0, dtype=np.int64) if v is None else np.flatnonzero(np.isfinite(v))
            self.cache[key] = idx
        return idx

    def span(self, name: str, steps: int, end: int | None = None, min_points: int = 0) -> tuple[int, int]:
        """Index range [lo, hi) of the window of `steps` steps that ends at index `end` (exclusive; default:
        after the current point), i.e. the points with step in (step[end] - steps, step[end]]; when it holds
        fewer than `min_points` finite values of `name`, it reaches back to the last `min_points` of them
        (within the history)."""
        n = self.steps.size
        hi = n if end is None else end
        if hi <= 0:
            return 0, 0
        last = self.steps[hi - 1]
        lo = int(np.searchsorted(self.steps, last - steps, side="right"))
        return self._stretch(name, lo, hi, min_points), hi

    def _stretch(self, name: str, lo: int, hi: int, min_points: int) -> int:
        """`lo`, moved back so that [lo, hi) holds at least `min_points` finite values of `name` (as many
        as the history has)."""
        if min_points <= 0:
            return lo
        fin = self.finite_index(name)
        k = int(np.searchsorted(fin, hi))
        have = k - int(np.searchsorted(fin, lo))
        if have < min_points and k > 0:
            lo = min(lo, int(fin[max(0, k - min_points)]))
        return lo

    def before(self, name: str, lo: int, steps: int, min_points: int = 0) -> tuple[int, int]:
        """The window of `steps` steps just before index `lo` (same stretching as `span`)."""
        if lo <= 0:
            return 0, 0
        start = int(np.searchsorted(self.steps, self.steps[lo] - steps, side="left"))
        return self._stretch(name, start, lo, min_points), lo

    def recent(self, name: str, steps: int, min_points: int = 0) -> FloatArray:
        """Finite values of `name` in the last `steps` steps (stretched to `min_points` values)."""
        v = self.values.get(name)
        if v is None:
            return np.empty(0)
        lo, hi = self.span(name, steps, min_points=min_points)
        return stats.finite(v[lo:hi])

    def __len__(self) -> int:
        return int(self.steps.size)


def recent_and_baseline(
    h: History, metric: str, cfg: DetectorConfig, recent_steps: int
) -> tuple[FloatArray, FloatArray]:
    """(finite values of the last `recent_steps` steps, finite values of the `baseline_window` steps before
    them), stretched to `min_recent_points` / `min_baseline_points` values; `metric` must be logged."""
    v = h.values[metric]
    lo, hi = h.span(metric, recent_steps, min_points=cfg.min_recent_points)
    b_lo, b_hi = h.before(metric, lo, cfg.baseline_window, min_points=cfg.min_baseline_points)
    return stats.finite(v[lo:hi]), stats.finite(v[b_lo:b_hi])


def recent_median(h: History, name: str, steps: int, min_points: int = 1) -> float:
    """Median of the finite values of `name` over the last `steps` steps (at least `min_points` values)."""
    return stats.median(h.recent(name, steps, min_points))


# --- surges vs the run's own baseline ---------------------------------------------------------------------


def surge(
    h: History,
    name: str,
    metric: str,
    cfg: DetectorConfig,
    ratio: float,
    idle_ratio: float | None = None,
    eps: float = 0.0,
) -> Indicator:
    """Median of the last `surge_recent` steps vs the median of the `baseline_window` steps before them,
    on a log scale, with a robust z from the baseline MAD. `idle_ratio` drops idle points (grad norm ~0)."""
    if h.get(metric) is None:
        return off(name, metric, "metric not logged")
    rec, ref = recent_and_baseline(h, metric, cfg, cfg.surge_recent)
    if eps:
        rec = np.maximum(rec, 0.0) + eps
        ref = np.maximum(ref, 0.0) + eps
    idle_below = 0.0
    if idle_ratio is not None and ref.size:
        idle_below = idle_ratio * float(np.sort(ref)[(3 * (ref.size - 1)) // 4])
        ref = ref[ref > idle_below]
        rec = rec[rec > idle_below]
    else:
        ref = ref[ref > 0]
        rec = rec[rec > 0]
    if ref.size < cfg.min_baseline_points or rec.size < cfg.min_recent_points:
        return off(name, metric)
    log_ref = np.log(ref)
    log_rec = np.log(rec)
    base = stats.fast_median(log_ref)
    now = stats.fast_median(log_rec)
    spread = stats.MAD_TO_SD * stats.fast_median(np.abs(log_ref - base))
    shift = now - base
    z = shift / spread if spread > 0 else (math.inf if shift > 0 else 0.0)
    fired = shift >= math.log(ratio) and z >= cfg.surge_z
    detail: dict[str, Any] = {
        "statistic_is": "ratio of the recent median to the baseline median",
        "recent": num(math.exp(now) - eps),
        "baseline": num(math.exp(base) - eps),
        "robust_z": num(z),
        "z_threshold": cfg.surge_z,
        "baseline_points": int(ref.size),
    }
    if idle_ratio is not None:
        detail["idle_below"] = num(idle_below)
    return Indicator(name, fired, metric, num(math.exp(shift)), ratio, cfg.surge_recent, detail)


# --- reward -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RewardRange:
    """The run's own reward scale at a point: the range its smoothed reward and its trailing mean have
    covered so far and the noise of that trailing mean. Every reward rule compares levels inside this
    range and drops in units of this noise, so an affine change of units (a*r + b, a > 0) changes nothing
    (docs/science.md section 3: a collapse is a loss of what the run had, in whatever units it scores)."""

    low: float | None = None
    """Running minimum of the smoothed reward."""
    peak: float | None = None
    """Running maximum of the smoothed reward."""
    mean_low: float | None = None
    """Running minimum of the trailing mean (the collapse label's statistic)."""
    mean_peak: float | None = None
    """Running maximum of the trailing mean."""
    noise: float = float("nan")
    """SD of the trailing mean's noise (`reward_mean_noise`), NaN while unknown."""
    fixed_floor: bool = False
    """The floor is the configured `DetectorConfig.reward_floor` (the lows are that floor): levels are
    judged against it, and the noise, once measured, only vetoes dips (`drop_threshold`)."""

    def rose(self, cfg: DetectorConfig) -> bool:
        """The trailing mean rose far enough above its low to have something to lose: `reward_rise_noise`
        noise SDs, or `reward_floor_min_rise` above a configured floor."""
        if self.mean_low is None or self.mean_peak is None:
            return False
        if self.fixed_floor:
            return self.mean_peak - self.mean_low >= cfg.reward_floor_min_rise
        if not math.isfinite(self.noise):
            return False
        return _in_noise(self.mean_peak - self.mean_low, self.noise) >= cfg.reward_rise_noise

    def drop_threshold(self, cfg: DetectorConfig) -> float:
        """Noise SDs a drop below the best trailing mean must reach: `reward_zero_noise`, or against a
        configured floor `reward_floor_noise`."""
        return cfg.reward_floor_noise if self.fixed_floor else cfg.reward_zero_noise

    def significant_drop(self, drop: float, cfg: DetectorConfig) -> bool:
        """`drop` (below the best trailing mean) reaches `drop_threshold` noise SDs; against a configured
        floor anything does while the noise is not measured yet (a collapse in the first steps)."""
        if self.fixed_floor and not math.isfinite(self.noise):  # the floor carries the scale
            return True
        return _in_noise(drop, self.noise) >= self.drop_threshold(cfg)


def _in_noise(difference: float, noise: float) -> float:
    """`difference` in units of `noise` (inf for a positive difference over zero noise)."""
    if noise > 0:
        return difference / noise
    return math.inf if difference > 0 else 0.0


def reward_mean_noise(h: History, cfg: DetectorConfig) -> float:
    """SD of the reward's `reward_zero_mean_window`-step trailing mean around its trend over the history: the
    robust (MAD) spread of the trailing means around their Theil-Sen line. It counts every time scale up to
    the history's length (small-batch noise, and the slow wander of a run whose success rate drifts), and a
    trend or one level shift affecting less than half of the points does not inflate it. NaN until the
    trailing means span `baseline_window` steps (a shorter stretch of a slowly wandering reward shows only
    part of its wander). Memoised per point."""
    key = ("reward_mean_noise",)
    cached: float | None = h.cache.get(key)
    if cached is not None:
        return cached
    out = float("nan")
    steps, means = reward_trailing_means(h, cfg, last=h.steps.size)
    if steps.size:
        full = steps - steps[0] >= cfg.reward_zero_mean_window - 1  # partial windows at the start
        steps, means = steps[full], means[full]
    if steps.size and steps[-1] - steps[0] >= cfg.baseline_window:
        out = stats.theil_sen(steps, means).resid_sd
    h.cache[key] = out
    return out


def reward_smoothed(h: History, cfg: DetectorConfig) -> float:
    """Median of the reward over the last `reward_smooth` steps, at least `reward_smooth_points` values."""
    return recent_median(h, h.reward, cfg.reward_smooth, cfg.reward_smooth_points)


def reward_reference(h: History, cfg: DetectorConfig) -> tuple[float, float]:
    """(median, noise SD around its Theil-Sen trend) of the reward over the baseline window before the
    smoothed points: the level a crash is measured from, in units of the reward's own noise."""
    v = h.get(h.reward)
    if v is None:
        return float("nan"), float("nan")
    lo, _ = h.span(h.reward, cfg.reward_smooth, min_points=cfg.reward_smooth_points)
    b_lo, b_hi = h.before(h.reward, lo, cfg.baseline_window, min_points=cfg.min_baseline_points)
    fit = _fit(h, h.reward, b_lo, b_hi)
    if fit.n < cfg.min_baseline_points:
        return float("nan"), float("nan")
    return stats.median(v[b_lo:b_hi]), fit.resid_sd


def reward_crash(
    h: History, cfg: DetectorConfig, smoothed: float, rng: RewardRange, corroborated: bool
) -> Indicator:
    """Smoothed reward below low + frac * (running peak - low) ("below half its range"), and below the
    reference level by `reward_crash_z` noise SDs (`reward_corroborated_z` with a grad / entropy surge or a
    pathology of the outputs), so the noise of small batches (Search-R1, TRL FinQA logs) is never a crash."""
    name = "reward_crash"
    peak, low = rng.peak, rng.low
    if peak is None or low is None or not math.isfinite(smoothed):
        return off(name, h.reward)
    level = low + cfg.reward_crash_frac * (peak - low)
    base_detail = {
        "statistic_is": "median reward of recent steps",
        "recent": num(smoothed),
        "running_peak": num(peak),
        "running_low": num(low),
    }
    if not (peak > low and smoothed < level):  # the costly noise estimate only when it matters
        return Indicator(name, False, h.reward, num(smoothed), num(level), cfg.reward_smooth, base_detail)
    ref, noise = reward_reference(h, cfg)
    if not (math.isfinite(noise) and math.isfinite(ref)):
        return off(name, h.reward)
    drop_z = _in_noise(ref - smoothed, noise)
    z_needed = cfg.reward_corroborated_z if corroborated else cfg.reward_crash_z
    fired = drop_z >= z_needed
    detail = {
        **base_detail,
        "baseline": num(ref),
        "drop_in_noise_sd": num(drop_z),
        "drop_z_threshold": z_needed,
        "noise_sd": num(noise),
        "corroborated": bool(corroborated),
    }
    return Indicator(name, fired, h.reward, num(smoothed), num(level), cfg.reward_smooth, detail)


def reward_slide(
    h: History, cfg: DetectorConfig, rng: RewardRange, mean: float, pathologies: bool
) -> Indicator:
    """A loss the crash test cannot see, with a pathology of the training active: the reward's trailing
    mean (the collapse label's statistic) below `reward_crash_frac` of the way from its low (or a declared
    floor) to its best trailing mean, and as many noise SDs below that best as "reward to 0" needs
    (`RewardRange.drop_threshold`: the running best of a noisy reward drifts above its level). The crash
    test measures a drop from the level just before it, which follows a reward that slides down over tens
    of steps; this one measures from the best, so a slow slide escalates its pathology once the outcome
    has followed (third-party ReTool run yeu8r64c: entropy 0.24 -> 0.84 and lengths x4 while its score
    slid from -0.5 to -0.9 over 30 steps)."""
    name = "reward_slide"
    low, peak = rng.mean_low, rng.mean_peak
    if not pathologies:
        return off(name, h.reward, "not evaluated: no pathology warning active")
    if low is None or peak is None or not math.isfinite(mean) or not rng.rose(cfg):
        return off(name, h.reward)
    level = low + cfg.reward_crash_frac * (peak - low)
    unmeasured = rng.fixed_floor and not math.isfinite(rng.noise)  # the floor carries the scale
    drop_z = math.inf if unmeasured else _in_noise(peak - mean, rng.noise)
    detail = {
        "statistic_is": "trailing mean of the reward",
        "best_trailing_mean": num(peak),
        "low": num(low),
        "drop_in_noise_sd": num(drop_z),
        "drop_z_threshold": rng.drop_threshold(cfg),
    }
    fired = mean < level and drop_z >= rng.drop_threshold(cfg)
    return Indicator(name, fired, h.reward, num(mean), num(level), cfg.reward_zero_mean_window, detail)


def _fit(h: History, metric: str, lo: int, hi: int, autocorr: bool = False) -> stats.TrendFit:
    """Theil-Sen fit of `metric` over the points [lo, hi) (memoised); `autocorr` also computes the
    Mann-Kendall z corrected for autocorrelated noise (`trend_z`)."""
    key = ("fit", metric, lo, hi, autocorr)
    fit: stats.TrendFit | None = h.cache.get(key)
    if fit is None:
        v = h.get(metric)
        enough = v is not None and hi - lo >= 5
        fit = (
            stats.theil_sen(h.steps[lo:hi], v[lo:hi], autocorr) if enough and v is not None else stats.NO_FIT
        )
        h.cache[key] = fit
    return fit


def trend(
    h: History, metric: str, window: int, min_points: int = 0, autocorr: bool = True
) -> tuple[stats.TrendFit, int]:
    """Theil-Sen fit over the last `window` steps (stretched to `min_points` values), and the index where
    that window starts (a reference window is taken before it)."""
    lo, hi = h.span(metric, window, min_points=min_points)
    return _fit(h, metric, lo, hi, autocorr), lo


def trend_z(fit: stats.TrendFit) -> float:
    """The trend's Mann-Kendall z, corrected for autocorrelated noise where it was computed (training
    metrics are autocorrelated: plain Mann-Kendall on AR(1) phi = 0.8 noise passes |z| >= 3 in ~22 % of
    trend-free windows, the corrected one in ~5 %; `benchmarks/trend_autocorr.py`)."""
    z = fit.mk_z_corrected
    return z if math.isfinite(z) else fit.mk_z


def reward_rising(h: History, cfg: DetectorConfig, window: int, name: str = "reward_rising") -> Indicator:
    """Reward Mann-Kendall trend significantly positive over `window` steps."""
    fit, _ = trend(h, h.reward, window, cfg.min_trend_points)
    if fit.n < cfg.min_trend_points:
        return off(name, h.reward)
    z = trend_z(fit)
    return Indicator(
        name,
        z >= cfg.reward_rise_z,
        h.reward,
        num(z),
        cfg.reward_rise_z,
        window,
        {
            "slope_per_step": num(fit.slope),
            "statistic_is": "Mann-Kendall z of the reward's trend (autocorrelation-corrected)",
        },
    )


def reward_trailing_means(h: History, cfg: DetectorConfig, last: int = 64) -> tuple[FloatArray, FloatArray]:
    """(relative steps, trailing means) at the last `last` logged rewards: the mean of the rewards logged
    in the `reward_zero_mean_window` steps ending at each (the collapse label's statistic, vectorised).
    Means of the earliest points may miss older values outside the slice; callers read the newest ones."""
    v = h.get(h.reward)
    if v is None:
        return np.empty(0), np.empty(0)
    idx = h.finite_index(h.reward)[-last:]
    steps, vals = h.steps[idx], v[idx]
    first = np.searchsorted(steps, steps - cfg.reward_zero_mean_window, side="right")
    csum = np.concatenate([[0.0], np.cumsum(vals)])
    ends = np.arange(1, idx.size + 1)
    return steps, (csum[ends] - csum[first]) / (ends - first)


def latest_trailing_mean(h: History, cfg: DetectorConfig) -> float:
    """The reward's trailing mean at its last logged point (NaN before any reward). Memoised per point
    (the recovery test and the dead-run rule both read it)."""
    key = ("latest_trailing_mean",)
    cached: float | None = h.cache.get(key)
    if cached is None:
        _, means = reward_trailing_means(h, cfg, last=cfg.reward_zero_mean_window + 1)
        cached = float(means[-1]) if means.size else float("nan")
        h.cache[key] = cached
    return cached


def reward_zero(h: History, cfg: DetectorConfig, rng: RewardRange) -> Indicator:
    """The reward at the floor of its range after having risen (`RewardRange.rose`), two ways: every recent
    value at the floor, or (the collapse label's own criterion) its trailing mean held below the floor
    level of its range; either way the trailing mean is `reward_zero_noise` noise SDs below its best."""
    name = "reward_zero"
    v = h.get(h.reward)
    if v is None or rng.mean_peak is None or rng.mean_low is None:
        return off(name, h.reward)
    if not rng.rose(cfg):
        return off(name, h.reward, "the reward never rose significantly above its low")
    steps, means = reward_trailing_means(h, cfg)
    if steps.size == 0:
        return off(name, h.reward)
    lost = rng.mean_peak - float(means[-1])
    drop = _in_noise(lost, rng.noise)
    if not rng.significant_drop(lost, cfg):
        return Indicator(
            name,
            False,
            h.reward,
            num(float(means[-1])),
            None,
            cfg.reward_zero_mean_window,
            {"drop_in_noise_sd": num(drop), "drop_threshold": rng.drop_threshold(cfg)},
        )
    held = _trailing_mean_held(
        h,
        cfg,
        rng,
        steps,
        means,
        drop,
        name,
        cfg.reward_zero_level,
        "zero_level",
        (cfg.reward_zero_hold_steps, cfg.reward_zero_hold_points),
    )
    if held is not None:
        return held
    recent = h.recent(h.reward, cfg.reward_zero_window, cfg.reward_zero_points)
    if recent.size < cfg.reward_zero_points or rng.peak is None or rng.low is None:
        return off(name, h.reward)
    level = rng.low + cfg.reward_zero_level * (rng.peak - rng.low)
    share = float(np.count_nonzero(recent <= level)) / recent.size
    return Indicator(
        name,
        share >= cfg.reward_zero_share,
        h.reward,
        num(share),
        cfg.reward_zero_share,
        cfg.reward_zero_window,
        {
            "zero_level": num(level),
            "running_peak": num(rng.peak),
            "running_low": num(rng.low),
            "recent": num(stats.fast_median(recent)),
            "drop_in_noise_sd": num(drop),
            "statistic_is": "share of recent reward values at the floor of the run's range",
        },
    )


def reward_decline(h: History, cfg: DetectorConfig, rng: RewardRange, active: bool = False) -> Indicator:
    """The reward's trailing mean held below `reward_decline_level` of the way from its low (or declared
    floor) to its best trailing mean, after having risen, and as far below that best as "reward to 0"
    needs (`RewardRange.significant_drop`): half of what the run had is gone. A warning: the outcome is
    damaged but not lost. It comes before "reward to 0" on a reward that falls in steps (lab early regime,
    shaped designs: the task success 0.17-0.33 -> 0.03-0.09 within 4-12 steps, at the floor level only
    20-30 steps later). Once `active`, it holds while the trailing mean stays below the level: the noise
    estimate grows with the fall it measures, and a drop hovering at its threshold would flap."""
    name = "reward_decline"
    if h.get(h.reward) is None or rng.mean_peak is None or rng.mean_low is None or not rng.rose(cfg):
        return off(name, h.reward)
    steps, means = reward_trailing_means(h, cfg)
    if steps.size == 0:
        return off(name, h.reward)
    lost = rng.mean_peak - float(means[-1])
    if not (active or rng.significant_drop(lost, cfg)):
        return off(name, h.reward)
    held = _trailing_mean_held(
        h,
        cfg,
        rng,
        steps,
        means,
        _in_noise(lost, rng.noise),
        name,
        cfg.reward_decline_level,
        "decline_level",
        (cfg.reward_decline_hold_steps, cfg.reward_decline_hold_points),
        at_reward_points=False,
    )
    return off(name, h.reward) if held is None else held


def _trailing_mean_held(
    h: History,
    cfg: DetectorConfig,
    rng: RewardRange,
    steps: FloatArray,
    means: FloatArray,
    drop: float,
    name: str,
    fraction: float,
    level_key: str,
    hold: tuple[int, int],
    at_reward_points: bool = True,
) -> Indicator | None:
    """The fired indicator `name` when the reward's trailing mean has stayed below `fraction` of the way
    from its lowest to its best trailing mean over the last `hold` = (steps, points) (at least that many
    steps and logged points), else None. Once below, the peak cannot move, so the run of points
    below it is exact. `at_reward_points`: judged only where a reward is logged (else held between them,
    on the last logged reward's trailing mean)."""
    assert rng.mean_low is not None and rng.mean_peak is not None
    if at_reward_points and steps[-1] != h.steps[-1]:
        return None
    level = rng.mean_low + fraction * (rng.mean_peak - rng.mean_low)
    above = np.flatnonzero(~(means < level))
    start = int(above[-1]) + 1 if above.size else 0
    points = steps.size - start
    hold_steps, hold_points = hold
    if points < max(1, hold_points):
        return None
    held = float(steps[-1] - steps[start])
    if held < hold_steps:
        return None
    return Indicator(
        name,
        True,
        h.reward,
        num(float(means[-1])),
        num(level),
        cfg.reward_zero_mean_window,
        {
            level_key: num(level),
            "running_peak": num(rng.mean_peak),
            "running_low": num(rng.mean_low),
            "recent": num(float(means[-1])),
            "held_steps": int(held),
            "drop_in_noise_sd": num(drop),
            "statistic_is": f"the reward's {cfg.reward_zero_mean_window}-step trailing mean, held below "
            f"{fraction:.0%} of the way from its lowest to its best for {int(held)} steps",
        },
    )


# --- likelihood (hook metrics) ----------------------------------------------------------------------------


def _reference(h: History, metric: str, lo: int, cfg: DetectorConfig) -> tuple[float, float, int]:
    """(median, noise SD around its trend, points) of the reference window before index `lo`."""
    v = h.get(metric)
    if v is None:
        return float("nan"), float("nan"), 0
    r_lo, r_hi = h.before(metric, lo, cfg.reference_window, min_points=cfg.min_trend_points)
    fit = _fit(h, metric, r_lo, r_hi)
    return stats.median(v[r_lo:r_hi]), fit.resid_sd, fit.n


def _decline(
    h: History, cfg: DetectorConfig, name: str, metric: str, direction: int, meaning: str
) -> tuple[Indicator, stats.TrendFit]:
    """A significant Mann-Kendall trend in `direction` over the trend window AND a one-sided CUSUM (vs the
    reference window's level and noise) past its decision interval."""
    fit, lo = trend(h, metric, cfg.trend_window, cfg.min_trend_points)
    v = h.get(metric)
    if v is None or fit.n < cfg.min_trend_points:
        return off(name, metric), fit
    z = trend_z(fit)
    detail: dict[str, Any] = {
        "statistic_is": "Mann-Kendall z of the trend (autocorrelation-corrected)",
        "meaning": meaning,
        "slope_per_step": num(fit.slope),
        "recent": num(stats.median(v[-cfg.min_recent_points :])),
    }
    fired = False
    if direction * z >= cfg.decay_z:  # the CUSUM (and its reference fit) only when the trend is there
        target, scale, n_ref = _reference(h, metric, lo, cfg)
        if n_ref < cfg.min_trend_points or not math.isfinite(scale):
            return off(name, metric, "reference window too short"), fit
        scale = max(scale, fit.resid_sd if math.isfinite(fit.resid_sd) else 0.0, 1e-9)
        s = stats.cusum_last(v[lo:], target, scale, cfg.cusum_k, direction=direction)
        fired = s >= cfg.cusum_h
        detail.update(cusum=num(s), cusum_h=cfg.cusum_h, baseline=num(target), noise_sd=num(scale))
    threshold = direction * cfg.decay_z
    return Indicator(name, fired, metric, num(z), threshold, cfg.trend_window, detail), fit


def likelihood_decline(h: History, cfg: DetectorConfig) -> tuple[Indicator, stats.TrendFit]:
    """`lld/logp_pos` declining. Supporting evidence only: the A > 0 population changes from batch to batch
    (easy groups leave it), so this alone can be population shift, not LLD."""
    return _decline(h, cfg, "logp_pos_decline", M.LOGP_POS, -1, "log-likelihood of A>0 responses declining")


def correct_decline(h: History, cfg: DetectorConfig) -> Indicator:
    """`lld/logp_correct` (responses with reward >= the success threshold) declining: likelihood evidence
    that is not an artefact of the advantage sign."""
    ind, _ = _decline(
        h, cfg, "logp_correct_decline", M.LOGP_CORRECT, -1, "log-likelihood of correct responses declining"
    )
    return ind


def anchor_decline(h: History, cfg: DetectorConfig, peak: float | None) -> Indicator:
    """The fixed anchor set's mean per-token log-prob (`lld/anchor/logp`, the same correct responses
    re-scored every few steps, so no population can shift) fell `anchor_drop` nats below its running
    peak, with a significant Mann-Kendall trend over `anchor_window` steps: lazy likelihood displacement
    measured as the paper measures it (docs/science.md section 2, Fig. 2)."""
    name = "anchor_decline"
    metric = M.ANCHOR_LOGP
    v = h.get(metric)
    if v is None or peak is None:
        return off(name, metric, "metric not logged")
    # plain Mann-Kendall: 8-12 anchor values are too few to estimate autocorrelations; the drop of
    # `anchor_drop` nats is the guard
    fit, _ = trend(h, metric, cfg.anchor_window, cfg.anchor_min_points, autocorr=False)
    if fit.n < cfg.anchor_min_points:
        return off(name, metric)
    now = recent_median(h, metric, 1, cfg.anchor_smooth_points)
    drop = peak - now
    fired = fit.mk_z <= -cfg.decay_z and drop >= cfg.anchor_drop
    detail = {
        "statistic_is": "drop of the anchor set's log-prob below its peak (nats per token)",
        "meaning": "likelihood of known-correct anchor responses falling",
        "recent": num(now),
        "baseline": num(peak),
        "trend_z": num(fit.mk_z),
        "trend_z_threshold": -cfg.decay_z,
        "slope_per_step": num(fit.slope),
    }
    return Indicator(name, fired, metric, num(drop), cfg.anchor_drop, cfg.anchor_window, detail)


def likelihood_flat(fit: stats.TrendFit, cfg: DetectorConfig) -> Indicator:
    if fit.n < cfg.min_trend_points:
        return off("logp_pos_flat", M.LOGP_POS)
    z = abs(trend_z(fit))
    return Indicator(
        "logp_pos_flat",
        z < cfg.flat_z,
        M.LOGP_POS,
        num(z),
        cfg.flat_z,
        cfg.trend_window,
        {"slope_per_step": num(fit.slope), "statistic_is": "|Mann-Kendall z| of the trend"},
    )


def likelihood_acceleration(h: History, cfg: DetectorConfig, metric: str = M.LOGP_POS) -> Indicator:
    """Phase III on a likelihood series: the slope over the last `accel_window` steps is significantly
    negative (noise SD from the reference window) and `accel_ratio` times steeper than the trend before."""
    name = "logp_pos_sharp_drop" if metric == M.LOGP_POS else "anchor_sharp_drop"
    lo, hi = h.span(metric, cfg.accel_window, min_points=cfg.min_recent_points + 1)
    short = _fit(h, metric, lo, hi)
    p_lo, p_hi = h.before(metric, lo, cfg.trend_window, min_points=cfg.min_trend_points)
    prev = _fit(h, metric, p_lo, p_hi)
    if short.n < cfg.min_recent_points + 1 or prev.n < cfg.min_trend_points:
        return off(name, metric)
    _, ref_noise, n_ref = _reference(h, metric, p_lo, cfg)
    noise = ref_noise if n_ref >= cfg.min_trend_points and math.isfinite(ref_noise) else prev.resid_sd
    noise = max(noise, 1e-9) if math.isfinite(noise) else 1e-9
    v = h.get(metric)
    assert v is not None
    x_short = h.steps[lo:hi][np.isfinite(v[lo:hi])]
    se = stats.slope_se(x_short, noise)
    z = short.slope / se if se > 0 else 0.0
    limit = cfg.accel_ratio * min(prev.slope, 0.0)
    fired = z <= -cfg.accel_z and short.slope <= limit
    detail = {
        "statistic_is": "z of the recent slope",
        "meaning": "likelihood dropping sharply",
        "slope_per_step": num(short.slope),
        "previous_slope_per_step": num(prev.slope),
        "slope_limit": num(limit),
        "noise_sd": num(noise),
    }
    return Indicator(name, fired, metric, num(z), -cfg.accel_z, cfg.accel_window, detail)


def frac_rising(h: History, cfg: DetectorConfig, metric: str = M.FRAC_TRAJ_DECREASED_POS) -> Indicator:
    """The share of responses whose likelihood fell over the update is rising (Mann-Kendall + upper CUSUM)."""
    name = "frac_decreased_rising" if metric == M.FRAC_TRAJ_DECREASED_POS else "frac_correct_decreased_rising"
    ind, _ = _decline(h, cfg, name, metric, 1, "share of responses losing likelihood rising")
    return ind


def frac_majority(h: History, cfg: DetectorConfig) -> Indicator:
    name = "frac_decreased_majority"
    metric = M.FRAC_TRAJ_DECREASED_POS
    v = h.get(metric)
    if v is None:
        return off(name, metric, "metric not logged")
    recent = h.recent(metric, cfg.surge_recent, cfg.min_recent_points)
    if recent.size < cfg.min_recent_points:
        return off(name, metric)
    med = stats.fast_median(recent)
    return Indicator(
        name,
        med > cfg.frac_majority,
        metric,
        num(med),
        cfg.frac_majority,
        cfg.surge_recent,
        {"statistic_is": "median share of A>0 responses whose likelihood fell"},
    )


def delta_negative(h: History, cfg: DetectorConfig, metric: str = M.DELTA_TRAJ_POS) -> Indicator:
    """The exact per-update delta D_traj (Def. 4.1) < 0 on most of the trend window (a sign test: the
    likelihood of the responses falls over the update)."""
    name = "delta_traj_pos_negative" if metric == M.DELTA_TRAJ_POS else "delta_traj_correct_negative"
    v = h.get(metric)
    if v is None:
        return off(name, metric, "metric not logged")
    recent = h.recent(metric, cfg.trend_window, cfg.min_trend_points)
    if recent.size < cfg.min_trend_points:
        return off(name, metric)
    share = float(np.count_nonzero(recent < 0)) / recent.size
    med = stats.fast_median(recent)
    fired = share >= cfg.delta_negative_share and med < 0
    return Indicator(
        name,
        fired,
        metric,
        num(share),
        cfg.delta_negative_share,
        cfg.trend_window,
        {"recent": num(med), "statistic_is": "share of updates with D_traj < 0"},
    )


# --- all signals of one point ---------------------------------------------------------------------------

LIKELIHOOD_EVIDENCE: Final = ("anchor_decline", "logp_correct_decline", "delta_traj_correct_negative")
"""Signals that show LLD and cannot be population shift (phase II needs one of them)."""


@dataclass(frozen=True)
class Signals:
    hooks: bool
    indicators: dict[str, Indicator]
    reward_smooth: float
    entropy_smooth: float
    reward_mean: float = float("nan")
    """The reward's latest trailing mean (`reward_zero_mean_window` steps; NaN before any reward)."""

    def fired(self, name: str) -> bool:
        ind = self.indicators.get(name)
        return ind is not None and ind.fired

    def evidence(self, names: list[str] | tuple[str, ...]) -> dict[str, Any]:
        return {n: self.indicators[n].evidence() for n in names if n in self.indicators}


def compute(
    h: History,
    cfg: DetectorConfig,
    rng: RewardRange,
    hooks: bool,
    anchor_peak: float | None = None,
    pathologies: tuple[str, ...] = (),
) -> Signals:
    """Every phase signal at the current (last) point of `h`. `rng` already includes this point; `hooks`:
    the run's source has sent likelihood metrics at some point of its life; `pathologies`: the pathology
    warnings active now (a reward drop with one of them needs fewer noise SDs)."""
    ind: dict[str, Indicator] = {}
    ind["grad_surge"] = surge(
        h, "grad_surge", M.GRAD_NORM, cfg, cfg.grad_surge_ratio, idle_ratio=cfg.grad_idle_ratio
    )
    ind["entropy_surge"] = surge(
        h, "entropy_surge", M.ENTROPY_MEAN, cfg, cfg.entropy_surge_ratio, eps=cfg.entropy_eps
    )
    corroborated = ind["grad_surge"].fired or ind["entropy_surge"].fired
    r_smooth = reward_smoothed(h, cfg)
    ind["reward_crash"] = reward_crash(h, cfg, r_smooth, rng, corroborated or bool(pathologies))
    r_mean = latest_trailing_mean(h, cfg)
    ind["reward_slide"] = reward_slide(h, cfg, rng, r_mean, bool(pathologies))
    ind["reward_rising"] = reward_rising(h, cfg, cfg.trend_window)
    if hooks:
        _likelihood_signals(h, cfg, anchor_peak, ind)
    e_smooth = recent_median(h, M.ENTROPY_MEAN, cfg.entropy_collapse_window, cfg.min_recent_points)
    return Signals(
        hooks=hooks, indicators=ind, reward_smooth=r_smooth, entropy_smooth=e_smooth, reward_mean=r_mean
    )


LLD_CRASH_CAVEAT: Final = (
    "lld/logp_pos is measured on the A > 0 responses of each batch, a population that changes every batch, "
    "so a crash of it is not proof of phase II on its own; an 8x drop within ~15 steps together with an "
    "entropy or length surge is, however, not what population shift looks like. The anchor set "
    "(lld/anchor/logp) or the correct-response log-prob (lld/logp_correct) would confirm it."
)


def _likelihood_signals(
    h: History, cfg: DetectorConfig, anchor_peak: float | None, ind: dict[str, Indicator]
) -> None:
    """The hook likelihood signals (phases I-II and the `lld_crash` warning), added to `ind`."""
    decline, fit = likelihood_decline(h, cfg)
    ind["logp_pos_decline"] = decline
    ind["logp_pos_flat"] = likelihood_flat(fit, cfg)
    ind["frac_decreased_majority"] = frac_majority(h, cfg)
    ind["delta_traj_pos_negative"] = delta_negative(h, cfg)
    ind["anchor_decline"] = anchor_decline(h, cfg, anchor_peak)
    ind["logp_correct_decline"] = correct_decline(h, cfg)
    ind["delta_traj_correct_negative"] = delta_negative(h, cfg, M.DELTA_TRAJ_CORRECT)
    declining = ind["anchor_decline"].fired or ind["logp_correct_decline"].fired
    # the sharp-drop fits only where they can matter (the detector's budget is < 5 ms per point): with a
    # decline of the anchor / correct responses, or with an entropy or length surge (the `lld_crash`
    # warning, from the signals every hook version sends)
    ind["length_surge"] = surge(h, "length_surge", M.RESPONSE_LENGTH_MEAN, cfg, cfg.length_surge_ratio)
    surging = [n for n in ("entropy_surge", "length_surge") if ind[n].fired]
    lazy = "not evaluated: needs a likelihood decline or an entropy / length surge first"
    ind["logp_pos_sharp_drop"] = (
        likelihood_acceleration(h, cfg, M.LOGP_POS)
        if declining or surging
        else off("logp_pos_sharp_drop", M.LOGP_POS, lazy)
    )
    ind["anchor_sharp_drop"] = (
        likelihood_acceleration(h, cfg, M.ANCHOR_LOGP)
        if declining
        else off("anchor_sharp_drop", M.ANCHOR_LOGP, lazy)
    )
    drop = ind["logp_pos_sharp_drop"]
    ind["lld_crash"] = Indicator(
        "lld_crash",
        drop.fired and bool(surging),
        M.LOGP_POS,
        drop.statistic,
        drop.threshold,
        drop.window,
        {**drop.detail, "with": surging, "caveat": LLD_CRASH_CAVEAT},
    )
    support = declining or ind["delta_traj_pos_negative"].fired or ind["delta_traj_correct_negative"].fired
    ind["frac_decreased_rising"] = (
        frac_rising(h, cfg)
        if support
        else off("frac_decreased_rising", M.FRAC_TRAJ_DECREASED_POS, "not evaluated: no likelihood evidence")
    )

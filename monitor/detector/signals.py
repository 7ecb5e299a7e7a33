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
    v = h.get(metric)
    if v is None:
        return off(name, metric, "metric not logged")
    lo, hi = h.span(metric, cfg.surge_recent, min_points=cfg.min_recent_points)
    b_lo, b_hi = h.before(metric, lo, cfg.baseline_window, min_points=cfg.min_baseline_points)
    rec = stats.finite(v[lo:hi])
    ref = stats.finite(v[b_lo:b_hi])
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


def reward_smoothed(h: History, cfg: DetectorConfig) -> float:
    """Median of the reward over the last `reward_smooth` steps, at least `reward_smooth_points` values."""
    return recent_median(h, M.REWARD_MEAN, cfg.reward_smooth, cfg.reward_smooth_points)


def reward_reference(h: History, cfg: DetectorConfig) -> tuple[float, float]:
    """(median, noise SD around its Theil-Sen trend) of the reward over the baseline window before the
    smoothed points: the level a crash is measured from, in units of the reward's own noise."""
    v = h.get(M.REWARD_MEAN)
    if v is None:
        return float("nan"), float("nan")
    lo, _ = h.span(M.REWARD_MEAN, cfg.reward_smooth, min_points=cfg.reward_smooth_points)
    b_lo, b_hi = h.before(M.REWARD_MEAN, lo, cfg.baseline_window, min_points=cfg.min_baseline_points)
    fit = _fit(h, M.REWARD_MEAN, b_lo, b_hi)
    if fit.n < cfg.min_baseline_points:
        return float("nan"), float("nan")
    return stats.median(v[b_lo:b_hi]), fit.resid_sd


def reward_crash(
    h: History, cfg: DetectorConfig, smoothed: float, peak: float | None, corroborated: bool
) -> Indicator:
    """Smoothed reward below floor + frac * (running peak - floor) ("below half its peak"), and below the
    reference level by `reward_crash_z` noise SDs (`reward_corroborated_z` with a grad / entropy surge),
    so the noise of small batches (Search-R1, TRL FinQA logs) is never a crash."""
    name = "reward_crash"
    if peak is None or not math.isfinite(smoothed):
        return off(name, M.REWARD_MEAN)
    floor = cfg.reward_floor
    level = floor + cfg.reward_crash_frac * (peak - floor)
    base_detail = {
        "statistic_is": "median reward of recent steps",
        "recent": num(smoothed),
        "running_peak": num(peak),
    }
    if not (peak - floor > 0 and smoothed < level):  # the costly noise estimate only when it matters
        return Indicator(
            name, False, M.REWARD_MEAN, num(smoothed), num(level), cfg.reward_smooth, base_detail
        )
    ref, noise = reward_reference(h, cfg)
    if not (math.isfinite(noise) and math.isfinite(ref)):
        return off(name, M.REWARD_MEAN)
    drop = ref - smoothed
    drop_z = drop / noise if noise > 0 else (math.inf if drop > 0 else 0.0)
    z_needed = cfg.reward_corroborated_z if corroborated else cfg.reward_crash_z
    fired = peak - floor > 0 and smoothed < level and drop_z >= z_needed
    detail = {
        **base_detail,
        "baseline": num(ref),
        "drop_in_noise_sd": num(drop_z),
        "drop_z_threshold": z_needed,
        "noise_sd": num(noise),
        "corroborated_by_surge": bool(corroborated),
    }
    return Indicator(name, fired, M.REWARD_MEAN, num(smoothed), num(level), cfg.reward_smooth, detail)


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
    fit, _ = trend(h, M.REWARD_MEAN, window, cfg.min_trend_points)
    if fit.n < cfg.min_trend_points:
        return off(name, M.REWARD_MEAN)
    z = trend_z(fit)
    return Indicator(
        name,
        z >= cfg.reward_rise_z,
        M.REWARD_MEAN,
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
    v = h.get(M.REWARD_MEAN)
    if v is None:
        return np.empty(0), np.empty(0)
    idx = h.finite_index(M.REWARD_MEAN)[-last:]
    steps, vals = h.steps[idx], v[idx]
    first = np.searchsorted(steps, steps - cfg.reward_zero_mean_window, side="right")
    csum = np.concatenate([[0.0], np.cumsum(vals)])
    ends = np.arange(1, idx.size + 1)
    return steps, (csum[ends] - csum[first]) / (ends - first)


def reward_zero(
    h: History, cfg: DetectorConfig, peak: float | None, mean_peak: float | None = None
) -> Indicator:
    """The reward at the floor of its range, two ways: every recent value at the floor, or (the collapse
    label's own criterion) its trailing mean held below the floor level of its best trailing mean."""
    name = "reward_zero"
    v = h.get(M.REWARD_MEAN)
    if v is None:
        return off(name, M.REWARD_MEAN)
    held = _trailing_mean_held(h, cfg, mean_peak)
    if held is not None:
        return held
    if peak is None:
        return off(name, M.REWARD_MEAN)
    floor = cfg.reward_floor
    if peak - floor < cfg.reward_zero_min_peak:
        return off(name, M.REWARD_MEAN, "the reward never rose above its floor")
    recent = h.recent(M.REWARD_MEAN, cfg.reward_zero_window, cfg.reward_zero_points)
    if recent.size < cfg.reward_zero_points:
        return off(name, M.REWARD_MEAN)
    level = floor + cfg.reward_zero_level * (peak - floor)
    share = float(np.count_nonzero(recent <= level)) / recent.size
    return Indicator(
        name,
        share >= cfg.reward_zero_share,
        M.REWARD_MEAN,
        num(share),
        cfg.reward_zero_share,
        cfg.reward_zero_window,
        {
            "zero_level": num(level),
            "running_peak": num(peak),
            "recent": num(stats.fast_median(recent)),
            "statistic_is": "share of recent reward values at ~0",
        },
    )


def _trailing_mean_held(h: History, cfg: DetectorConfig, mean_peak: float | None) -> Indicator | None:
    """The fired `reward_zero` indicator when the reward's trailing mean has stayed below the floor level
    of its running peak over the last `reward_zero_hold_steps` steps (>= `reward_zero_hold_points`
    points), else None. Once below, the peak cannot move, so the run of points below it is exact."""
    floor = cfg.reward_floor
    if mean_peak is None or mean_peak - floor < cfg.reward_zero_min_peak:
        return None
    steps, means = reward_trailing_means(h, cfg)
    if steps.size == 0 or steps[-1] != h.steps[-1]:
        return None  # judged where a reward is logged
    level = floor + cfg.reward_zero_level * (mean_peak - floor)
    above = np.flatnonzero(~(means < level))
    start = int(above[-1]) + 1 if above.size else 0
    points = steps.size - start
    if points < max(1, cfg.reward_zero_hold_points):
        return None
    held = float(steps[-1] - steps[start])
    if held < cfg.reward_zero_hold_steps:
        return None
    return Indicator(
        "reward_zero",
        True,
        M.REWARD_MEAN,
        num(float(means[-1])),
        num(level),
        cfg.reward_zero_mean_window,
        {
            "zero_level": num(level),
            "running_peak": num(mean_peak),
            "recent": num(float(means[-1])),
            "held_steps": int(held),
            "statistic_is": f"the reward's {cfg.reward_zero_mean_window}-step trailing mean, below "
            f"{cfg.reward_zero_level:.0%} of its best for {int(held)} steps (the collapse label's criterion)",
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
    measured as the paper measures it (lld-reference.md section 2, Fig. 2)."""
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

    def fired(self, name: str) -> bool:
        ind = self.indicators.get(name)
        return ind is not None and ind.fired

    def evidence(self, names: list[str] | tuple[str, ...]) -> dict[str, Any]:
        return {n: self.indicators[n].evidence() for n in names if n in self.indicators}


def compute(
    h: History, cfg: DetectorConfig, reward_peak: float | None, hooks: bool, anchor_peak: float | None = None
) -> Signals:
    """Every phase signal at the current (last) point of `h`. `reward_peak` already includes this point;
    `hooks`: the run's source has sent likelihood metrics at some point of its life."""
    ind: dict[str, Indicator] = {}
    ind["grad_surge"] = surge(
        h, "grad_surge", M.GRAD_NORM, cfg, cfg.grad_surge_ratio, idle_ratio=cfg.grad_idle_ratio
    )
    ind["entropy_surge"] = surge(
        h, "entropy_surge", M.ENTROPY_MEAN, cfg, cfg.entropy_surge_ratio, eps=cfg.entropy_eps
    )
    corroborated = ind["grad_surge"].fired or ind["entropy_surge"].fired
    r_smooth = reward_smoothed(h, cfg)
    ind["reward_crash"] = reward_crash(h, cfg, r_smooth, reward_peak, corroborated)
    ind["reward_rising"] = reward_rising(h, cfg, cfg.trend_window)
    if hooks:
        decline, fit = likelihood_decline(h, cfg)
        ind["logp_pos_decline"] = decline
        ind["logp_pos_flat"] = likelihood_flat(fit, cfg)
        ind["frac_decreased_majority"] = frac_majority(h, cfg)
        ind["delta_traj_pos_negative"] = delta_negative(h, cfg)
        ind["anchor_decline"] = anchor_decline(h, cfg, anchor_peak)
        ind["logp_correct_decline"] = correct_decline(h, cfg)
        ind["delta_traj_correct_negative"] = delta_negative(h, cfg, M.DELTA_TRAJ_CORRECT)
        declining = ind["anchor_decline"].fired or ind["logp_correct_decline"].fired
        lazy = "not evaluated: needs a likelihood decline first"
        # a sharp drop only counts with a decline of the anchor / correct responses (phases.candidate), and
        # a rising decreased share only as support of evidence or with negative exact deltas: skip the fits
        # otherwise (the detector's budget is < 5 ms per point)
        for key, metric in (("logp_pos_sharp_drop", M.LOGP_POS), ("anchor_sharp_drop", M.ANCHOR_LOGP)):
            ind[key] = likelihood_acceleration(h, cfg, metric) if declining else off(key, metric, lazy)
        support = (
            declining or ind["delta_traj_pos_negative"].fired or ind["delta_traj_correct_negative"].fired
        )
        ind["frac_decreased_rising"] = (
            frac_rising(h, cfg)
            if support
            else off(
                "frac_decreased_rising", M.FRAC_TRAJ_DECREASED_POS, "not evaluated: no likelihood evidence"
            )
        )
    e_smooth = recent_median(h, M.ENTROPY_MEAN, cfg.entropy_collapse_window, cfg.min_recent_points)
    return Signals(hooks=hooks, indicators=ind, reward_smooth=r_smooth, entropy_smooth=e_smooth)

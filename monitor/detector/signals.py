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
from monitor.detector.stats import FloatArray
from monitor.detector.types import BoolArray

DEGRADED_EXPLANATION: Final = (
    "likelihood metrics (lld/logp_pos, lld/frac_traj_decreased_pos, lld/delta_traj_pos) are absent - an "
    "imported trainer log or hooks switched off. Phases I-II (stagnation, decay) cannot be seen without "
    "them; only phase III (collapse) and terminal signatures are detected, from reward, grad norm, entropy, "
    "response length, KL and clip fraction."
)

USED_METRICS: Final = (
    M.LOGP_POS,
    M.FRAC_TRAJ_DECREASED_POS,
    M.DELTA_TRAJ_POS,
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
)
"""The metrics the detector reads; everything else in a window is ignored."""

HOOK_METRICS: Final = (M.LOGP_POS, M.FRAC_TRAJ_DECREASED_POS, M.DELTA_TRAJ_POS)


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
    """The points a step is judged on: the current point is the last one."""

    steps: FloatArray
    """Step numbers relative to the current step (<= 0), as floats for the regressions."""
    values: Mapping[str, FloatArray]
    present: Mapping[str, BoolArray]
    step: int
    cache: dict[tuple[str, str, int, int], Any] = field(default_factory=dict, compare=False, repr=False)
    """Fits computed for this point (several signals share them)."""

    def get(self, name: str) -> FloatArray | None:
        return self.values.get(name)

    def logged_now(self, name: str) -> tuple[bool, float]:
        """(was a value logged at the current point, that value)."""
        pres = self.present.get(name)
        vals = self.values.get(name)
        if pres is None or vals is None or pres.size == 0 or not bool(pres[-1]):
            return False, float("nan")
        return True, float(vals[-1])

    def __len__(self) -> int:
        return int(self.steps.size)


def recent_median(h: History, name: str, n: int) -> float:
    v = h.get(name)
    return float("nan") if v is None else stats.median(v[-n:])


def hooks_available(h: History, cfg: DetectorConfig) -> bool:
    """Enough likelihood metrics in the trend window to judge phases I-II."""
    need = max(5, cfg.trend_window // 2)
    for name in (M.LOGP_POS, M.FRAC_TRAJ_DECREASED_POS):
        v = h.get(name)
        if v is not None and int(np.isfinite(v[-cfg.trend_window :]).sum()) >= need:
            return True
    return False


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
    """Median of the last `surge_recent` points vs the median of the `baseline_window` before them, on a
    log scale, with a robust z from the baseline MAD. `idle_ratio` drops idle points (grad norm ~0)."""
    v = h.get(metric)
    if v is None:
        return off(name, metric, "metric not logged")
    n = v.size
    recent_n = cfg.surge_recent
    rec = stats.finite(v[max(0, n - recent_n) :])
    ref = stats.finite(v[max(0, n - recent_n - cfg.baseline_window) : max(0, n - recent_n)])
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
    if ref.size < cfg.min_baseline_points or rec.size < recent_n // 2 + 1:
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
        "recent_median": num(math.exp(now) - eps),
        "baseline_median": num(math.exp(base) - eps),
        "ratio": num(math.exp(shift)),
        "ratio_threshold": ratio,
        "robust_z": num(z),
        "z_threshold": cfg.surge_z,
        "baseline_points": int(ref.size),
    }
    if idle_ratio is not None:
        detail["idle_below"] = num(idle_below)
    return Indicator(name, fired, metric, num(math.exp(shift)), ratio, recent_n, detail)


# --- reward -----------------------------------------------------------------------------------------------


def reward_reference(h: History, cfg: DetectorConfig) -> tuple[float, float]:
    """(median, noise SD around its Theil-Sen trend) of the reward over the baseline window before the
    smoothed points: the level a crash is measured from, in units of the reward's own noise."""
    v = h.get(M.REWARD_MEAN)
    if v is None:
        return float("nan"), float("nan")
    n = v.size
    start = max(0, n - cfg.reward_smooth - cfg.baseline_window)
    end = max(0, n - cfg.reward_smooth)
    fit = trend(h, M.REWARD_MEAN, cfg.baseline_window, offset=cfg.reward_smooth)
    if fit.n < cfg.min_baseline_points:
        return float("nan"), float("nan")
    return stats.median(v[start:end]), fit.resid_sd


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
    if not (peak - floor > 0 and smoothed < level):  # the costly noise estimate only when it matters
        detail0 = {"smoothed": num(smoothed), "running_peak": num(peak)}
        return Indicator(name, False, M.REWARD_MEAN, num(smoothed), num(level), cfg.reward_smooth, detail0)
    ref, noise = reward_reference(h, cfg)
    if not (math.isfinite(noise) and math.isfinite(ref)):
        return off(name, M.REWARD_MEAN)
    drop = ref - smoothed
    drop_z = drop / noise if noise > 0 else (math.inf if drop > 0 else 0.0)
    z_needed = cfg.reward_corroborated_z if corroborated else cfg.reward_crash_z
    fired = peak - floor > 0 and smoothed < level and drop_z >= z_needed
    detail = {
        "smoothed": num(smoothed),
        "running_peak": num(peak),
        "reference_level": num(ref),
        "drop_in_noise_sd": num(drop_z),
        "drop_z_threshold": z_needed,
        "noise_sd": num(noise),
        "corroborated_by_surge": bool(corroborated),
    }
    return Indicator(name, fired, M.REWARD_MEAN, num(smoothed), num(level), cfg.reward_smooth, detail)


def trend(h: History, metric: str, window: int, offset: int = 0) -> stats.TrendFit:
    """Theil-Sen fit over `window` points ending `offset` points before the current one (memoised)."""
    key = ("trend", metric, window, offset)
    fit: stats.TrendFit | None = h.cache.get(key)
    if fit is None:
        fit = h.cache[key] = _trend(h, metric, window, offset)
    return fit


def _trend(h: History, metric: str, window: int, offset: int) -> stats.TrendFit:
    v = h.get(metric)
    if v is None:
        return stats.NO_FIT
    n = v.size
    end = n - offset
    start = max(0, end - window)
    if end - start < 5:
        return stats.NO_FIT
    return stats.theil_sen(h.steps[start:end], v[start:end])


def reward_rising(h: History, cfg: DetectorConfig, window: int, name: str = "reward_rising") -> Indicator:
    """Reward Theil-Sen slope significantly positive over `window` points."""
    fit = trend(h, M.REWARD_MEAN, window)
    if fit.n < window // 2:
        return off(name, M.REWARD_MEAN)
    return Indicator(
        name,
        fit.mk_z >= cfg.reward_rise_z,
        M.REWARD_MEAN,
        num(fit.mk_z),
        cfg.reward_rise_z,
        window,
        {"slope_per_step": num(fit.slope), "statistic_is": "Mann-Kendall Z (slope: Theil-Sen)"},
    )


def reward_zero(h: History, cfg: DetectorConfig, peak: float | None) -> Indicator:
    name = "reward_zero"
    v = h.get(M.REWARD_MEAN)
    if v is None or peak is None:
        return off(name, M.REWARD_MEAN)
    floor = cfg.reward_floor
    if peak - floor < cfg.reward_zero_min_peak:
        return off(name, M.REWARD_MEAN, "the reward never rose above its floor")
    recent = stats.finite(v[-cfg.reward_zero_window :])
    if recent.size < cfg.reward_zero_window // 2 + 1:
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
            "statistic_is": "share of points <= zero_level",
        },
    )


# --- likelihood (hook metrics) ----------------------------------------------------------------------------


def _reference(h: History, metric: str, cfg: DetectorConfig) -> tuple[float, float, int]:
    """(median, noise SD around its trend, points) of the reference window before the trend window."""
    v = h.get(metric)
    if v is None:
        return float("nan"), float("nan"), 0
    fit = trend(h, metric, cfg.reference_window, offset=cfg.trend_window)
    n = v.size
    end = max(0, n - cfg.trend_window)
    return stats.median(v[max(0, end - cfg.reference_window) : end]), fit.resid_sd, fit.n


def likelihood_decline(h: History, cfg: DetectorConfig) -> tuple[Indicator, stats.TrendFit]:
    """Phase II on `lld/logp_pos`: significant negative Theil-Sen slope over the trend window AND a lower
    CUSUM (vs the reference window's level and noise) past its decision interval."""
    name = "logp_pos_decline"
    metric = M.LOGP_POS
    fit = trend(h, metric, cfg.trend_window)
    v = h.get(metric)
    if v is None or fit.n < cfg.trend_window // 2:
        return off(name, metric), fit
    target, scale, n_ref = _reference(h, metric, cfg)
    if n_ref < 10 or not math.isfinite(scale):
        return off(name, metric, "reference window too short"), fit
    scale = max(scale, fit.resid_sd if math.isfinite(fit.resid_sd) else 0.0, 1e-9)
    s = stats.cusum_last(v[-cfg.trend_window :], target, scale, cfg.cusum_k, direction=-1)
    fired = fit.mk_z <= -cfg.decay_z and s >= cfg.cusum_h
    detail = {
        "slope_per_step": num(fit.slope),
        "slope_z": num(fit.mk_z),
        "slope_z_threshold": -cfg.decay_z,
        "cusum_lower": num(s),
        "cusum_h": cfg.cusum_h,
        "reference_level": num(target),
        "noise_sd": num(scale),
        "statistic_is": "Mann-Kendall Z (slope: Theil-Sen)",
    }
    return Indicator(name, fired, metric, num(fit.mk_z), -cfg.decay_z, cfg.trend_window, detail), fit


def likelihood_flat(fit: stats.TrendFit, cfg: DetectorConfig) -> Indicator:
    if fit.n < cfg.trend_window // 2:
        return off("logp_pos_flat", M.LOGP_POS)
    return Indicator(
        "logp_pos_flat",
        abs(fit.mk_z) < cfg.flat_z,
        M.LOGP_POS,
        num(fit.mk_z),
        cfg.flat_z,
        cfg.trend_window,
        {"slope_per_step": num(fit.slope), "statistic_is": "|Mann-Kendall Z|"},
    )


def likelihood_acceleration(h: History, cfg: DetectorConfig) -> Indicator:
    """Phase III on `lld/logp_pos`: the slope over the last `accel_window` points is significantly
    negative (noise SD from the reference window) and `accel_ratio` times steeper than the trend before."""
    name = "logp_pos_sharp_drop"
    metric = M.LOGP_POS
    short = trend(h, metric, cfg.accel_window)
    prev = trend(h, metric, cfg.trend_window, offset=cfg.accel_window)
    if short.n < cfg.accel_window // 2 + 1 or prev.n < cfg.trend_window // 2:
        return off(name, metric)
    _, ref_noise, n_ref = _reference(h, metric, cfg)
    noise = ref_noise if n_ref >= 10 and math.isfinite(ref_noise) else prev.resid_sd
    noise = max(noise, 1e-9) if math.isfinite(noise) else 1e-9
    v = h.get(metric)
    assert v is not None
    x_short = h.steps[-cfg.accel_window :][np.isfinite(v[-cfg.accel_window :])]
    se = stats.slope_se(x_short, noise)
    z = short.slope / se if se > 0 else 0.0
    limit = cfg.accel_ratio * min(prev.slope, 0.0)
    fired = z <= -cfg.accel_z and short.slope <= limit
    detail = {
        "slope_per_step": num(short.slope),
        "previous_slope_per_step": num(prev.slope),
        "slope_limit": num(limit),
        "accel_ratio": cfg.accel_ratio,
        "slope_z": num(z),
        "slope_z_threshold": -cfg.accel_z,
        "noise_sd": num(noise),
    }
    return Indicator(name, fired, metric, num(z), -cfg.accel_z, cfg.accel_window, detail)


def frac_rising(h: History, cfg: DetectorConfig) -> Indicator:
    """`lld/frac_traj_decreased_pos` rising: Theil-Sen z and an upper CUSUM vs the reference window."""
    name = "frac_decreased_rising"
    metric = M.FRAC_TRAJ_DECREASED_POS
    fit = trend(h, metric, cfg.trend_window)
    v = h.get(metric)
    if v is None or fit.n < cfg.trend_window // 2:
        return off(name, metric)
    target, scale, n_ref = _reference(h, metric, cfg)
    if n_ref < 10 or not math.isfinite(scale):
        return off(name, metric, "reference window too short")
    scale = max(scale, fit.resid_sd if math.isfinite(fit.resid_sd) else 0.0, 1e-9)
    s = stats.cusum_last(v[-cfg.trend_window :], target, scale, cfg.cusum_k, direction=1)
    fired = fit.mk_z >= cfg.decay_z and s >= cfg.cusum_h
    detail = {
        "slope_per_step": num(fit.slope),
        "slope_z": num(fit.mk_z),
        "cusum_upper": num(s),
        "cusum_h": cfg.cusum_h,
        "reference_level": num(target),
    }
    return Indicator(name, fired, metric, num(fit.mk_z), cfg.decay_z, cfg.trend_window, detail)


def frac_majority(h: History, cfg: DetectorConfig) -> Indicator:
    name = "frac_decreased_majority"
    metric = M.FRAC_TRAJ_DECREASED_POS
    v = h.get(metric)
    if v is None:
        return off(name, metric, "metric not logged")
    recent = stats.finite(v[-cfg.surge_recent :])
    if recent.size < cfg.surge_recent // 2 + 1:
        return off(name, metric)
    med = stats.fast_median(recent)
    return Indicator(name, med > cfg.frac_majority, metric, num(med), cfg.frac_majority, cfg.surge_recent)


def delta_negative(h: History, cfg: DetectorConfig) -> Indicator:
    """`lld/delta_traj_pos` < 0 on most of the trend window (a sign test: the likelihood of correct
    responses falls over the update)."""
    name = "delta_traj_pos_negative"
    metric = M.DELTA_TRAJ_POS
    v = h.get(metric)
    if v is None:
        return off(name, metric, "metric not logged")
    recent = stats.finite(v[-cfg.trend_window :])
    if recent.size < cfg.trend_window // 2:
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
        {"median": num(med), "statistic_is": "share of points < 0"},
    )


# --- all signals of one point ---------------------------------------------------------------------------


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


def compute(h: History, cfg: DetectorConfig, reward_peak: float | None) -> Signals:
    """Every phase signal at the current (last) point of `h`. `reward_peak` already includes this point."""
    hooks = hooks_available(h, cfg)
    ind: dict[str, Indicator] = {}
    ind["grad_surge"] = surge(
        h, "grad_surge", M.GRAD_NORM, cfg, cfg.grad_surge_ratio, idle_ratio=cfg.grad_idle_ratio
    )
    ind["entropy_surge"] = surge(
        h, "entropy_surge", M.ENTROPY_MEAN, cfg, cfg.entropy_surge_ratio, eps=cfg.entropy_eps
    )
    corroborated = ind["grad_surge"].fired or ind["entropy_surge"].fired
    r_smooth = recent_median(h, M.REWARD_MEAN, cfg.reward_smooth)
    ind["reward_crash"] = reward_crash(h, cfg, r_smooth, reward_peak, corroborated)
    ind["reward_rising"] = reward_rising(h, cfg, cfg.trend_window)
    if hooks:
        decline, fit = likelihood_decline(h, cfg)
        ind["logp_pos_decline"] = decline
        ind["logp_pos_flat"] = likelihood_flat(fit, cfg)
        ind["logp_pos_sharp_drop"] = likelihood_acceleration(h, cfg)
        ind["frac_decreased_rising"] = frac_rising(h, cfg)
        ind["frac_decreased_majority"] = frac_majority(h, cfg)
        ind["delta_traj_pos_negative"] = delta_negative(h, cfg)
    e_smooth = recent_median(h, M.ENTROPY_MEAN, cfg.entropy_collapse_window)
    return Signals(hooks=hooks, indicators=ind, reward_smooth=r_smooth, entropy_smooth=e_smooth)

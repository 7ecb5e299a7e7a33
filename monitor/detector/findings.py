"""Finding kinds and the conditions behind them (all kinds are defined here, once).

Phase findings follow the phase (`lld_decay` while in decay, `lld_collapse` while in collapse). Terminal
flags are the signatures users report at the end of a collapse (lld-reference.md section 3); each is a
sustained condition (median of `terminal_window` points) except non-finite grad norm / loss, which fire on
a single logged value and stay active until `nonfinite_clear` finite values follow. Entropy collapse and
advantage collapse are separate diagnoses (warnings) with their own hysteresis.

Decision on the real TRL FinQA log (flat reward, 50-70 % of groups with zero reward std for 2400 steps):
the `advantage_collapse` warning fires there, and that is wanted. More than half of every batch carries
no advantage and hence no policy gradient, which is why that run stagnates; the warning names the cause
(the remedy is dynamic sampling / harder prompts, not LLDS). It is a warning, never a collapse.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from contracts import metrics as M
from monitor.detector import stats
from monitor.detector.config import DetectorConfig
from monitor.detector.phases import PHASE_SIGNALS, confirmed, streak
from monitor.detector.signals import (
    DEGRADED_EXPLANATION,
    History,
    Indicator,
    Signals,
    num,
    off,
    reward_rising,
    reward_zero,
)
from monitor.detector.state import DetectorState
from monitor.detector.stats import FloatArray
from monitor.detector.types import COLLAPSE, DECAY, Severity

LLD_DECAY: Final = "lld_decay"
LLD_COLLAPSE: Final = "lld_collapse"
NONFINITE_GRAD: Final = "nonfinite_grad"
NONFINITE_LOSS: Final = "nonfinite_loss"
REWARD_ZERO: Final = "reward_zero"
LENGTH_COLLAPSE: Final = "length_collapse"
CLIP_RATIO_SATURATED: Final = "clip_ratio_saturated"
RATIO_BLOWUP: Final = "ratio_blowup"
KL_BLOWUP: Final = "kl_blowup"
GARBLED_OUTPUTS: Final = "garbled_outputs"
ENTROPY_COLLAPSE: Final = "entropy_collapse"
ADVANTAGE_COLLAPSE: Final = "advantage_collapse"
TRAINING_COLLAPSE: Final = "training_collapse"
"""Phase III without likelihood evidence: a collapse that cannot be attributed to LLD."""
DEAD_RUN: Final = "dead_run"
LENGTH_EXPLOSION: Final = "length_explosion"
INVALID_ACTION_SURGE: Final = "invalid_action_surge"
ENTROPY_EXPLOSION: Final = "entropy_explosion"

TERMINAL_KINDS: Final = (
    NONFINITE_GRAD,
    NONFINITE_LOSS,
    REWARD_ZERO,
    LENGTH_COLLAPSE,
    CLIP_RATIO_SATURATED,
    RATIO_BLOWUP,
    KL_BLOWUP,
    GARBLED_OUTPUTS,
    DEAD_RUN,
    LENGTH_EXPLOSION,
    INVALID_ACTION_SURGE,
)
"""Critical terminal flags."""

SEVERITY: Final[dict[str, Severity]] = {
    LLD_DECAY: "warning",
    LLD_COLLAPSE: "critical",
    TRAINING_COLLAPSE: "critical",
    **dict.fromkeys(TERMINAL_KINDS, "critical"),
    ENTROPY_COLLAPSE: "warning",
    ADVANTAGE_COLLAPSE: "warning",
    ENTROPY_EXPLOSION: "warning",
}
ALL_KINDS: Final = tuple(SEVERITY)

COLLAPSE_WARNINGS: Final = (LLD_DECAY, ENTROPY_EXPLOSION)
"""Warnings that announce a collapse (with every critical kind: what an early warning may be). Entropy
and advantage collapse are diagnoses of stagnation, not of a coming collapse."""


@dataclass(frozen=True)
class Condition:
    kind: str
    message: str
    evidence: dict[str, Any]


def _recent_span(h: History, metric: str, cfg: DetectorConfig, steps: int | None = None) -> tuple[int, int]:
    return h.span(metric, cfg.terminal_window if steps is None else steps, min_points=cfg.min_recent_points)


def _median_tail(h: History, metric: str, cfg: DetectorConfig, steps: int | None = None) -> tuple[float, int]:
    v = h.get(metric)
    if v is None:
        return float("nan"), 0
    lo, hi = _recent_span(h, metric, cfg, steps)
    tail = stats.finite(v[lo:hi])
    return (stats.fast_median(tail) if tail.size else float("nan")), int(tail.size)


def _baseline(
    h: History, metric: str, cfg: DetectorConfig, absolute: bool = False, recent_steps: int | None = None
) -> float:
    """Median of the `baseline_window` steps before the recent window. A young run (fewer than
    `min_baseline_points` values so far) is judged against its own start once it has `min_start_points`."""
    v = h.get(metric)
    if v is None:
        return float("nan")
    lo, _ = _recent_span(h, metric, cfg, recent_steps)
    b_lo, b_hi = h.before(metric, lo, cfg.baseline_window, min_points=cfg.min_baseline_points)
    ref = stats.finite(v[b_lo:b_hi])
    if ref.size < cfg.min_start_points:
        return float("nan")
    return stats.fast_median(np.abs(ref) if absolute else ref)


def _median_rule(
    h: History,
    name: str,
    metric: str,
    cfg: DetectorConfig,
    threshold: float,
    direction: str,
    baseline: float | None = None,
) -> Indicator:
    """The median of the last `terminal_window` steps is >= threshold ("above") or < it ("below")."""
    med, count = _median_tail(h, metric, cfg)
    if count < cfg.min_recent_points:
        return off(name, metric)
    fired = med >= threshold if direction == "above" else med < threshold
    detail: dict[str, Any] = {
        "direction": direction,
        "statistic_is": "median of recent values",
        "recent": num(med),
    }
    if baseline is not None:
        detail["baseline"] = num(baseline)
    return Indicator(name, bool(fired), metric, num(med), num(threshold), cfg.terminal_window, detail)


def _held_baseline(
    h: History,
    kind: str,
    metric: str,
    cfg: DetectorConfig,
    state: DetectorState,
    absolute: bool = False,
    recent_steps: int | None = None,
) -> float:
    """The rolling baseline median, or, while `kind` is active, the baseline it was raised against (so a
    lasting collapse is not absorbed into its own baseline)."""
    record = state.active.get(kind)
    if record is not None:
        evidence = record["evidence"]
        per_metric = evidence.get("baselines")
        if isinstance(per_metric, dict):  # a finding over several metrics (KL_BLOWUP)
            held = per_metric.get(metric)
        else:
            held = evidence.get("baseline") if evidence.get("metric", metric) == metric else None
        if isinstance(held, (int, float)) and not isinstance(held, bool):
            return float(held)
    return _baseline(h, metric, cfg, absolute, recent_steps)


KL_METRICS: Final = (M.KL_REF, M.KL_OLD)
"""Two different quantities (lld-reference.md section 5), each judged against its own baseline."""


def _kl_blowup(h: History, cfg: DetectorConfig, state: DetectorState) -> Indicator:
    """KL to the reference policy (`kl/ref`) or from the old policy (`kl/old`) far above its own baseline:
    the first that fired, else the first with data. Its evidence holds every baseline (`baselines`), so
    that each is held while the finding is active."""
    indicators: list[Indicator] = []
    baselines: dict[str, float | None] = {}
    for metric in KL_METRICS:
        base = _held_baseline(h, KL_BLOWUP, metric, cfg, state, absolute=True)
        if not math.isfinite(base):  # judged against the run's own start once it has one
            baselines[metric] = None
            indicators.append(off(KL_BLOWUP, metric, "no baseline yet"))
            continue
        limit = max(cfg.kl_blowup_abs, cfg.kl_blowup_factor * base)
        baselines[metric] = num(base)
        indicators.append(_median_rule(h, KL_BLOWUP, metric, cfg, limit, "above", base))
    chosen = next((i for i in indicators if i.fired), None)
    if chosen is None:
        chosen = next((i for i in indicators if i.statistic is not None), indicators[0])
    return dataclasses.replace(chosen, detail={**chosen.detail, "baselines": baselines})


def _idle_level(h: History, cfg: DetectorConfig, lo: int) -> float:
    """Grad norms at or below this are idle: `grad_idle_abs`, or `grad_idle_ratio` of the 75th percentile
    of the baseline before index `lo` when there is one."""
    v = h.get(M.GRAD_NORM)
    level = cfg.grad_idle_abs
    if v is None:
        return level
    b_lo, b_hi = h.before(M.GRAD_NORM, lo, cfg.baseline_window, min_points=cfg.min_baseline_points)
    ref = stats.finite(v[b_lo:b_hi])
    ref = ref[ref > cfg.grad_idle_abs]
    if ref.size >= cfg.min_start_points:
        level = max(level, cfg.grad_idle_ratio * float(np.sort(ref)[(3 * (ref.size - 1)) // 4]))
    return level


def dead_run(h: History, cfg: DetectorConfig, state: DetectorState) -> Indicator:
    """No learning signal and nothing to learn from: over the last `dead_window` steps every logged grad
    norm is idle and every logged reward is at ~0 after having risen (or every group had zero reward
    variance). GRPO cannot leave this state by itself (all-equal rewards give zero advantages)."""
    name = DEAD_RUN
    g = h.get(M.GRAD_NORM)
    if g is None:
        return off(name, M.GRAD_NORM, "metric not logged")
    r_lo, _ = h.span(M.REWARD_MEAN, cfg.dead_window, min_points=cfg.reward_zero_points)
    lo, hi = h.span(M.GRAD_NORM, cfg.dead_window, min_points=cfg.dead_min_points)
    lo = min(lo, r_lo)
    grads = g[lo:hi][h.present.get(M.GRAD_NORM, np.ones(g.size, bool))[lo:hi]]
    grads = grads[~np.isnan(grads)]
    if grads.size < cfg.dead_min_points:
        return off(name, M.GRAD_NORM)
    idle = _idle_level(h, cfg, lo)
    all_idle = bool(np.all(np.abs(grads) <= idle))
    x_lo = h.steps[lo]
    rewards = _values_since(h, M.REWARD_MEAN, x_lo)
    peak = state.reward_peak
    zero_level = float("nan")
    reward_dead = False
    enough = rewards.size >= cfg.reward_zero_points
    if peak is not None and peak - cfg.reward_floor >= cfg.reward_zero_min_peak and enough:
        zero_level = cfg.reward_floor + cfg.reward_zero_level * (peak - cfg.reward_floor)
        reward_dead = bool(np.all(rewards <= zero_level))
    zero_std = _values_since(h, M.ADV_FRAC_ZERO_STD_GROUPS, x_lo)
    no_variance = zero_std.size >= 2 and bool(np.all(zero_std >= 0.99)) and enough
    fired = all_idle and (reward_dead or (no_variance and bool(np.all(rewards <= zero_level))))
    detail: dict[str, Any] = {
        "statistic_is": "largest grad norm of recent steps",
        "meaning": "no learning signal: grad norm idle and reward at ~0",
        "idle_below": num(idle),
        "recent_rewards_max": num(float(rewards.max())) if rewards.size else None,
        "zero_level": num(zero_level),
        "running_peak": num(peak),
    }
    return Indicator(
        name, fired, M.GRAD_NORM, num(float(np.max(np.abs(grads)))), num(idle), cfg.dead_window, detail
    )


def _values_since(h: History, metric: str, x_lo: float) -> FloatArray:
    v = h.get(metric)
    if v is None:
        return np.empty(0)
    lo = int(np.searchsorted(h.steps, x_lo, side="left"))
    return stats.finite(v[lo:])


def length_explosion(h: History, cfg: DetectorConfig, state: DetectorState) -> Indicator:
    """Responses grow to the length limit: median length >= `length_explosion_ratio` x its baseline with
    >= `length_explosion_clip` of them clipped (without a clip ratio: one ratio step more)."""
    name = LENGTH_EXPLOSION
    metric = M.RESPONSE_LENGTH_MEAN
    base = _held_baseline(h, LENGTH_EXPLOSION, metric, cfg, state)
    med, count = _median_tail(h, metric, cfg)
    if not (math.isfinite(base) and base > 0) or count < cfg.min_recent_points:
        return off(name, metric)
    clip, clip_count = _median_tail(h, M.RESPONSE_CLIP_RATIO, cfg)
    if clip_count >= cfg.min_recent_points:
        fired = med >= cfg.length_explosion_ratio * base and clip >= cfg.length_explosion_clip
        threshold = cfg.length_explosion_ratio * base
    else:
        threshold = (cfg.length_explosion_ratio + 1) * base
        fired = med >= threshold
    detail = {
        "statistic_is": "median response length of recent steps",
        "recent": num(med),
        "baseline": num(base),
        "clip_ratio": num(clip),
        "clip_ratio_threshold": cfg.length_explosion_clip,
    }
    return Indicator(name, bool(fired), metric, num(med), num(threshold), cfg.terminal_window, detail)


VALIDITY_METRICS: Final = (M.ACTION_VALID_RATIO, M.SEARCH_VALID_PER_TRAJ)


def invalid_action_surge(h: History, cfg: DetectorConfig, state: DetectorState) -> Indicator:
    """The agent stops producing valid actions: valid-action ratio or valid searches per trajectory below
    `validity_collapse_ratio` of its baseline (the first metric that fired, else the first with data)."""
    out: list[Indicator] = []
    for metric in VALIDITY_METRICS:
        base = _held_baseline(h, INVALID_ACTION_SURGE, metric, cfg, state)
        med, count = _median_tail(h, metric, cfg)
        if not math.isfinite(base) or base < cfg.validity_min_baseline or count < cfg.min_recent_points:
            continue
        threshold = cfg.validity_collapse_ratio * base
        detail = {
            "statistic_is": "median of recent values",
            "meaning": "valid actions / searches falling",
            "recent": num(med),
            "baseline": num(base),
        }
        out.append(
            Indicator(
                INVALID_ACTION_SURGE,
                med < threshold,
                metric,
                num(med),
                num(threshold),
                cfg.terminal_window,
                detail,
            )
        )
    if not out:
        return off(INVALID_ACTION_SURGE, VALIDITY_METRICS[0])
    return next((i for i in out if i.fired), out[0])


def entropy_explosion(h: History, cfg: DetectorConfig, state: DetectorState) -> Indicator:
    """Entropy far above the run's own level: recent median (over `entropy_explosion_window` steps) >=
    `entropy_explosion_ratio` x its baseline and a robust z >= `surge_z` on the log scale."""
    name = ENTROPY_EXPLOSION
    metric = M.ENTROPY_MEAN
    v = h.get(metric)
    if v is None:
        return off(name, metric, "metric not logged")
    lo, hi = h.span(metric, cfg.entropy_explosion_window, min_points=cfg.min_recent_points)
    rec = stats.finite(v[lo:hi])
    record = state.active.get(ENTROPY_EXPLOSION)
    held = record["evidence"].get("baseline") if record is not None else None
    b_lo, b_hi = h.before(metric, lo, cfg.baseline_window, min_points=cfg.min_baseline_points)
    ref = stats.finite(v[b_lo:b_hi])
    ref = np.log(np.maximum(ref, 0.0) + cfg.entropy_eps)
    if rec.size < cfg.min_recent_points or ref.size < cfg.min_start_points:
        return off(name, metric)
    base = (
        float(held) if isinstance(held, (int, float)) else math.exp(stats.fast_median(ref)) - cfg.entropy_eps
    )
    now = stats.fast_median(rec)
    log_base = math.log(max(base, 0.0) + cfg.entropy_eps)
    spread = stats.MAD_TO_SD * stats.fast_median(np.abs(ref - stats.fast_median(ref)))
    shift = math.log(max(now, 0.0) + cfg.entropy_eps) - log_base
    z = shift / spread if spread > 0 else (math.inf if shift > 0 else 0.0)
    ratio = math.exp(shift)
    fired = ratio >= cfg.entropy_explosion_ratio and (z >= cfg.surge_z or held is not None)
    detail = {
        "statistic_is": "ratio of the recent median entropy to its baseline",
        "recent": num(now),
        "baseline": num(base),
        "robust_z": num(z),
        "z_threshold": cfg.surge_z,
    }
    return Indicator(
        name, fired, metric, num(ratio), cfg.entropy_explosion_ratio, cfg.entropy_explosion_window, detail
    )


ENTROPY_EXPLOSION_DEGRADED: Final = "entropy_explosion_with_degraded_outputs"
"""The reason (not a finding kind) that turns an entropy explosion into phase III: valid actions or
searches falling, or clipping rising, with it."""


def outputs_degraded(h: History, cfg: DetectorConfig) -> list[str]:
    """What degrades with an entropy explosion: valid actions / searches `entropy_explosion_validity_drop`
    below their baseline, or the clipped share `entropy_explosion_clip_rise` above its baseline."""
    out: list[str] = []
    for metric in VALIDITY_METRICS:
        base = _baseline(h, metric, cfg)
        med, count = _median_tail(h, metric, cfg)
        known = math.isfinite(base) and base > 0 and count >= cfg.min_recent_points
        if known and med <= (1 - cfg.entropy_explosion_validity_drop) * base:
            out.append(f"{metric} {num(med)} vs baseline {num(base)}")
    base = _baseline(h, M.RESPONSE_CLIP_RATIO, cfg)
    med, count = _median_tail(h, M.RESPONSE_CLIP_RATIO, cfg)
    if (
        math.isfinite(base)
        and count >= cfg.min_recent_points
        and med >= base + cfg.entropy_explosion_clip_rise
    ):
        out.append(f"{M.RESPONSE_CLIP_RATIO} {num(med)} vs baseline {num(base)}")
    return out


def terminal_indicators(h: History, cfg: DetectorConfig, state: DetectorState) -> dict[str, Indicator]:
    """Sustained terminal signatures at the current point (non-finite values are handled by latches)."""
    out: dict[str, Indicator] = {REWARD_ZERO: reward_zero(h, cfg, state.reward_peak, state.reward_mean_peak)}
    base_len = _held_baseline(h, LENGTH_COLLAPSE, M.RESPONSE_LENGTH_MEAN, cfg, state)
    if math.isfinite(base_len) and base_len > 0:
        out[LENGTH_COLLAPSE] = _median_rule(
            h,
            LENGTH_COLLAPSE,
            M.RESPONSE_LENGTH_MEAN,
            cfg,
            cfg.length_collapse_ratio * base_len,
            "below",
            base_len,
        )
    out[LENGTH_EXPLOSION] = length_explosion(h, cfg, state)
    out[CLIP_RATIO_SATURATED] = _median_rule(
        h, CLIP_RATIO_SATURATED, M.RESPONSE_CLIP_RATIO, cfg, cfg.clip_ratio_saturated, "above"
    )
    high = _median_rule(h, RATIO_BLOWUP, M.RATIO_POS_MEAN, cfg, cfg.ratio_high, "above")
    out[RATIO_BLOWUP] = (
        high if high.fired else _median_rule(h, RATIO_BLOWUP, M.RATIO_POS_MEAN, cfg, cfg.ratio_low, "below")
    )
    out[KL_BLOWUP] = _kl_blowup(h, cfg, state)
    out[GARBLED_OUTPUTS] = _median_rule(h, GARBLED_OUTPUTS, M.GARBLED_FRAC, cfg, cfg.garbled_max, "above")
    out[DEAD_RUN] = dead_run(h, cfg, state)
    out[INVALID_ACTION_SURGE] = invalid_action_surge(h, cfg, state)
    return out


MESSAGES: Final = {
    LLD_DECAY: "Lazy likelihood displacement, phase II: the likelihood of correct responses is decaying "
    "while the reward still rises. Consider enabling LLDS now.",
    LLD_COLLAPSE: "LLD collapse, phase III: the likelihood of correct responses collapsed (lazy likelihood "
    "displacement), with the training signals named in the evidence.",
    TRAINING_COLLAPSE: "Training collapse (phase III) without likelihood evidence of LLD: see the signals that "
    "fired in the evidence.",
    DEAD_RUN: "Dead run: no learning signal (grad norm idle) and the reward at ~0; GRPO cannot recover from "
    "this by itself.",
    LENGTH_EXPLOSION: "Response length exploded toward the length limit.",
    INVALID_ACTION_SURGE: "The agent's valid actions / tool calls collapsed far below their baseline.",
    ENTROPY_EXPLOSION: "Entropy exploded far above the run's own level.",
    NONFINITE_GRAD: "Non-finite gradient norm logged.",
    NONFINITE_LOSS: "Non-finite loss logged.",
    REWARD_ZERO: "Reward collapsed to the floor of its range (at most 20 % of the way from its floor to its "
    "peak) and stayed there.",
    LENGTH_COLLAPSE: "Response length collapsed far below its baseline.",
    CLIP_RATIO_SATURATED: "Almost every response hits the length limit (clip ratio ~1).",
    RATIO_BLOWUP: "Importance ratios of correct-response tokens left the trust region.",
    KL_BLOWUP: "KL divergence blew up (to the reference policy, kl/ref, or from the old policy, kl/old).",
    GARBLED_OUTPUTS: "A large share of responses is garbled (perplexity >= 50).",
    ENTROPY_COLLAPSE: "Entropy collapse: entropy slid toward 0 while the reward plateaus (exploration is gone).",
    ADVANTAGE_COLLAPSE: "Advantage collapse: most groups have zero reward variance, so most of the batch "
    "gives no policy gradient.",
}


def _base_evidence(sig: Signals | None) -> dict[str, Any]:
    if sig is None or sig.hooks:
        return {}
    return {"degraded": True, "explanation": DEGRADED_EXPLANATION}


def _latch_nonfinite(
    h: History, metric: str, kind: str, cfg: DetectorConfig, state: DetectorState
) -> Condition | None:
    logged, value = h.logged_now(metric)
    key = f"clear:{kind}"
    active = kind in state.active
    if logged and not math.isfinite(value):
        state.counters[key] = 0
        return Condition(
            kind,
            MESSAGES[kind],
            {
                "metric": metric,
                "value": "nan" if value != value else ("inf" if value > 0 else "-inf"),
                "statistic": None,
                "threshold": None,
                "window": 1,
            },
        )
    if not active:
        return None
    if logged:
        state.counters[key] = state.counters.get(key, 0) + 1
    if state.counters.get(key, 0) >= cfg.nonfinite_clear:
        state.counters.pop(key, None)
        return None
    previous = state.active[kind]
    return Condition(
        kind, previous["message"], dict(previous["evidence"], finite_since=state.counters.get(key, 0))
    )


def _hysteresis(
    state: DetectorState, kind: str, condition: bool, clear: bool, confirm: int, step: int
) -> bool:
    """Raise after `confirm` steps with `condition`, clear after `confirm` steps with `clear` (steps, not
    points: `phases.confirmed`)."""
    on = streak(state.counters, f"on:{kind}", condition, step)
    off_run = streak(state.counters, f"off:{kind}", clear, step)
    if kind not in state.active:
        return confirmed(on, confirm)
    return not confirmed(off_run, confirm)


def diagnoses(h: History, sig: Signals, cfg: DetectorConfig, state: DetectorState) -> list[Condition]:
    """Entropy collapse and advantage collapse (warnings)."""
    out: list[Condition] = []
    # entropy collapse: smoothed entropy <= ratio * its running peak while the reward plateaus
    peak = state.entropy_peak
    e_now = sig.entropy_smooth
    if peak is not None and math.isfinite(e_now):
        low = e_now <= cfg.entropy_collapse_ratio * peak
        rising = reward_rising(h, cfg, cfg.plateau_window, name="reward_rising_long") if low else None
        plateau = rising is not None and not rising.fired and rising.statistic is not None
        if _hysteresis(state, ENTROPY_COLLAPSE, low and plateau, not low, cfg.diagnosis_confirm, h.step):
            out.append(
                Condition(
                    ENTROPY_COLLAPSE,
                    MESSAGES[ENTROPY_COLLAPSE],
                    {
                        "metric": M.ENTROPY_MEAN,
                        "statistic": num(e_now),
                        "statistic_is": "median entropy of recent steps",
                        "recent": num(e_now),
                        "threshold": num(cfg.entropy_collapse_ratio * peak),
                        "window": cfg.entropy_collapse_window,
                        "running_peak": num(peak),
                        "reward_trend": rising.evidence() if rising is not None else None,
                    },
                )
            )
    explosion = entropy_explosion(h, cfg, state)
    if explosion.fired:
        out.append(Condition(ENTROPY_EXPLOSION, MESSAGES[ENTROPY_EXPLOSION], explosion.evidence()))
    v = h.get(M.ADV_FRAC_ZERO_STD_GROUPS)
    if v is not None:
        tail = h.recent(M.ADV_FRAC_ZERO_STD_GROUPS, cfg.adv_zero_std_window, cfg.min_recent_points)
        if tail.size >= cfg.min_recent_points:
            share = float(tail.sum()) / tail.size
            on = share > cfg.adv_zero_std_enter
            clear = share < cfg.adv_zero_std_exit
            if _hysteresis(state, ADVANTAGE_COLLAPSE, on, clear, cfg.diagnosis_confirm, h.step):
                out.append(
                    Condition(
                        ADVANTAGE_COLLAPSE,
                        MESSAGES[ADVANTAGE_COLLAPSE],
                        {
                            "metric": M.ADV_FRAC_ZERO_STD_GROUPS,
                            "statistic": num(share),
                            "threshold": cfg.adv_zero_std_enter,
                            "clear_below": cfg.adv_zero_std_exit,
                            "window": cfg.adv_zero_std_window,
                            "statistic_is": "mean share of groups with zero reward std",
                        },
                    )
                )
    return out


def conditions(h: History, sig: Signals | None, cfg: DetectorConfig, state: DetectorState) -> list[Condition]:
    """Every condition active at the current point except the phase findings (`phase_conditions`):
    non-finite latches, terminal signatures (from the first point) and the diagnoses."""
    out: list[Condition] = []
    base = _base_evidence(sig)
    for metric, kind in ((M.GRAD_NORM, NONFINITE_GRAD), (M.LOSS, NONFINITE_LOSS)):
        cond = _latch_nonfinite(h, metric, kind, cfg, state)
        if cond is not None:
            out.append(cond)
    for kind, ind in terminal_indicators(h, cfg, state).items():
        if ind.fired:
            out.append(Condition(kind, MESSAGES[kind], dict(base, **ind.evidence())))
    if sig is not None:
        out.extend(diagnoses(h, sig, cfg, state))
    return out


def phase_conditions(sig: Signals | None, state: DetectorState) -> list[Condition]:
    """The finding that mirrors the phase: `lld_decay` in phase II; in phase III `lld_collapse` or
    `training_collapse` (attribution decided when the run entered it)."""
    base = _base_evidence(sig)
    if state.phase == DECAY:
        signals = sig.evidence(PHASE_SIGNALS[DECAY]) if sig is not None else {}
        return [
            Condition(
                LLD_DECAY, MESSAGES[LLD_DECAY], dict(base, phase_since=state.phase_since, signals=signals)
            )
        ]
    if state.phase == COLLAPSE:
        kind = state.collapse_kind or TRAINING_COLLAPSE
        signals = sig.evidence(PHASE_SIGNALS[COLLAPSE]) if sig is not None else {}
        evidence = dict(
            base, phase_since=state.phase_since, reasons=list(state.collapse_reasons), signals=signals
        )
        return [Condition(kind, MESSAGES[kind], evidence)]
    return []

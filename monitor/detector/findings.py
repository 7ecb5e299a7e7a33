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
from monitor.detector.phases import PHASE_SIGNALS
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

TERMINAL_KINDS: Final = (
    NONFINITE_GRAD,
    NONFINITE_LOSS,
    REWARD_ZERO,
    LENGTH_COLLAPSE,
    CLIP_RATIO_SATURATED,
    RATIO_BLOWUP,
    KL_BLOWUP,
    GARBLED_OUTPUTS,
)
"""Critical terminal flags."""

SEVERITY: Final[dict[str, Severity]] = {
    LLD_DECAY: "warning",
    LLD_COLLAPSE: "critical",
    **dict.fromkeys(TERMINAL_KINDS, "critical"),
    ENTROPY_COLLAPSE: "warning",
    ADVANTAGE_COLLAPSE: "warning",
}
ALL_KINDS: Final = tuple(SEVERITY)


@dataclass(frozen=True)
class Condition:
    kind: str
    message: str
    evidence: dict[str, Any]


def _median_tail(h: History, metric: str, n: int) -> tuple[float, int]:
    v = h.get(metric)
    if v is None:
        return float("nan"), 0
    tail = stats.finite(v[-n:])
    return (stats.fast_median(tail) if tail.size else float("nan")), int(tail.size)


def _baseline(h: History, metric: str, cfg: DetectorConfig, absolute: bool = False) -> float:
    v = h.get(metric)
    if v is None:
        return float("nan")
    n = v.size
    ref = stats.finite(
        v[max(0, n - cfg.terminal_window - cfg.baseline_window) : max(0, n - cfg.terminal_window)]
    )
    if ref.size < cfg.min_baseline_points:
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
    """The median of the last `terminal_window` points is >= threshold ("above") or < it ("below")."""
    med, count = _median_tail(h, metric, cfg.terminal_window)
    if count < cfg.terminal_window // 2 + 1:
        return off(name, metric)
    fired = med >= threshold if direction == "above" else med < threshold
    detail: dict[str, Any] = {"direction": direction, "statistic_is": "median of recent points"}
    if baseline is not None:
        detail["baseline"] = num(baseline)
    return Indicator(name, bool(fired), metric, num(med), num(threshold), cfg.terminal_window, detail)


def _held_baseline(
    h: History, kind: str, metric: str, cfg: DetectorConfig, state: DetectorState, absolute: bool = False
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
    return _baseline(h, metric, cfg, absolute)


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
        limit = cfg.kl_blowup_abs
        if math.isfinite(base):
            limit = max(limit, cfg.kl_blowup_factor * base)
        finite_base = base if math.isfinite(base) else None
        baselines[metric] = num(finite_base)
        indicators.append(_median_rule(h, KL_BLOWUP, metric, cfg, limit, "above", finite_base))
    chosen = next((i for i in indicators if i.fired), None)
    if chosen is None:
        chosen = next((i for i in indicators if i.statistic is not None), indicators[0])
    return dataclasses.replace(chosen, detail={**chosen.detail, "baselines": baselines})


def terminal_indicators(h: History, cfg: DetectorConfig, state: DetectorState) -> dict[str, Indicator]:
    """Sustained terminal signatures at the current point (non-finite values are handled by latches)."""
    out: dict[str, Indicator] = {REWARD_ZERO: reward_zero(h, cfg, state.reward_peak)}
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
    out[CLIP_RATIO_SATURATED] = _median_rule(
        h, CLIP_RATIO_SATURATED, M.RESPONSE_CLIP_RATIO, cfg, cfg.clip_ratio_saturated, "above"
    )
    high = _median_rule(h, RATIO_BLOWUP, M.RATIO_POS_MEAN, cfg, cfg.ratio_high, "above")
    out[RATIO_BLOWUP] = (
        high if high.fired else _median_rule(h, RATIO_BLOWUP, M.RATIO_POS_MEAN, cfg, cfg.ratio_low, "below")
    )
    out[KL_BLOWUP] = _kl_blowup(h, cfg, state)
    out[GARBLED_OUTPUTS] = _median_rule(h, GARBLED_OUTPUTS, M.GARBLED_FRAC, cfg, cfg.garbled_max, "above")
    return out


MESSAGES: Final = {
    LLD_DECAY: "Lazy likelihood displacement, phase II: the likelihood of correct responses is decaying "
    "while the reward still rises. Consider enabling LLDS now.",
    LLD_COLLAPSE: "LLD collapse, phase III: accelerated likelihood decline / grad-norm or entropy surge / "
    "reward crash.",
    NONFINITE_GRAD: "Non-finite gradient norm logged.",
    NONFINITE_LOSS: "Non-finite loss logged.",
    REWARD_ZERO: "Reward has dropped to ~0 after having risen.",
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
        return {"degraded": False}
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


def _hysteresis(state: DetectorState, kind: str, condition: bool, clear: bool, confirm: int) -> bool:
    """Raise after `confirm` consecutive points with `condition`, clear after `confirm` with `clear`."""
    on_key, off_key = f"on:{kind}", f"off:{kind}"
    active = kind in state.active
    state.counters[on_key] = state.counters.get(on_key, 0) + 1 if condition else 0
    state.counters[off_key] = state.counters.get(off_key, 0) + 1 if clear else 0
    if not active:
        return state.counters[on_key] >= confirm
    return state.counters[off_key] < confirm


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
        if _hysteresis(state, ENTROPY_COLLAPSE, low and plateau, not low, cfg.diagnosis_confirm):
            out.append(
                Condition(
                    ENTROPY_COLLAPSE,
                    MESSAGES[ENTROPY_COLLAPSE],
                    {
                        "metric": M.ENTROPY_MEAN,
                        "statistic": num(e_now),
                        "threshold": num(cfg.entropy_collapse_ratio * peak),
                        "window": cfg.entropy_collapse_window,
                        "running_peak": num(peak),
                        "reward_trend": rising.evidence() if rising is not None else None,
                    },
                )
            )
    v = h.get(M.ADV_FRAC_ZERO_STD_GROUPS)
    if v is not None:
        tail = stats.finite(v[-cfg.adv_zero_std_window :])
        if tail.size >= cfg.adv_zero_std_window // 2:
            share = float(tail.sum()) / tail.size
            on = share > cfg.adv_zero_std_enter
            clear = share < cfg.adv_zero_std_exit
            if _hysteresis(state, ADVANTAGE_COLLAPSE, on, clear, cfg.diagnosis_confirm):
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
    """Every condition active at the current point (phase already advanced)."""
    out: list[Condition] = []
    base = _base_evidence(sig)
    for metric, kind in ((M.GRAD_NORM, NONFINITE_GRAD), (M.LOSS, NONFINITE_LOSS)):
        cond = _latch_nonfinite(h, metric, kind, cfg, state)
        if cond is not None:
            out.append(cond)
    if sig is None:
        return out
    for phase, kind in ((DECAY, LLD_DECAY), (COLLAPSE, LLD_COLLAPSE)):
        if state.phase == phase:
            evidence = dict(base, phase_since=state.phase_since, signals=sig.evidence(PHASE_SIGNALS[phase]))
            out.append(Condition(kind, MESSAGES[kind], evidence))
    for kind, ind in terminal_indicators(h, cfg, state).items():
        if ind.fired:
            out.append(Condition(kind, MESSAGES[kind], dict(base, **ind.evidence())))
    out.extend(diagnoses(h, sig, cfg, state))
    return out

"""Finding kinds and the conditions behind them (all kinds are defined here, once).

Phase findings follow the phase (`lld_decay` while in decay, `lld_collapse` while in collapse). Terminal
flags are the signatures users report at the end of a collapse (docs/science.md section 3); each is a
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
from monitor.detector import stats, types
from monitor.detector.config import DetectorConfig
from monitor.detector.phases import PHASE_SIGNALS, confirmed, streak
from monitor.detector.signals import (
    DEGRADED_EXPLANATION,
    History,
    Indicator,
    RewardRange,
    Signals,
    latest_trailing_mean,
    num,
    off,
    recent_and_baseline,
    reward_decline,
    reward_rising,
    reward_zero,
    trend,
    trend_z,
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

LLD_CRASH: Final = "lld_crash"
"""A sharp crash of `lld/logp_pos` with an entropy or length surge: a warning from the signals every hook
version and imported hook log carries (no anchor set needed), with its caveat."""
REWARD_DECLINE: Final = "reward_decline"
"""The reward lost half of what the run had and stayed there: outcome damage short of the floor."""
ENTROPY_RISE: Final = "entropy_rise"
"""A sustained entropy rise (a slow doubling) while valid actions or clipping degrade."""
NOT_LEARNING: Final = types.NOT_LEARNING
"""A run whose reward never rose above its start and whose outputs are garbled or empty from its start:
nothing was learnt, so nothing collapsed."""

TERMINAL_KINDS: Final = (
    NONFINITE_GRAD,
    NONFINITE_LOSS,
    REWARD_ZERO,
    LENGTH_COLLAPSE,
    GARBLED_OUTPUTS,
    DEAD_RUN,
    INVALID_ACTION_SURGE,
)
"""Critical flags: outcome damage (reward, valid actions, non-finite values) or a terminal signature (dead
run, responses of a few tokens, garbled outputs after a healthy start). Any of them is phase III."""

PATHOLOGY_KINDS: Final = (
    LENGTH_EXPLOSION,
    CLIP_RATIO_SATURATED,
    RATIO_BLOWUP,
    KL_BLOWUP,
    ENTROPY_EXPLOSION,
    ENTROPY_RISE,
    LLD_CRASH,
)
"""Pathologies of the training that do not by themselves hurt the outcome: warnings. With outcome damage
they escalate (the run enters phase III, the collapse finding names them, and a reward drop with one of
them needs only `reward_corroborated_z` noise SDs). Lab late regime: 3 of 6 healthy runs whose reward kept
rising to 0.35-0.5 had length explosions or saturated clipping for hundreds of steps."""

SEVERITY: Final[dict[str, Severity]] = {
    LLD_DECAY: "warning",
    LLD_COLLAPSE: "critical",
    TRAINING_COLLAPSE: "critical",
    **dict.fromkeys(TERMINAL_KINDS, "critical"),
    **dict.fromkeys(PATHOLOGY_KINDS, "warning"),
    ENTROPY_COLLAPSE: "warning",
    ADVANTAGE_COLLAPSE: "info",  # a diagnosis, not news: 11 of 24 lab controls and every live late-lab run
    REWARD_DECLINE: "warning",
    NOT_LEARNING: "warning",
}
ALL_KINDS: Final = tuple(SEVERITY)

COLLAPSE_WARNINGS: Final = (LLD_DECAY, *PATHOLOGY_KINDS, REWARD_DECLINE)
"""Warnings that announce a collapse (with every critical kind: what an early warning may be). Entropy
and advantage collapse are diagnoses of stagnation, and `not_learning` of a run that never started."""


@dataclass(frozen=True)
class Condition:
    kind: str
    message: str
    evidence: dict[str, Any]


def _recent_span(h: History, metric: str, cfg: DetectorConfig, steps: int | None = None) -> tuple[int, int]:
    return h.span(metric, cfg.terminal_window if steps is None else steps, min_points=cfg.min_recent_points)


def median_tail(h: History, metric: str, cfg: DetectorConfig, steps: int | None = None) -> tuple[float, int]:
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
    med, count = median_tail(h, metric, cfg)
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
"""Two different quantities (docs/science.md section 5), each judged against its own baseline."""


def _kl_blowup(h: History, cfg: DetectorConfig, state: DetectorState) -> Indicator:
    """KL to the reference policy (`kl/ref`) or from the old policy (`kl/old`) far above its own baseline:
    the first that fired, else the first with data. Its evidence holds every baseline (`baselines`), so
    that each is held while the finding is active."""
    indicators: list[Indicator] = []
    baselines: dict[str, float | None] = {}
    for metric in KL_METRICS:
        early = _raised_early(state, metric)
        base = float("nan") if early else _held_baseline(h, KL_BLOWUP, metric, cfg, state, absolute=True)
        if not math.isfinite(base):  # no start to compare with yet: the absolute scale of a KL
            baselines[metric] = None
            indicators.append(_early_kl(h, metric, cfg))
            continue
        limit = max(cfg.kl_blowup_abs, cfg.kl_blowup_factor * base)
        baselines[metric] = num(base)
        indicators.append(_median_rule(h, KL_BLOWUP, metric, cfg, limit, "above", base))
    chosen = next((i for i in indicators if i.fired), None)
    if chosen is None:
        chosen = next((i for i in indicators if i.statistic is not None), indicators[0])
    return dataclasses.replace(chosen, detail={**chosen.detail, "baselines": baselines})


def _raised_early(state: DetectorState, metric: str) -> bool:
    """`kl_blowup` is active on `metric` and was raised before `metric` had a baseline: it stays judged on
    the absolute scale (a baseline taken from the blown-up values would absorb the blow-up)."""
    record = state.active.get(KL_BLOWUP)
    if record is None:
        return False
    evidence = record["evidence"]
    baselines = evidence.get("baselines")
    return evidence.get("metric") == metric and isinstance(baselines, dict) and baselines.get(metric) is None


def _early_kl(h: History, metric: str, cfg: DetectorConfig) -> Indicator:
    """|KL| of a run too young for a baseline against `kl_blowup_early_abs`."""
    med, count = median_tail(h, metric, cfg)
    if count < cfg.min_recent_points:
        return off(KL_BLOWUP, metric, "no baseline yet")
    med = abs(med)
    return Indicator(
        KL_BLOWUP,
        med >= cfg.kl_blowup_early_abs,
        metric,
        num(med),
        num(cfg.kl_blowup_early_abs),
        cfg.terminal_window,
        {
            "direction": "above",
            "statistic_is": "median of recent |KL| values, against the absolute scale of a KL (no baseline yet)",
            "recent": num(med),
        },
    )


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


def dead_run(h: History, cfg: DetectorConfig, rng: RewardRange) -> Indicator:
    """No learning signal and nothing to learn from: over the last `dead_window` steps every logged grad
    norm is idle and every logged reward is at the floor of the run's range after the reward had risen
    (without a `reward_floor`: its trailing mean `reward_zero_noise` noise SDs below its best). GRPO cannot leave this state by itself (all-equal rewards give zero advantages)."""
    name = DEAD_RUN
    g = h.get(M.GRAD_NORM)
    if g is None:
        return off(name, M.GRAD_NORM, "metric not logged")
    r_lo, _ = h.span(h.reward, cfg.dead_window, min_points=cfg.reward_zero_points)
    lo, hi = h.span(M.GRAD_NORM, cfg.dead_window, min_points=cfg.dead_min_points)
    lo = min(lo, r_lo)
    grads = g[lo:hi][h.present.get(M.GRAD_NORM, np.ones(g.size, bool))[lo:hi]]
    grads = grads[~np.isnan(grads)]
    if grads.size < cfg.dead_min_points:
        return off(name, M.GRAD_NORM)
    idle = _idle_level(h, cfg, lo)
    all_idle = bool(np.all(np.abs(grads) <= idle))
    x_lo = h.steps[lo]
    rewards = _values_since(h, h.reward, x_lo)
    zero_level = float("nan")
    reward_dead = False
    enough = rewards.size >= cfg.reward_zero_points
    if enough and rng.rose(cfg) and rng.mean_low is not None and rng.mean_peak is not None:
        zero_level = rng.mean_low + cfg.reward_zero_level * (rng.mean_peak - rng.mean_low)
        lost = rng.mean_peak - latest_trailing_mean(h, cfg)
        reward_dead = rng.significant_drop(lost, cfg) and bool(np.all(rewards <= zero_level))
    fired = all_idle and reward_dead
    detail: dict[str, Any] = {
        "statistic_is": "largest grad norm of recent steps",
        "meaning": "no learning signal: grad norm idle and reward at the floor of its range",
        "idle_below": num(idle),
        "recent_rewards_max": num(float(rewards.max())) if rewards.size else None,
        "zero_level": num(zero_level),
        "running_peak": num(rng.mean_peak),
        "running_low": num(rng.mean_low),
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
    med, count = median_tail(h, metric, cfg)
    if not (math.isfinite(base) and base > 0) or count < cfg.min_recent_points:
        return off(name, metric)
    clip, clip_count = median_tail(h, M.RESPONSE_CLIP_RATIO, cfg)
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
        med, count = median_tail(h, metric, cfg)
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
    if h.get(metric) is None:
        return off(name, metric, "metric not logged")
    rec, ref = recent_and_baseline(h, metric, cfg, cfg.entropy_explosion_window)
    record = state.active.get(ENTROPY_EXPLOSION)
    held = record["evidence"].get("baseline") if record is not None else None
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
searches falling with it (outcome damage)."""


def outputs_degraded(h: History, cfg: DetectorConfig, drop: float | None = None) -> list[str]:
    """Valid actions / searches at least `drop` (default `entropy_explosion_validity_drop`) below their
    baseline: what turns an entropy explosion into outcome damage."""
    share = cfg.entropy_explosion_validity_drop if drop is None else drop
    out: list[str] = []
    for metric in VALIDITY_METRICS:
        base = _baseline(h, metric, cfg)
        med, count = median_tail(h, metric, cfg)
        known = math.isfinite(base) and base > 0 and count >= cfg.min_recent_points
        if known and med <= (1 - share) * base:
            out.append(f"{metric} {num(med)} vs baseline {num(base)}")
    return out


def clipping_rising(h: History, cfg: DetectorConfig, rise: float) -> list[str]:
    """The share of clipped responses at least `rise` above its baseline."""
    base = _baseline(h, M.RESPONSE_CLIP_RATIO, cfg)
    med, count = median_tail(h, M.RESPONSE_CLIP_RATIO, cfg)
    if math.isfinite(base) and count >= cfg.min_recent_points and med >= base + rise:
        return [f"{M.RESPONSE_CLIP_RATIO} {num(med)} vs baseline {num(base)}"]
    return []


def entropy_rise(h: History, cfg: DetectorConfig) -> Indicator:
    """A sustained entropy rise: a significant upward Mann-Kendall trend over `entropy_rise_window` steps,
    the recent median `entropy_rise_ratio` x its baseline, and valid actions falling or clipping rising
    with it (a slow doubling: 7B agent, entropy 1.0 -> 2.1 over ~15 steps, invalid actions 4 -> 15 %,
    clipped responses 2 -> 12 %, which the 2x / z >= 4 explosion rule missed)."""
    name = ENTROPY_RISE
    metric = M.ENTROPY_MEAN
    if h.get(metric) is None:
        return off(name, metric, "metric not logged")
    rec, ref = recent_and_baseline(h, metric, cfg, cfg.surge_recent)
    if rec.size < cfg.min_recent_points or ref.size < cfg.min_start_points:
        return off(name, metric)
    base = max(stats.fast_median(ref), 0.0) + cfg.entropy_eps
    ratio = (max(stats.fast_median(rec), 0.0) + cfg.entropy_eps) / base
    detail: dict[str, Any] = {
        "statistic_is": "ratio of the recent median entropy to its baseline",
        "recent": num(stats.fast_median(rec)),
        "baseline": num(base - cfg.entropy_eps),
    }
    if ratio < cfg.entropy_rise_ratio:
        return Indicator(name, False, metric, num(ratio), cfg.entropy_rise_ratio, cfg.surge_recent, detail)
    fit, _ = trend(h, metric, cfg.entropy_rise_window, cfg.min_trend_points)
    z = trend_z(fit) if fit.n >= cfg.min_trend_points else float("nan")
    degraded = outputs_degraded(h, cfg, cfg.entropy_rise_validity_drop) + clipping_rising(
        h, cfg, cfg.entropy_rise_clip_rise
    )
    fired = bool(z >= cfg.decay_z and degraded)
    detail.update(trend_z=num(z), trend_z_threshold=cfg.decay_z, degrading=degraded)
    return Indicator(name, fired, metric, num(ratio), cfg.entropy_rise_ratio, cfg.entropy_rise_window, detail)


def terminal_indicators(
    h: History, cfg: DetectorConfig, state: DetectorState, rng: RewardRange
) -> dict[str, Indicator]:
    """Sustained outcome damage and terminal signatures (critical), a reward decline and the pathologies
    of the training (warnings) at the current point (non-finite values are handled by latches)."""
    out: dict[str, Indicator] = {
        REWARD_ZERO: reward_zero(h, cfg, rng),
        REWARD_DECLINE: reward_decline(h, cfg, rng, REWARD_DECLINE in state.active),
    }
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
    out[DEAD_RUN] = dead_run(h, cfg, rng)
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
    REWARD_ZERO: "Reward collapsed to the floor of its range (at most 20 % of the way from its lowest to its "
    "best level, far below its best in units of its own noise) and stayed there.",
    LENGTH_COLLAPSE: "Response length collapsed far below its baseline.",
    CLIP_RATIO_SATURATED: "Almost every response hits the length limit (clip ratio ~1).",
    RATIO_BLOWUP: "Importance ratios of correct-response tokens left the trust region.",
    KL_BLOWUP: "KL divergence blew up (to the reference policy, kl/ref, or from the old policy, kl/old).",
    GARBLED_OUTPUTS: "A large share of responses is garbled (perplexity >= 50).",
    ENTROPY_COLLAPSE: "Entropy collapse: entropy slid toward 0 while the reward plateaus (exploration is gone).",
    ADVANTAGE_COLLAPSE: "Advantage collapse: most groups have zero reward variance, so most of the batch "
    "gives no policy gradient, and the reward has stopped rising.",
    LLD_CRASH: "The log-likelihood of A > 0 responses (lld/logp_pos) crashed together with an entropy or "
    "length surge: the signature of an LLD collapse. Caveat: lld/logp_pos's population changes every batch, "
    "so this is not proof of phase II; the anchor set (lld/anchor/logp) would tell.",
    REWARD_DECLINE: "The reward lost more than half of what the run had gained (its trailing mean below half "
    "of the way from its lowest to its best level, far below its best in units of its own noise) and stayed "
    "there. The outcome is damaged; if the reward keeps falling this becomes a collapse.",
    ENTROPY_RISE: "Entropy rising steadily (a sustained climb, not a spike) while valid actions fall or "
    "clipping rises.",
    NOT_LEARNING: "Not learning: the reward never rose above where it started and the outputs have been "
    "garbled or empty from the start. Nothing collapsed: the run never learned (check the prompt format, "
    "the tokenizer and the learning rate).",
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
    """Entropy collapse, entropy explosion and rise, the likelihood crash, and advantage collapse
    (warnings)."""
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
    else:
        rise = entropy_rise(h, cfg)
        if _hysteresis(state, ENTROPY_RISE, rise.fired, not rise.fired, cfg.collapse_confirm, h.step):
            out.append(Condition(ENTROPY_RISE, MESSAGES[ENTROPY_RISE], rise.evidence()))
    crash = sig.indicators.get("lld_crash")
    if crash is not None and _hysteresis(
        state, LLD_CRASH, crash.fired, not crash.fired, cfg.collapse_confirm, h.step
    ):
        out.append(Condition(LLD_CRASH, MESSAGES[LLD_CRASH], crash.evidence()))
    advantage = _advantage_collapse(h, cfg, state)
    if advantage is not None:
        out.append(advantage)
    return out


def _advantage_collapse(h: History, cfg: DetectorConfig, state: DetectorState) -> Condition | None:
    """Most groups without reward variance for `plateau_window` steps while the reward does not rise: the
    batch gives no gradient and the run stagnates (real TRL FinQA: 50-70 % for 2,400 flat steps). Severity
    `info`: with small groups on a hard task it is the normal state of a run that still learns (11 of 24
    lab controls, lr 3e-4 / 5e-4 and the late regime, from step 68-110 on, groups of 4 at a success rate of
    0.1-0.3; every live late-lab run at step 86), so it is shown with the run but sends nothing by default. Early in
    a run with a low success rate most groups are all-wrong anyway (every lab run crossed 50 % at step
    18-22 and went on learning): that is not worth a warning."""
    v = h.get(M.ADV_FRAC_ZERO_STD_GROUPS)
    if v is None:
        return None
    tail = h.recent(M.ADV_FRAC_ZERO_STD_GROUPS, cfg.adv_zero_std_window, cfg.min_recent_points)
    if tail.size < cfg.min_recent_points:
        return None
    share = float(tail.sum()) / tail.size
    high = share > cfg.adv_zero_std_enter
    rising = reward_rising(h, cfg, cfg.plateau_window, name="reward_rising_long") if high else None
    plateau = rising is not None and not rising.fired and rising.statistic is not None
    clear = share < cfg.adv_zero_std_exit
    if not _hysteresis(state, ADVANTAGE_COLLAPSE, high and plateau, clear, cfg.plateau_window, h.step):
        return None
    return Condition(
        ADVANTAGE_COLLAPSE,
        MESSAGES[ADVANTAGE_COLLAPSE],
        {
            "metric": M.ADV_FRAC_ZERO_STD_GROUPS,
            "statistic": num(share),
            "threshold": cfg.adv_zero_std_enter,
            "clear_below": cfg.adv_zero_std_exit,
            "window": cfg.adv_zero_std_window,
            "statistic_is": "mean share of groups with zero reward std",
            "reward_trend": rising.evidence() if rising is not None else None,
        },
    )


def conditions(
    h: History,
    sig: Signals | None,
    cfg: DetectorConfig,
    state: DetectorState,
    terminals: dict[str, Indicator],
) -> list[Condition]:
    """Every condition active at the current point except the phase findings (`phase_conditions`):
    non-finite latches, outcome damage and pathologies (`terminals`, from `terminal_indicators`), and the
    diagnoses. A run judged not learning (`state.not_learning_since`) gets `not_learning` in place of its
    garbled-outputs flag."""
    out: list[Condition] = []
    base = _base_evidence(sig)
    for metric, kind in ((M.GRAD_NORM, NONFINITE_GRAD), (M.LOSS, NONFINITE_LOSS)):
        cond = _latch_nonfinite(h, metric, kind, cfg, state)
        if cond is not None:
            out.append(cond)
    for kind, ind in terminals.items():
        if not ind.fired:
            continue
        if kind == GARBLED_OUTPUTS and state.not_learning_since is not None:
            evidence = dict(base, since=state.not_learning_since, reason=ind.evidence())
            out.append(Condition(NOT_LEARNING, MESSAGES[NOT_LEARNING], evidence))
            continue
        out.append(Condition(kind, MESSAGES[kind], dict(base, **ind.evidence())))
    if sig is not None:
        out.extend(diagnoses(h, sig, cfg, state))
    return out


def phase_conditions(sig: Signals | None, state: DetectorState) -> list[Condition]:
    """The finding that mirrors the phase: `lld_decay` in phase II; in phase III `lld_collapse` or
    `training_collapse` (attribution decided when the run entered it, revised when likelihood evidence
    appears later)."""
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
        names = [n for n in PHASE_SIGNALS[COLLAPSE] if sig is not None and sig.fired(n)]
        signals = sig.evidence(names) if sig is not None else {}
        evidence = dict(
            base, phase_since=state.phase_since, reasons=list(state.collapse_reasons), signals=signals
        )
        return [Condition(kind, MESSAGES[kind], evidence)]
    return []

"""Phase of a run from its signals: the candidate of one point, then hysteresis over points.

Candidate of a point (lld-reference.md section 3):
- collapse (phase III): a sharp likelihood drop with a grad-norm / entropy surge or a majority of correct
  responses losing likelihood; or grad-norm AND entropy surges together; or a reward crash.
- decay (phase II, hooks only): a significant likelihood decline (Mann-Kendall / Theil-Sen + CUSUM), or
  the share of correct responses losing likelihood rising while D_traj of correct responses is mostly
  negative. "Grad norm stable" holds by priority (a decline with a surge is a collapse); a rising reward
  is reported as evidence but not required, since the reward saturates during phase II and a trend test
  on it then has no power.
- stagnation (phase I, hooks only): likelihood flat while the reward rises.
- healthy otherwise.
Hysteresis: entering a phase needs k consecutive supporting points (`*_confirm`), leaving stagnation or
decay needs `exit_confirm` points without it, and collapse is sticky until `recovery_confirm` consecutive
recovered points (reward back near its peak, no surge, no sharp drop).
"""

from __future__ import annotations

from typing import Any

from monitor.detector.config import DetectorConfig
from monitor.detector.signals import DEGRADED_EXPLANATION, Signals
from monitor.detector.state import DetectorState
from monitor.detector.types import COLLAPSE, DECAY, HEALTHY, STAGNATION, WARMUP, PhaseChange

SUPPORT = {
    "collapse": (COLLAPSE,),
    "decay": (DECAY, COLLAPSE),
    "stagnation": (STAGNATION,),
    "healthy": (HEALTHY,),
    "calm": (HEALTHY, STAGNATION),
}
"""Counter name -> candidates that count as a confirmation for it."""

PHASE_SIGNALS = {
    COLLAPSE: (
        "reward_crash",
        "grad_surge",
        "entropy_surge",
        "logp_pos_sharp_drop",
        "frac_decreased_majority",
    ),
    DECAY: (
        "logp_pos_decline",
        "frac_decreased_rising",
        "delta_traj_pos_negative",
        "reward_rising",
        "grad_surge",
    ),
    STAGNATION: ("logp_pos_flat", "reward_rising"),
    HEALTHY: ("logp_pos_decline", "logp_pos_flat", "reward_rising", "grad_surge", "entropy_surge"),
}


def candidate(sig: Signals) -> tuple[str, list[str]]:
    """The phase one point points to, and the signals that decided it."""
    f = sig.fired
    if f("reward_crash"):
        reasons = ["reward_crash"] + [n for n in ("grad_surge", "entropy_surge") if f(n)]
        return COLLAPSE, reasons
    if f("grad_surge") and f("entropy_surge"):
        return COLLAPSE, ["grad_surge", "entropy_surge"]
    if sig.hooks:
        if f("logp_pos_sharp_drop"):
            support = [n for n in ("grad_surge", "entropy_surge", "frac_decreased_majority") if f(n)]
            if support:
                return COLLAPSE, ["logp_pos_sharp_drop", *support]
        if f("logp_pos_decline"):
            return DECAY, ["logp_pos_decline"] + [
                n for n in ("frac_decreased_rising", "delta_traj_pos_negative") if f(n)
            ]
        if f("frac_decreased_rising") and f("delta_traj_pos_negative"):
            return DECAY, ["frac_decreased_rising", "delta_traj_pos_negative"]
        if f("logp_pos_flat") and f("reward_rising"):
            return STAGNATION, ["logp_pos_flat", "reward_rising"]
    return HEALTHY, []


def recovered(sig: Signals, state: DetectorState, cfg: DetectorConfig) -> bool:
    """Clear recovery from a collapse: reward back near its peak and no surge / sharp drop."""
    peak = state.reward_peak
    if peak is None or sig.reward_smooth != sig.reward_smooth:
        return False
    floor = cfg.reward_floor
    back = sig.reward_smooth >= floor + cfg.recovery_frac * (peak - floor)
    quiet = not any(
        sig.fired(n) for n in ("grad_surge", "entropy_surge", "logp_pos_sharp_drop", "reward_crash")
    )
    return back and quiet


def _evidence(
    sig: Signals, phase: str, reasons: list[str], confirmations: int, cfg: DetectorConfig, note: str
) -> dict[str, Any]:
    names = PHASE_SIGNALS.get(phase, ())
    ev: dict[str, Any] = {
        "reasons": reasons,
        "confirmations": confirmations,
        "note": note,
        "signals": sig.evidence(tuple(dict.fromkeys([*reasons, *names]))),
        "degraded": not sig.hooks,
    }
    if not sig.hooks:
        ev["explanation"] = DEGRADED_EXPLANATION
    return ev


def advance(state: DetectorState, sig: Signals | None, step: int, cfg: DetectorConfig) -> PhaseChange | None:
    """Update the phase of `state` with the point at `step` (signals None during warm-up)."""
    counters = state.counters
    if state.phase == WARMUP:
        if state.n_points < cfg.warmup_steps or sig is None:
            return None
        return _change(
            state,
            step,
            HEALTHY,
            {
                "reasons": ["warmup_done"],
                "note": f"{cfg.warmup_steps} points seen: baselines established",
                "degraded": not sig.hooks,
                **({"explanation": DEGRADED_EXPLANATION} if not sig.hooks else {}),
            },
        )
    if sig is None:
        return None
    cand, reasons = candidate(sig)
    for name, supporters in SUPPORT.items():
        key = f"phase:{name}"
        counters[key] = counters.get(key, 0) + 1 if cand in supporters else 0
    current = state.phase
    if current == COLLAPSE:
        key = "phase:recovered"
        counters[key] = counters.get(key, 0) + 1 if recovered(sig, state, cfg) else 0
        if counters[key] >= cfg.recovery_confirm:
            ev = _evidence(
                sig, HEALTHY, ["recovered"], counters[key], cfg, "reward back near its peak, no surge"
            )
            return _change(state, step, HEALTHY, ev)
        return None
    if counters["phase:collapse"] >= cfg.collapse_confirm:
        ev = _evidence(sig, COLLAPSE, reasons, counters["phase:collapse"], cfg, "phase III signature")
        return _change(state, step, COLLAPSE, ev)
    if current != DECAY and counters["phase:decay"] >= cfg.decay_confirm:
        decay_reasons = reasons if cand == DECAY else [*reasons, "(collapse signals not yet confirmed)"]
        ev = _evidence(sig, DECAY, decay_reasons, counters["phase:decay"], cfg, "phase II: likelihood decays")
        return _change(state, step, DECAY, ev)
    if current == DECAY:
        if counters["phase:calm"] >= cfg.exit_confirm:
            ev = _evidence(sig, cand, reasons, counters["phase:calm"], cfg, "likelihood decline over")
            return _change(state, step, cand, ev)
        return None
    if current == HEALTHY and counters["phase:stagnation"] >= cfg.stagnation_confirm:
        ev = _evidence(
            sig,
            STAGNATION,
            reasons,
            counters["phase:stagnation"],
            cfg,
            "phase I: likelihood flat, reward rising",
        )
        return _change(state, step, STAGNATION, ev)
    if current == STAGNATION and counters["phase:healthy"] >= cfg.exit_confirm:
        ev = _evidence(sig, HEALTHY, reasons, counters["phase:healthy"], cfg, "stagnation over")
        return _change(state, step, HEALTHY, ev)
    return None


def _change(state: DetectorState, step: int, phase: str, evidence: dict[str, Any]) -> PhaseChange:
    previous = state.phase
    state.phase = phase
    state.phase_since = step
    for key in [k for k in state.counters if k.startswith("phase:")]:
        state.counters[key] = 0
    return PhaseChange(step=step, phase=phase, previous_phase=previous, evidence=evidence)

"""Phase of a run from its signals: the candidate of one point, then hysteresis over points.

Candidate of a point (docs/science.md section 3):
- collapse (phase III): a sharp likelihood drop with a grad-norm / entropy surge or a majority of correct
  responses losing likelihood; or grad-norm AND entropy surges together; or a reward crash.
- decay (phase II, hooks only): likelihood evidence that cannot be population shift: the anchor set's
  log-prob falling, the reward-defined correct population's log-prob declining, or exact per-update deltas
  mostly negative; a decline of `lld/logp_pos` (whose A > 0 population changes every batch) only supports. "Grad norm stable" holds by priority (a decline with a surge is a collapse); a rising reward
  is reported as evidence but not required, since the reward saturates during phase II and a trend test
  on it then has no power.
- stagnation (phase I, hooks only): likelihood flat while the reward rises.
- healthy otherwise.
Any critical finding (dead run, reward at 0, length / KL / ratio blow-ups, ...) moves the run into
collapse at once, attributed to LLD only with likelihood evidence (`attribution`). Hysteresis in steps:
entering a phase needs `*_confirm` steps of consecutive support (`confirmed`), leaving stagnation or decay
`exit_confirm` steps without it, and collapse is sticky until `recovery_confirm` steps of recovery with no
critical finding active (reward back near its peak, no surge, no sharp drop).
"""

from __future__ import annotations

from typing import Any

from monitor.detector.config import DetectorConfig
from monitor.detector.signals import DEGRADED_EXPLANATION, Signals
from monitor.detector.state import DetectorState
from monitor.detector.types import (
    COLLAPSE,
    DECAY,
    HEALTHY,
    NOT_LEARNING,
    STAGNATION,
    WARMUP,
    PhaseChange,
)

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
        "reward_slide",
        "grad_surge",
        "entropy_surge",
        "logp_pos_sharp_drop",
        "anchor_sharp_drop",
        "frac_decreased_majority",
        "anchor_decline",
        "logp_correct_decline",
    ),
    DECAY: (
        "anchor_decline",
        "logp_correct_decline",
        "delta_traj_correct_negative",
        "logp_pos_decline",
        "frac_decreased_rising",
        "delta_traj_pos_negative",
        "reward_rising",
        "grad_surge",
    ),
    STAGNATION: ("logp_pos_flat", "reward_rising"),
    HEALTHY: ("logp_pos_decline", "logp_pos_flat", "reward_rising", "grad_surge", "entropy_surge"),
}

LLD_EVIDENCE = (
    "anchor_decline",
    "logp_correct_decline",
    "delta_traj_correct_negative",
    "anchor_sharp_drop",
    "logp_pos_sharp_drop",
    "frac_decreased_majority",
)
"""Signals that attribute a collapse to lazy likelihood displacement (`lld_collapse`); without any of them
(and without a phase II before it) a collapse is a `training_collapse`."""

LLD_COLLAPSE_KIND = "lld_collapse"
TRAINING_COLLAPSE_KIND = "training_collapse"


def candidate(sig: Signals) -> tuple[str, list[str]]:
    """The phase one point points to, and the signals that decided it. Only outcome damage (a reward
    crash) makes a signal-based collapse; surges and sharp likelihood drops with the outcome intact are
    warnings (`lld_crash`, the pathologies) and escalate when the reward follows."""
    f = sig.fired
    if f("reward_crash") or f("reward_slide"):
        reasons = [n for n in ("reward_crash", "reward_slide") if f(n)] + [
            n for n in ("grad_surge", "entropy_surge", "logp_pos_sharp_drop") if f(n)
        ]
        return COLLAPSE, reasons
    if sig.hooks:
        support = [
            n
            for n in (
                "logp_pos_decline",
                "frac_decreased_rising",
                "delta_traj_pos_negative",
                "anchor_sharp_drop",
                "logp_pos_sharp_drop",
            )
            if f(n)
        ]
        evidence = [
            n for n in ("anchor_decline", "logp_correct_decline", "delta_traj_correct_negative") if f(n)
        ]
        if evidence:
            return DECAY, evidence + support
        if f("frac_decreased_rising") and f("delta_traj_pos_negative"):
            # exact per-update deltas of the same responses: not population shift
            return DECAY, ["frac_decreased_rising", "delta_traj_pos_negative"]
        if f("logp_pos_flat") and f("reward_rising"):
            return STAGNATION, ["logp_pos_flat", "reward_rising"]
    return HEALTHY, []


def recovered(sig: Signals, state: DetectorState, cfg: DetectorConfig) -> bool:
    """Clear recovery from a collapse: the reward's trailing mean back in the upper part of the run's own
    range of trailing means (`recovery_frac` of the way from its low, or a declared floor, to its peak;
    a trailing mean, so that a noisy reward is not held in phase III by its single low steps) and no
    surge or sharp drop."""
    peak = state.reward_mean_peak
    low = cfg.reward_floor if cfg.reward_floor is not None else state.reward_mean_low
    if peak is None or low is None or sig.reward_mean != sig.reward_mean:
        return False
    back = sig.reward_mean >= low + cfg.recovery_frac * (peak - low)
    quiet = not any(
        sig.fired(n)
        for n in ("grad_surge", "entropy_surge", "logp_pos_sharp_drop", "anchor_sharp_drop", "reward_crash")
    )
    return back and quiet


def _evidence(
    sig: Signals | None, phase: str, reasons: list[str], confirmations: int, note: str
) -> dict[str, Any]:
    names = PHASE_SIGNALS.get(phase, ())
    ev: dict[str, Any] = {"reasons": reasons, "confirmations": confirmations, "note": note}
    if sig is not None:
        ev["signals"] = sig.evidence(tuple(dict.fromkeys([*reasons, *names])))
        if not sig.hooks:
            ev["degraded"] = True
            ev["explanation"] = DEGRADED_EXPLANATION
    return ev


def streak(counters: dict[str, int], key: str, holds: bool, step: int) -> tuple[int, int]:
    """(consecutive points on which the condition held, steps they span) of the counter `key` after the
    point at `step` (its first step is kept under `key + "@since"`)."""
    since = f"{key}@since"
    if holds:
        counters[key] = counters.get(key, 0) + 1
        if counters[key] == 1:
            counters[since] = step
        return counters[key], step - counters.get(since, step) + 1
    counters[key] = 0
    counters.pop(since, None)
    return 0, 0


def _streak(state: DetectorState, name: str, holds: bool, step: int) -> tuple[int, int]:
    return streak(state.counters, f"phase:{name}", holds, step)


def confirmed(run: tuple[int, int], need: int) -> bool:
    """`need` steps of support: at least `min(need, 2)` consecutive supporting points spanning `need`
    steps (a run logging every step needs `need` points, one logging every 10 steps two)."""
    points, span = run
    return (points >= min(need, 2) and span >= need) or points >= need


def attribution(sig: Signals | None, state: DetectorState) -> str:
    """`lld_collapse` with likelihood evidence now or a phase II before; else `training_collapse`."""
    if state.phase == DECAY:
        return LLD_COLLAPSE_KIND
    if sig is not None and sig.hooks and any(sig.fired(n) for n in LLD_EVIDENCE):
        return LLD_COLLAPSE_KIND
    return TRAINING_COLLAPSE_KIND


def _revise_attribution(sig: Signals | None, state: DetectorState) -> None:
    """A `training_collapse` becomes an `lld_collapse` when likelihood evidence appears after it began (the
    attribution follows the evidence, never the other way round)."""
    if state.collapse_kind == TRAINING_COLLAPSE_KIND and attribution(sig, state) == LLD_COLLAPSE_KIND:
        state.collapse_kind = LLD_COLLAPSE_KIND
        fired = [n for n in LLD_EVIDENCE if sig is not None and sig.fired(n)]
        state.collapse_reasons = [
            *state.collapse_reasons,
            *(n for n in fired if n not in state.collapse_reasons),
        ]


def advance(
    state: DetectorState,
    sig: Signals | None,
    step: int,
    cfg: DetectorConfig,
    criticals: list[str] | None = None,
    judged: bool = True,
) -> PhaseChange | None:
    """Update the phase of `state` with the point at `step`. `criticals`: the critical findings active at
    this point (any of them puts the run in phase III: the phase never contradicts its alerts); `judged`:
    the warm-up is over (phases I-II and signal-based collapses are judged)."""
    criticals = criticals or []
    if criticals:
        _streak(state, "recovered", False, step)
        if state.phase != COLLAPSE:
            fired = [n for n in PHASE_SIGNALS[COLLAPSE] if sig is not None and sig.fired(n)]
            reasons = [*criticals, *fired]
            state.collapse_kind = attribution(sig, state)
            state.collapse_reasons = reasons
            ev = _evidence(sig, COLLAPSE, reasons, 1, "critical finding: " + ", ".join(criticals))
            return _change(state, step, COLLAPSE, ev)
        _revise_attribution(sig, state)
        return None
    if state.not_learning_since is not None:
        if state.phase == NOT_LEARNING:
            return None
        ev = {"reasons": ["not_learning"], "note": "no reward rise; garbled or empty outputs from the start"}
        return _change(state, step, NOT_LEARNING, ev)
    if state.phase == NOT_LEARNING:
        ev = {"reasons": ["learning"], "note": "the reward rose significantly above its start"}
        return _change(state, step, HEALTHY if judged else WARMUP, ev)
    if state.phase == WARMUP:
        if not judged or sig is None:
            return None
        ev = {"reasons": ["warmup_done"], "note": f"{cfg.warmup_steps} steps seen: baselines established"}
        if not sig.hooks:
            ev.update(degraded=True, explanation=DEGRADED_EXPLANATION)
        return _change(state, step, HEALTHY, ev)
    if sig is None or not judged:
        return None
    cand, reasons = candidate(sig)
    streaks = {name: _streak(state, name, cand in supporters, step) for name, supporters in SUPPORT.items()}
    current = state.phase
    if current == COLLAPSE:
        _revise_attribution(sig, state)
        rec = _streak(state, "recovered", recovered(sig, state, cfg), step)
        if confirmed(rec, cfg.recovery_confirm):
            ev = _evidence(
                sig, HEALTHY, ["recovered"], rec[0], "reward back near its peak, no surge, no critical"
            )
            state.collapse_kind = None
            state.collapse_reasons = []
            return _change(state, step, HEALTHY, ev)
        return None
    if confirmed(streaks["collapse"], cfg.collapse_confirm):
        state.collapse_kind = attribution(sig, state)
        state.collapse_reasons = list(reasons)
        ev = _evidence(sig, COLLAPSE, reasons, streaks["collapse"][0], "phase III signature")
        return _change(state, step, COLLAPSE, ev)
    if current != DECAY and confirmed(streaks["decay"], cfg.decay_confirm):
        decay_reasons = reasons if cand == DECAY else [*reasons, "(collapse signals not yet confirmed)"]
        ev = _evidence(sig, DECAY, decay_reasons, streaks["decay"][0], "phase II: likelihood decays")
        return _change(state, step, DECAY, ev)
    if current == DECAY:
        if confirmed(streaks["calm"], cfg.exit_confirm):
            ev = _evidence(sig, cand, reasons, streaks["calm"][0], "likelihood decline over")
            return _change(state, step, cand, ev)
        return None
    if current == HEALTHY and confirmed(streaks["stagnation"], cfg.stagnation_confirm):
        ev = _evidence(
            sig, STAGNATION, reasons, streaks["stagnation"][0], "phase I: likelihood flat, reward rising"
        )
        return _change(state, step, STAGNATION, ev)
    if current == STAGNATION and confirmed(streaks["healthy"], cfg.exit_confirm):
        ev = _evidence(sig, HEALTHY, reasons, streaks["healthy"][0], "stagnation over")
        return _change(state, step, HEALTHY, ev)
    return None


def _change(state: DetectorState, step: int, phase: str, evidence: dict[str, Any]) -> PhaseChange:
    previous = state.phase
    state.phase = phase
    state.phase_since = step
    for key in [k for k in state.counters if k.startswith("phase:")]:
        del state.counters[key]
    return PhaseChange(step=step, phase=phase, previous_phase=previous, evidence=evidence)

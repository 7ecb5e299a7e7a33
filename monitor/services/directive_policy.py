"""Pure closed-loop rules: when an `auto` run slides into decay (or collapse), switch LLDS on; when it
enters decay, request a checkpoint (`auto`, the last good weights); when it enters collapse, request a
stop (only where the run opted in: stop-on-collapse, whatever its policy).

Manual LLDS wins: once a person set LLDS, the detector never changes it again (a person's checkpoint
or stop request does not count as setting it).
If the run is still in the trigger phase `escalate_after` steps after LLDS was switched on, lambda
is raised once to `lambda_max` (the paper uses 0.2, `DEFAULT_LLDS_LAMBDA`, and 0.3 for the 7B model; 0.01 only delays
collapse, lld-reference.md section 4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from contracts.directive import DEFAULT_LLDS_LAMBDA
from monitor.detector import COLLAPSE, DECAY
from monitor.domain import DirectiveInfo

SLIDING = {"decay": ("decay", "collapse"), "collapse": ("collapse",)}


@dataclass(frozen=True)
class DirectiveRule:
    trigger_phase: str = "decay"
    lam: float = DEFAULT_LLDS_LAMBDA
    lam_max: float = 0.3
    escalate_after: int = 40


@dataclass(frozen=True)
class DirectiveChange:
    llds_enabled: bool
    llds_lambda: float
    reason: str


def decide(
    policy: str, phase: str, step: int, current: DirectiveInfo, rule: DirectiveRule
) -> DirectiveChange | None:
    if policy != "auto" or current.llds_manual:
        return None
    if phase not in SLIDING[rule.trigger_phase]:
        return None
    if not current.llds_enabled:
        return DirectiveChange(
            True, rule.lam, f"auto: run entered {phase} (step {step}); LLDS on, lambda {rule.lam}"
        )
    since = current.step if current.step is not None else step
    if current.llds_lambda < rule.lam_max and step - since >= rule.escalate_after:
        return DirectiveChange(
            True,
            rule.lam_max,
            f"auto: still in {phase} {step - since} steps after LLDS was switched on; lambda {rule.lam_max}",
        )
    return None


CHECKPOINT_PHASE: Final = DECAY
"""Entering it, an `auto` run gets a checkpoint request: the weights before the slide goes further."""
STOP_PHASE: Final = COLLAPSE
"""Entering it, a run that opted in to stop-on-collapse gets a stop request."""


@dataclass(frozen=True)
class LeverChange:
    checkpoint: bool
    stop: bool
    reason: str


def decide_levers(
    policy: str, entered: Sequence[tuple[str, int]], current: DirectiveInfo
) -> LeverChange | None:
    """Checkpoint/stop requests for the phases a run entered, as (phase, step), in step order."""
    checkpoint = stop = False
    reasons = []
    for phase, step in entered:
        if phase == CHECKPOINT_PHASE and policy == "auto" and not checkpoint:
            checkpoint = True
            reasons.append(f"auto: run entered {phase} (step {step}); checkpoint requested")
        if phase == STOP_PHASE and current.stop_on_collapse and not stop:
            stop = True
            reasons.append(f"stop-on-collapse: run entered {phase} (step {step}); stop requested")
    if not (checkpoint or stop):
        return None
    return LeverChange(checkpoint, stop, "; ".join(reasons))

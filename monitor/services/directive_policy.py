"""Pure closed-loop rules: when an `auto` run slides into decay (or collapse), switch LLDS on; when it
enters decay, request a checkpoint (`auto`, the last good weights); when it enters collapse, request a
stop (only where the run opted in: stop-on-collapse, whatever its policy).

Manual LLDS wins: once a person set LLDS, the detector never changes it again (a person's checkpoint
or stop request does not count as setting it).
If the run is still in the trigger phase `escalate_after` steps after LLDS was switched on, lambda
is raised once to `lambda_max` (the paper uses 0.2, `DEFAULT_LLDS_LAMBDA`, and 0.3 for the 7B model; 0.01 only delays
collapse, docs/science.md section 4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from contracts.directive import DEFAULT_LLDS_LAMBDA, LLDSDirective
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
class Cause:
    """One reason for a directive change: the rule that acted, what the run did, what the rule asks."""

    rule: str
    """`auto` or `stop-on-collapse`."""
    event: str
    """What the run did, with its step: "run entered decay (step 96)"."""
    action: str


def explain(causes: Sequence[Cause]) -> str:
    """The reason recorded with a directive version: one clause per event, naming every rule that acted
    on it and everything they asked, so a phase entry that switches LLDS on and requests a checkpoint
    reads as one cause at one step."""
    grouped: dict[str, tuple[list[str], list[str]]] = {}
    for cause in causes:
        rules, actions = grouped.setdefault(cause.event, ([], []))
        if cause.rule not in rules:
            rules.append(cause.rule)
        actions.append(cause.action)
    return "; ".join(
        f"{', '.join(rules)}: {event}; {', '.join(actions)}" for event, (rules, actions) in grouped.items()
    )


def _entered(phase: str, step: int) -> str:
    return f"run entered {phase} (step {step})"


@dataclass(frozen=True)
class DirectiveChange:
    llds: LLDSDirective
    causes: tuple[Cause, ...]

    @property
    def reason(self) -> str:
        return explain(self.causes)


def decide(
    policy: str,
    phase: str,
    step: int,
    current: DirectiveInfo,
    rule: DirectiveRule,
    *,
    phase_since: int | None = None,
) -> DirectiveChange | None:
    """The LLDS change for an `auto` run judged up to `step`, now in `phase`, which it entered at
    `phase_since` (the step the reason names: the detector may confirm a phase a few steps after it
    began; None: `step`)."""
    if policy != "auto" or current.llds_manual:
        return None
    if phase not in SLIDING[rule.trigger_phase]:
        return None
    if not current.llds.enabled:
        entered_at = phase_since if phase_since is not None else step
        cause = Cause("auto", _entered(phase, entered_at), f"LLDS on, lambda {rule.lam}")
        return DirectiveChange(LLDSDirective(True, rule.lam), (cause,))
    since = current.step if current.step is not None else step
    if current.llds.lam < rule.lam_max and step - since >= rule.escalate_after:
        event = f"still in {phase} {step - since} steps after LLDS was switched on"
        return DirectiveChange(
            LLDSDirective(True, rule.lam_max), (Cause("auto", event, f"lambda {rule.lam_max}"),)
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
    causes: tuple[Cause, ...]

    @property
    def reason(self) -> str:
        return explain(self.causes)


def decide_levers(
    policy: str, entered: Sequence[tuple[str, int]], current: DirectiveInfo
) -> LeverChange | None:
    """Checkpoint/stop requests for the phases a run entered, as (phase, step), in step order."""
    checkpoint = stop = False
    causes = []
    for phase, step in entered:
        if phase == CHECKPOINT_PHASE and policy == "auto" and not checkpoint:
            checkpoint = True
            causes.append(Cause("auto", _entered(phase, step), "checkpoint requested"))
        if phase == STOP_PHASE and current.stop_on_collapse and not stop:
            stop = True
            causes.append(Cause("stop-on-collapse", _entered(phase, step), "stop requested"))
    if not (checkpoint or stop):
        return None
    return LeverChange(checkpoint, stop, tuple(causes))

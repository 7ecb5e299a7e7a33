"""Pure closed-loop rules: when an `auto` (or `heal`) run slides into decay (or collapse), switch LLDS
on; when it enters decay, request a checkpoint (the last good weights); when it enters collapse, request a
stop (only where the run opted in: stop-on-collapse, whatever its policy).

`heal` is `auto` plus a rollback when the run enters collapse: restore the checkpoint taken when it
entered decay (its latest decay entry; without one, the newest checkpoint before the collapse), with LLDS on (lambda raised to `lambda_max` if it was on already) and the
learning rate times `heal_lr_scale`. At most `max_rollbacks` per run; a collapse after the last one
requests a stop instead, and the service raises `ALERT_HEAL_EXHAUSTED` saying why.

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
CLOSED_LOOP: Final = ("auto", "heal")
"""Policies under which the detector switches LLDS on and requests checkpoints."""
HEAL: Final = "heal"


@dataclass(frozen=True)
class DirectiveRule:
    trigger_phase: str = "decay"
    lam: float = DEFAULT_LLDS_LAMBDA
    lam_max: float = 0.3
    escalate_after: int = 40
    max_rollbacks: int = 2
    """Rollbacks `heal` requests per run before it gives up (requests a stop): a second collapse after
    LLDS at `lam_max` and a halved learning rate says the setting, not the luck, is wrong."""
    heal_lr_scale: float = 0.5
    """Factor on the learning rate at each `heal` rollback (cumulative). Provenance: the lab's tiny
    model is healthy at lr 3e-4 and collapses at 7e-4 (late) and 1e-3 (early) (`lldmon_lab.lab.grid`
    PRESETS); halving moves both collapsing settings to within 1.7x of the healthy one."""


@dataclass(frozen=True)
class Cause:
    """One reason for a directive change: the rule that acted, what the run did, what the rule asks."""

    rule: str
    """`auto`, `heal` or `stop-on-collapse`."""
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
    if policy not in CLOSED_LOOP or current.llds_manual:
        return None
    if phase not in SLIDING[rule.trigger_phase]:
        return None
    if not current.llds.enabled:
        entered_at = phase_since if phase_since is not None else step
        cause = Cause(policy, _entered(phase, entered_at), f"LLDS on, lambda {rule.lam}")
        return DirectiveChange(LLDSDirective(True, rule.lam), (cause,))
    since = current.step if current.step is not None else step
    if current.llds.lam < rule.lam_max and step - since >= rule.escalate_after:
        event = f"still in {phase} {step - since} steps after LLDS was switched on"
        return DirectiveChange(
            LLDSDirective(True, rule.lam_max), (Cause(policy, event, f"lambda {rule.lam_max}"),)
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
    rollback_to: int | None = None
    """A rollback request to this step (None: none)."""
    lr_scale: float | None = None
    """The learning-rate factor that goes with the rollback (None: unchanged)."""
    llds: LLDSDirective | None = None
    """LLDS as the rollback sets it (None: unchanged)."""
    heal_exhausted: bool = False
    """`heal` wanted a rollback but had used them all (the stop request says so)."""

    @property
    def reason(self) -> str:
        return explain(self.causes)


@dataclass(frozen=True)
class HealContext:
    """What `heal` needs to know of a run besides its directive: rollbacks requested so far, the step
    it last entered decay in its phase history (None: it did not), and the earliest step a rollback of
    it restored (None: none yet)."""

    rollbacks_used: int = 0
    decay_entry: int | None = None
    restored: int | None = None


def decide_levers(
    policy: str,
    entered: Sequence[tuple[str, int]],
    current: DirectiveInfo,
    rule: DirectiveRule | None = None,
    heal: HealContext | None = None,
) -> LeverChange | None:
    """Checkpoint/rollback/stop requests for the phases a run entered, as (phase, step), in step order."""
    rule = rule or DirectiveRule()
    heal = heal or HealContext()
    checkpoint = stop = exhausted = False
    rollback_to: int | None = None
    causes = []
    for phase, step in entered:
        if phase == CHECKPOINT_PHASE and policy in CLOSED_LOOP and not checkpoint:
            checkpoint = True
            causes.append(Cause(policy, _entered(phase, step), "checkpoint requested"))
        if phase == STOP_PHASE and policy == HEAL and rollback_to is None and not stop:
            target = (
                heal.decay_entry if heal.decay_entry is not None and heal.decay_entry < step else step - 1
            )
            if heal.restored is not None:
                # the checkpoint restored last time led back into this collapse: restoring it again
                # would replay it, so a further rollback goes to an earlier one
                target = min(target, heal.restored - 1)
            if heal.rollbacks_used >= rule.max_rollbacks or target < 0:
                stop = exhausted = True
                why = (
                    f"{heal.rollbacks_used} rollbacks used (limit {rule.max_rollbacks})"
                    if target >= 0
                    else "no step before the collapse to roll back to"
                )
                causes.append(Cause(HEAL, _entered(phase, step), f"stop requested: {why}"))
            else:
                rollback_to = target
                causes.append(
                    Cause(
                        HEAL,
                        _entered(phase, step),
                        f"rollback to step {target} requested, learning rate x{rule.heal_lr_scale:g}",
                    )
                )
        if phase == STOP_PHASE and current.stop_on_collapse and not stop and rollback_to is None:
            stop = True
            causes.append(Cause("stop-on-collapse", _entered(phase, step), "stop requested"))
    if not (checkpoint or stop or rollback_to is not None):
        return None
    if rollback_to is None:
        return LeverChange(checkpoint, stop, tuple(causes), heal_exhausted=exhausted)
    lam = rule.lam_max if current.llds.enabled and not current.llds_manual else rule.lam
    llds = None if current.llds_manual else LLDSDirective(True, max(lam, current.llds.lam))
    return LeverChange(
        checkpoint,
        stop,
        tuple(causes),
        rollback_to=rollback_to,
        lr_scale=current.lr_scale * rule.heal_lr_scale,
        llds=llds,
    )

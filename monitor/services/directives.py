"""Every change to a run's directive goes through here: manual (a person switches LLDS, requests a
checkpoint or a stop, opts in to stop-on-collapse) and automatic (the detector's closed loop: LLDS and a
checkpoint when an `auto` run enters decay, a stop on collapse where the run opted in). The rules are
pure (`directive_policy`); this service reads the directive in force and records each change as a new
version, so the API, the dashboard, the CLI and the detector cannot disagree on how."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection

from contracts.directive import SOURCE_DETECTOR, SOURCE_MANUAL, directive_problem
from monitor.config import Settings
from monitor.domain import DirectiveInfo, Principal
from monitor.errors import InvalidInput
from monitor.services.directive_policy import (
    HEAL,
    STOP_PHASE,
    DirectiveRule,
    HealContext,
    decide,
    decide_levers,
    explain,
)
from monitor.services.runs import RunService
from monitor.store import Database
from monitor.store import events as event_store


def rule_from(settings: Settings) -> DirectiveRule:
    """The closed-loop LLDS rule the settings configure."""
    return DirectiveRule(
        trigger_phase=settings.llds_trigger_phase,
        lam=settings.llds_lambda,
        lam_max=settings.llds_lambda_max,
        escalate_after=settings.llds_escalate_after_steps,
        max_rollbacks=settings.heal_max_rollbacks,
        heal_lr_scale=settings.heal_lr_scale,
    )


def current_scale(conn: Connection, run_id: int) -> float:
    """The learning-rate factor in force (a new one multiplies it: factors are cumulative)."""
    return event_store.current_directive(conn, run_id).lr_scale


@dataclass(frozen=True)
class AutoOutcome:
    """What the closed loop left in force after a detector pass, and why `heal` gave up (None: it did
    not), which the detector raises as an alert."""

    directive: DirectiveInfo
    heal_exhausted: str | None = None


class DirectiveService:
    def __init__(self, db: Database, runs: RunService, rule: DirectiveRule | None = None) -> None:
        self.db = db
        self.runs = runs
        self.rule = rule or DirectiveRule()

    def current(self, principal: Principal, run_id: int) -> DirectiveInfo:
        self.runs.get(principal, run_id)
        with self.db.read() as conn:
            return event_store.current_directive(conn, run_id)

    def history(self, principal: Principal, run_id: int) -> list[DirectiveInfo]:
        self.runs.get(principal, run_id)
        with self.db.read() as conn:
            return event_store.directive_history(conn, run_id)

    def set_manual(
        self,
        principal: Principal,
        run_id: int,
        *,
        llds_enabled: bool | None = None,
        lam: float | None = None,
        checkpoint: bool = False,
        stop: bool | None = None,
        stop_on_collapse: bool | None = None,
        reason: str = "",
        rollback_to: int | None = None,
        lr_scale: float | None = None,
    ) -> DirectiveInfo:
        """Manual change by a user, recorded as a new directive version with its reason: switch LLDS,
        request a checkpoint (`checkpoint=True`) or a rollback to `rollback_to` (learning rate times
        `lr_scale`, None: unchanged), request or withdraw a stop, opt in or out of stop-on-collapse.
        What is left None keeps its value."""
        problem = directive_problem(lam, reason)
        if problem is not None:
            raise InvalidInput(problem[1], field=problem[0])
        if rollback_to is not None and rollback_to < 0:
            raise InvalidInput(f"the rollback step must be >= 0, got {rollback_to}", field="rollback")
        if lr_scale is not None and not (
            rollback_to is not None and math.isfinite(lr_scale) and 0 < lr_scale <= 1
        ):
            raise InvalidInput(
                f"lr_scale goes with a rollback and must be in (0, 1], got {lr_scale!r}", field="lr_scale"
            )
        sets_llds = llds_enabled is not None or lam is not None
        rolls_back = rollback_to is not None
        if not (sets_llds or checkpoint or rolls_back or stop is not None or stop_on_collapse is not None):
            raise InvalidInput("nothing to change: give llds, checkpoint, rollback, stop or stop_on_collapse")
        run = self.runs.get(principal, run_id)
        reason = reason or "manual " + ", ".join(
            what
            for what, given in (
                ("override", sets_llds),
                ("checkpoint request", checkpoint),
                (f"rollback to step {rollback_to}", rolls_back),
                ("stop request" if stop else "stop withdrawn", stop is not None),
                (f"stop-on-collapse {'on' if stop_on_collapse else 'off'}", stop_on_collapse is not None),
            )
            if given
        )
        with self.db.write() as conn:
            event_store.append_directive(
                conn,
                run_id,
                llds_enabled=llds_enabled,
                lam=lam,
                checkpoint=checkpoint,
                stop=stop,
                stop_reason=reason if stop else "",
                stop_on_collapse=stop_on_collapse,
                rollback_to=rollback_to,
                lr_scale=None if lr_scale is None else current_scale(conn, run_id) * lr_scale,
                reason=reason,
                source=SOURCE_MANUAL,
                step=run.last_step,
            )
            return event_store.current_directive(conn, run_id)

    @staticmethod
    def in_force(conn: Connection, run_id: int) -> DirectiveInfo:
        """The directive in force, read in the caller's transaction."""
        return event_store.current_directive(conn, run_id)

    def apply_auto(
        self,
        conn: Connection,
        run_id: int,
        policy: str,
        phase: str,
        step: int,
        entered: Sequence[tuple[str, int]],
        *,
        phase_since: int | None = None,
    ) -> AutoOutcome:
        """The closed loop, in the detector's transaction (the run row locked): after judging up to
        `step`, now in `phase` (since step `phase_since`), having entered the phases `entered` as
        (phase, step), record what the rules change (LLDS, checkpoint, rollback, stop) as one version,
        with one reason; returns the directive in force."""
        directive = event_store.current_directive(conn, run_id)
        change = decide(policy, phase, step, directive, self.rule, phase_since=phase_since)
        heal = None
        if policy == HEAL and any(p == STOP_PHASE for p, _ in entered):
            heal = HealContext(
                rollbacks_used=event_store.rollback_requests(conn, run_id),
                decay_entry=event_store.latest_entry(conn, run_id, "decay"),
                restored=event_store.earliest_restored(conn, run_id),
            )
        levers = decide_levers(policy, entered, directive, self.rule, heal)
        if change is None and levers is None:
            return AutoOutcome(directive)
        llds = levers.llds if levers is not None and levers.llds is not None else None
        if llds is None and change is not None:
            llds = change.llds
        event_store.append_directive(
            conn,
            run_id,
            llds_enabled=llds.enabled if llds is not None else None,
            lam=llds.lam if llds is not None else None,
            checkpoint=levers is not None and levers.checkpoint,
            stop=True if levers is not None and levers.stop else None,
            stop_reason=levers.reason if levers is not None and levers.stop else "",
            rollback_to=levers.rollback_to if levers is not None else None,
            lr_scale=levers.lr_scale if levers is not None else None,
            reason=explain([cause for c in (change, levers) if c is not None for cause in c.causes]),
            source=SOURCE_DETECTOR,
            step=step,
        )
        exhausted = levers.reason if levers is not None and levers.heal_exhausted else None
        return AutoOutcome(event_store.current_directive(conn, run_id), exhausted)

"""Every change to a run's directive goes through here: manual (a person switches LLDS, requests a
checkpoint or a stop, opts in to stop-on-collapse) and automatic (the detector's closed loop: LLDS and a
checkpoint when an `auto` run enters decay, a stop on collapse where the run opted in). The rules are
pure (`directive_policy`); this service reads the directive in force and records each change as a new
version, so the API, the dashboard, the CLI and the detector cannot disagree on how."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection

from contracts.directive import SOURCE_DETECTOR, SOURCE_MANUAL, directive_problem
from monitor.config import Settings
from monitor.domain import DirectiveInfo, Principal
from monitor.errors import InvalidInput
from monitor.services.directive_policy import DirectiveRule, decide, decide_levers, explain
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
    )


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
    ) -> DirectiveInfo:
        """Manual change by a user, recorded as a new directive version with its reason: switch LLDS,
        request a checkpoint (`checkpoint=True`), request or withdraw a stop, opt in or out of
        stop-on-collapse. What is left None keeps its value."""
        problem = directive_problem(lam, reason)
        if problem is not None:
            raise InvalidInput(problem[1], field=problem[0])
        sets_llds = llds_enabled is not None or lam is not None
        if not (sets_llds or checkpoint or stop is not None or stop_on_collapse is not None):
            raise InvalidInput("nothing to change: give llds, checkpoint, stop or stop_on_collapse")
        run = self.runs.get(principal, run_id)
        reason = reason or "manual " + ", ".join(
            what
            for what, given in (
                ("override", sets_llds),
                ("checkpoint request", checkpoint),
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
    ) -> DirectiveInfo:
        """The closed loop, in the detector's transaction (the run row locked): after judging up to
        `step`, now in `phase` (since step `phase_since`), having entered the phases `entered` as
        (phase, step), record what the rules change (LLDS, checkpoint, stop) as one version, with one
        reason; returns the directive in force."""
        directive = event_store.current_directive(conn, run_id)
        change = decide(policy, phase, step, directive, self.rule, phase_since=phase_since)
        levers = decide_levers(policy, entered, directive)
        if change is None and levers is None:
            return directive
        event_store.append_directive(
            conn,
            run_id,
            llds_enabled=change.llds.enabled if change is not None else None,
            lam=change.llds.lam if change is not None else None,
            checkpoint=levers is not None and levers.checkpoint,
            stop=True if levers is not None and levers.stop else None,
            stop_reason=levers.reason if levers is not None and levers.stop else "",
            reason=explain([cause for c in (change, levers) if c is not None for cause in c.causes]),
            source=SOURCE_DETECTOR,
            step=step,
        )
        return event_store.current_directive(conn, run_id)

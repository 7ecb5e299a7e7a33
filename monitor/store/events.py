"""Directives, phase events, rollbacks and alerts of a run."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, delete, false, func, select, true, update

from contracts.directive import DEFAULT_LLDS_LAMBDA, SOURCE_MANUAL, LLDSDirective
from monitor.db.models import Directive, PhaseEvent, Rollback, Run
from monitor.domain import DirectiveInfo, PhaseEventInfo, RollbackInfo
from monitor.store._sql import table_of

directives = table_of(Directive)
phase_events = table_of(PhaseEvent)
rollbacks = table_of(Rollback)
runs = table_of(Run)


def _info(row: Any, applied_version: int = 0, applied_step: int | None = None) -> DirectiveInfo:
    return DirectiveInfo(
        llds=LLDSDirective(enabled=row.llds_enabled, lam=row.llds_lam),
        version=row.version,
        reason=row.reason,
        source=row.source,
        step=row.step,
        updated_at=row.updated_at,
        checkpoint=row.checkpoint,
        stop=row.stop,
        stop_reason=row.stop_reason,
        stop_on_collapse=row.stop_on_collapse,
        rollback=row.rollback,
        rollback_to=row.rollback_to,
        lr_scale=row.lr_scale,
        llds_manual=row.llds_manual,
        applied_version=applied_version,
        applied_step=applied_step,
    )


def applied_version(conn: Connection, run_id: int) -> int:
    """The highest directive version the run's trainer acknowledged (0: none)."""
    value = conn.execute(
        select(func.max(directives.c.version)).where(
            directives.c.run_id == run_id, directives.c.applied_step.is_not(None)
        )
    ).scalar_one()
    return 0 if value is None else int(value)


def latest_version(conn: Connection, run_id: int) -> int:
    """The run's current directive version (0: none yet)."""
    value = conn.execute(
        select(func.max(directives.c.version)).where(directives.c.run_id == run_id)
    ).scalar_one()
    return 0 if value is None else int(value)


def acknowledge(conn: Connection, run_id: int, acknowledgements: Iterable[tuple[int, int]]) -> None:
    """Record (step, version) acknowledgements, in the order given: each marks every version up to
    its own that no earlier one covered as acknowledged at its step. The caller decides which values
    are acknowledgements (`IngestService`); versions that do not exist are simply not there to mark."""
    for step, version in acknowledgements:
        conn.execute(
            update(directives)
            .where(
                directives.c.run_id == run_id,
                directives.c.version <= version,
                directives.c.applied_step.is_(None),
            )
            .values(applied_step=step)
        )


def current_directive(conn: Connection, run_id: int) -> DirectiveInfo:
    row = conn.execute(
        select(directives).where(directives.c.run_id == run_id).order_by(directives.c.version.desc()).limit(1)
    ).one_or_none()
    if row is None:
        return DirectiveInfo()
    return _info(row, applied_version(conn, run_id))


def append_directive(
    conn: Connection,
    run_id: int,
    *,
    reason: str,
    source: str,
    step: int | None,
    llds_enabled: bool | None = None,
    lam: float | None = None,
    checkpoint: bool = False,
    stop: bool | None = None,
    stop_reason: str = "",
    stop_on_collapse: bool | None = None,
    rollback_to: int | None = None,
    lr_scale: float | None = None,
) -> int:
    """Append the next version of the run's directive and return it.

    Fields left None keep the previous version's values (the defaults on a run's first version);
    `checkpoint=True`, `stop=True` and a `rollback_to` make this version the id of a new request,
    `stop=False` withdraws a standing stop. A manual version that sets LLDS marks LLDS as a person's from then on.

    Concurrent writers (threads, worker processes, two servers on one SQLite file) must queue, not
    collide on (run_id, version): on PostgreSQL the run's row lock (FOR UPDATE, also what the detector
    holds) serialises them and the next statement sees the committed maximum; on SQLite the version
    and the carried values are read inside the INSERT itself, which holds the database's single write lock.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(select(runs.c.id).where(runs.c.id == run_id).with_for_update())
    next_version = (
        select(func.coalesce(func.max(directives.c.version), 0) + 1)
        .where(directives.c.run_id == run_id)
        .scalar_subquery()
    )

    def previous(column: str, default: Any) -> Any:
        latest = (
            select(directives.c[column])
            .where(directives.c.run_id == run_id)
            .order_by(directives.c.version.desc())
            .limit(1)
            .scalar_subquery()
        )
        return func.coalesce(latest, default)

    def kept(column: str, value: Any, default: Any) -> Any:
        return previous(column, default) if value is None else value

    sets_llds = llds_enabled is not None or lam is not None
    result = conn.execute(
        directives.insert()
        .values(
            run_id=run_id,
            version=next_version,
            llds_enabled=kept("llds_enabled", llds_enabled, false()),
            llds_lam=kept("llds_lam", lam, DEFAULT_LLDS_LAMBDA),
            reason=reason,
            source=source,
            step=step,
            checkpoint=next_version if checkpoint else previous("checkpoint", 0),
            stop=(next_version if stop else 0) if stop is not None else previous("stop", 0),
            stop_reason=stop_reason if stop else ("" if stop is not None else previous("stop_reason", "")),
            stop_on_collapse=kept("stop_on_collapse", stop_on_collapse, false()),
            rollback=next_version if rollback_to is not None else previous("rollback", 0),
            rollback_to=rollback_to if rollback_to is not None else previous("rollback_to", None),
            lr_scale=kept("lr_scale", lr_scale, 1.0),
            llds_manual=true() if sets_llds and source == SOURCE_MANUAL else previous("llds_manual", false()),
        )
        .returning(directives.c.version)
    )
    return int(result.scalar_one())


def directive_history(conn: Connection, run_id: int) -> list[DirectiveInfo]:
    """Every version, oldest first, each with the first step at which the trainer acknowledged it."""
    rows = conn.execute(
        select(directives).where(directives.c.run_id == run_id).order_by(directives.c.version)
    ).all()
    highest = max((r.version for r in rows if r.applied_step is not None), default=0)
    return [_info(r, highest, r.applied_step) for r in rows]


def list_phase_events(conn: Connection, run_id: int) -> list[PhaseEventInfo]:
    rows = conn.execute(
        select(phase_events)
        .where(phase_events.c.run_id == run_id)
        .order_by(phase_events.c.step, phase_events.c.id)
    ).all()
    return [
        PhaseEventInfo(r.id, r.run_id, r.step, r.phase, r.previous_phase, r.evidence or {}, r.created_at)
        for r in rows
    ]


def insert_phase_event(
    conn: Connection, run_id: int, step: int, phase: str, previous_phase: str | None, evidence: dict[str, Any]
) -> None:
    conn.execute(
        phase_events.insert().values(
            run_id=run_id, step=step, phase=phase, previous_phase=previous_phase, evidence=evidence
        )
    )


def rollback_requests(conn: Connection, run_id: int) -> int:
    """How many versions of the run's directive requested a rollback."""
    value = conn.execute(
        select(func.count())
        .select_from(directives)
        .where(directives.c.run_id == run_id, directives.c.rollback == directives.c.version)
    ).scalar_one()
    return int(value)


def latest_entry(conn: Connection, run_id: int, phase: str) -> int | None:
    """The step of the latest phase event into `phase` in the run's phase history (the phase events of
    steps a rollback undid are no longer in it); None: none."""
    value = conn.execute(
        select(func.max(phase_events.c.step)).where(
            phase_events.c.run_id == run_id, phase_events.c.phase == phase
        )
    ).scalar_one()
    return None if value is None else int(value)


def earliest_restored(conn: Connection, run_id: int) -> int | None:
    """The earliest step a rollback of the run restored (None: no rollback yet)."""
    value = conn.execute(
        select(func.min(rollbacks.c.to_step)).where(rollbacks.c.run_id == run_id)
    ).scalar_one()
    return None if value is None else int(value)


def record_rollback(conn: Connection, run_id: int, from_step: int, to_step: int, version: int) -> None:
    """Record a rollback from `from_step` to the checkpoint of `to_step`: the phase events after
    `to_step` leave the run's phase history and are kept with the rollback (`undone_phases`)."""
    undone = conn.execute(
        select(phase_events)
        .where(phase_events.c.run_id == run_id, phase_events.c.step > to_step)
        .order_by(phase_events.c.step, phase_events.c.id)
    ).all()
    conn.execute(delete(phase_events).where(phase_events.c.run_id == run_id, phase_events.c.step > to_step))
    conn.execute(
        rollbacks.insert().values(
            run_id=run_id,
            from_step=from_step,
            to_step=to_step,
            version=version,
            undone_phases=[
                {"step": r.step, "phase": r.phase, "previous_phase": r.previous_phase} for r in undone
            ],
        )
    )


def list_rollbacks(conn: Connection, run_id: int) -> list[RollbackInfo]:
    rows = conn.execute(select(rollbacks).where(rollbacks.c.run_id == run_id).order_by(rollbacks.c.id)).all()
    return [
        RollbackInfo(
            r.id, r.run_id, r.from_step, r.to_step, r.version, list(r.undone_phases or []), r.created_at
        )
        for r in rows
    ]

"""Directives, phase events and alerts of a run."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func, select

from monitor.db.models import Directive, PhaseEvent, Run
from monitor.domain import DirectiveInfo, PhaseEventInfo
from monitor.store._sql import table_of

directives = table_of(Directive)
phase_events = table_of(PhaseEvent)
runs = table_of(Run)


def current_directive(conn: Connection, run_id: int) -> DirectiveInfo:
    row = conn.execute(
        select(directives).where(directives.c.run_id == run_id).order_by(directives.c.version.desc()).limit(1)
    ).one_or_none()
    if row is None:
        return DirectiveInfo()
    return DirectiveInfo(
        version=row.version,
        llds_enabled=row.llds_enabled,
        llds_lambda=row.llds_lambda,
        reason=row.reason,
        source=row.source,
        step=row.step,
        created_at=row.created_at,
    )


def append_directive(
    conn: Connection,
    run_id: int,
    *,
    llds_enabled: bool,
    llds_lambda: float,
    reason: str,
    source: str,
    step: int | None,
) -> int:
    """Append the next version of the run's directive and return it.

    Concurrent writers (threads, worker processes, two servers on one SQLite file) must queue, not
    collide on (run_id, version): on PostgreSQL the run's row lock (FOR UPDATE, also what the detector
    holds) serialises them and the next statement sees the committed maximum; on SQLite the version
    is read inside the INSERT itself, which holds the database's single write lock.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(select(runs.c.id).where(runs.c.id == run_id).with_for_update())
    next_version = (
        select(func.coalesce(func.max(directives.c.version), 0) + 1)
        .where(directives.c.run_id == run_id)
        .scalar_subquery()
    )
    result = conn.execute(
        directives.insert()
        .values(
            run_id=run_id,
            version=next_version,
            llds_enabled=llds_enabled,
            llds_lambda=llds_lambda,
            reason=reason,
            source=source,
            step=step,
        )
        .returning(directives.c.version)
    )
    return int(result.scalar_one())


def directive_history(conn: Connection, run_id: int) -> list[DirectiveInfo]:
    rows = conn.execute(
        select(directives).where(directives.c.run_id == run_id).order_by(directives.c.version)
    ).all()
    return [
        DirectiveInfo(r.version, r.llds_enabled, r.llds_lambda, r.reason, r.source, r.step, r.created_at)
        for r in rows
    ]


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

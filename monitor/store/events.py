"""Directives, phase events and alerts of a run."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func, select

from monitor.db.models import Directive, PhaseEvent
from monitor.domain import DirectiveInfo, PhaseEventInfo
from monitor.store._sql import table_of

directives = table_of(Directive)
phase_events = table_of(PhaseEvent)


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
) -> None:
    """Append the next version; the (run_id, version) key makes a concurrent writer fail, not interleave."""
    latest = conn.execute(
        select(func.max(directives.c.version)).where(directives.c.run_id == run_id)
    ).scalar_one_or_none()
    conn.execute(
        directives.insert().values(
            run_id=run_id,
            version=(latest or 0) + 1,
            llds_enabled=llds_enabled,
            llds_lambda=llds_lambda,
            reason=reason,
            source=source,
            step=step,
        )
    )


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

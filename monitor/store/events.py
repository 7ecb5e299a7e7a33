"""Directives, phase events and alerts of a run."""

from __future__ import annotations

from sqlalchemy import Connection, func, select

from monitor.db.models import Alert, Directive, PhaseEvent
from monitor.domain import AlertInfo, DirectiveInfo, PhaseEventInfo
from monitor.store._sql import table_of

directives = table_of(Directive)
phase_events = table_of(PhaseEvent)
alerts = table_of(Alert)


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


def list_alerts(conn: Connection, run_id: int, status: str | None = None) -> list[AlertInfo]:
    query = select(alerts).where(alerts.c.run_id == run_id)
    if status is not None:
        query = query.where(alerts.c.status == status)
    rows = conn.execute(query.order_by(alerts.c.id)).all()
    return [
        AlertInfo(
            id=r.id,
            run_id=r.run_id,
            kind=r.kind,
            severity=r.severity,
            status=r.status,
            message=r.message,
            evidence=r.evidence or {},
            first_step=r.first_step,
            last_step=r.last_step,
            created_at=r.created_at,
            updated_at=r.updated_at,
            acknowledged_at=r.acknowledged_at,
            resolved_at=r.resolved_at,
        )
        for r in rows
    ]

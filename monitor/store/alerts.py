"""Alert rows: open, refresh, resolve, acknowledge, list."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, func, select, update

from monitor.alerting.rules import ActiveCondition, OpenAlert
from monitor.db.models import Alert
from monitor.domain import AlertInfo
from monitor.store._sql import table_of

alerts = table_of(Alert)
_UNRESOLVED = ("open", "acknowledged")


def open_alerts(conn: Connection, run_id: int) -> list[OpenAlert]:
    rows = conn.execute(
        select(
            alerts.c.id, alerts.c.kind, alerts.c.severity, alerts.c.status, alerts.c.last_notified_at
        ).where(alerts.c.run_id == run_id, alerts.c.status.in_(_UNRESOLVED))
    ).all()
    return [OpenAlert(int(r.id), r.kind, r.severity, r.status, r.last_notified_at) for r in rows]


def create(conn: Connection, run_id: int, c: ActiveCondition, now: datetime) -> int:
    result = conn.execute(
        alerts.insert()
        .values(
            run_id=run_id,
            kind=c.kind,
            severity=c.severity,
            status="open",
            message=c.message,
            evidence=c.evidence,
            first_step=c.step,
            last_step=c.step,
            created_at=now,
            updated_at=now,
            last_notified_at=now,
            notify_count=1,
        )
        .returning(alerts.c.id)
    )
    return int(result.scalar_one())


def refresh(conn: Connection, alert_id: int, c: ActiveCondition, now: datetime, notified: bool) -> None:
    values: dict[str, Any] = {
        "severity": c.severity,
        "message": c.message,
        "evidence": c.evidence,
        "last_step": c.step,
        "updated_at": now,
    }
    if notified:
        values["last_notified_at"] = now
        values["notify_count"] = alerts.c.notify_count + 1
    conn.execute(update(alerts).where(alerts.c.id == alert_id).values(**values))


def resolve(conn: Connection, alert_id: int, step: int, now: datetime) -> None:
    conn.execute(
        update(alerts)
        .where(alerts.c.id == alert_id)
        .values(
            status="resolved",
            resolved_at=now,
            updated_at=now,
            last_step=func.max(alerts.c.last_step, step)
            if conn.dialect.name == "sqlite"
            else func.greatest(alerts.c.last_step, step),
        )
    )


def acknowledge(conn: Connection, run_id: int, alert_id: int) -> bool:
    result = conn.execute(
        update(alerts)
        .where(alerts.c.id == alert_id, alerts.c.run_id == run_id, alerts.c.status == "open")
        .values(status="acknowledged", acknowledged_at=func.now(), updated_at=func.now())
        .returning(alerts.c.id)
    )
    return result.first() is not None


def get(conn: Connection, alert_id: int) -> AlertInfo | None:
    row = conn.execute(select(alerts).where(alerts.c.id == alert_id)).one_or_none()
    return None if row is None else _to_info(row)


def list_alerts(conn: Connection, run_id: int, status: str | None = None) -> list[AlertInfo]:
    query = select(alerts).where(alerts.c.run_id == run_id)
    if status is not None:
        query = query.where(alerts.c.status == status)
    return [_to_info(r) for r in conn.execute(query.order_by(alerts.c.id)).all()]


def unresolved_counts(conn: Connection, run_ids: list[int]) -> dict[int, int]:
    """Open or acknowledged alerts per run, for many runs in one query (runs without any are absent)."""
    if not run_ids:
        return {}
    rows = conn.execute(
        select(alerts.c.run_id, func.count())
        .where(alerts.c.run_id.in_(run_ids), alerts.c.status.in_(_UNRESOLVED))
        .group_by(alerts.c.run_id)
    ).all()
    return {int(r): int(n) for r, n in rows}


def open_counts(conn: Connection) -> dict[str, int]:
    rows = conn.execute(
        select(alerts.c.severity, func.count()).where(alerts.c.status == "open").group_by(alerts.c.severity)
    ).all()
    return {str(s): int(n) for s, n in rows}


def _to_info(r: Row[Any]) -> AlertInfo:
    return AlertInfo(
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

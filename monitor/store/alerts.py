"""Alert rows: open, refresh, resolve, re-open, acknowledge, list; and their delivery state per sink."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Connection, Row, bindparam, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from contracts.alerts import FIRING, RESOLVED
from monitor.db.models import Alert, AlertDelivery, Run
from monitor.domain import (
    ActiveCondition,
    AlertInfo,
    DeliveryInfo,
    DeliveryUpdate,
    OpenAlert,
    ResolvedAlert,
)
from monitor.store._sql import table_of

alerts = table_of(Alert)
deliveries = table_of(AlertDelivery)
runs = table_of(Run)
_UNRESOLVED = ("open", "acknowledged")


def open_alerts(conn: Connection, run_id: int) -> list[OpenAlert]:
    rows = conn.execute(
        select(
            alerts.c.id,
            alerts.c.kind,
            alerts.c.severity,
            alerts.c.status,
            alerts.c.last_notified_at,
            alerts.c.first_step,
            alerts.c.last_step,
            alerts.c.reopen_count,
            alerts.c.last_event,
        ).where(alerts.c.run_id == run_id, alerts.c.status.in_(_UNRESOLVED))
    ).all()
    return [
        OpenAlert(
            int(r.id),
            r.kind,
            r.severity,
            r.status,
            r.last_notified_at,
            first_step=int(r.first_step),
            last_step=int(r.last_step),
            reopen_count=int(r.reopen_count),
            last_event=r.last_event,
        )
        for r in rows
    ]


def latest_resolved(conn: Connection, run_id: int, kinds: Collection[str]) -> list[ResolvedAlert]:
    """The run's latest alert of each of `kinds` where that alert is resolved (one query)."""
    if not kinds:
        return []
    latest = (
        select(func.max(alerts.c.id))
        .where(alerts.c.run_id == run_id, alerts.c.kind.in_(sorted(kinds)))
        .group_by(alerts.c.kind)
    )
    rows = conn.execute(
        select(
            alerts.c.id,
            alerts.c.kind,
            alerts.c.severity,
            alerts.c.first_step,
            alerts.c.resolved_step,
            alerts.c.acknowledged_at,
            alerts.c.reopen_count,
        ).where(alerts.c.id.in_(latest), alerts.c.status == "resolved")
    ).all()
    return [
        ResolvedAlert(
            int(r.id),
            r.kind,
            r.severity,
            int(r.first_step),
            None if r.resolved_step is None else int(r.resolved_step),
            acknowledged=r.acknowledged_at is not None,
            reopen_count=int(r.reopen_count),
        )
        for r in rows
    ]


def lock_run(conn: Connection, run_id: int) -> None:
    """Hold the run's row lock until commit (PostgreSQL: FOR UPDATE), so judgments of one run's alerts
    (the detector's, which takes the same lock, and liveness checks) happen one after the other and
    each sees the alerts the previous one wrote; SQLite's single writer gives the same guarantee."""
    query = select(runs.c.id).where(runs.c.id == run_id)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    conn.execute(query).first()


def create(conn: Connection, run_id: int, c: ActiveCondition, now: datetime, event: str = FIRING) -> int:
    """A new open alert for `c`, notified with `event`."""
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
            last_step=c.last_held,
            created_at=now,
            updated_at=now,
            last_notified_at=now,
            notify_count=1,
            last_event=event,
        )
        .returning(alerts.c.id)
    )
    return int(result.scalar_one())


def refresh(
    conn: Connection, alert_id: int, c: ActiveCondition, now: datetime, event: str | None = None
) -> None:
    """The alert's condition still holds: take its latest message and evidence, move `last_step` on to
    the last step it held (never back); `event`: what is being sent about it now, if anything."""
    values: dict[str, Any] = {
        "severity": c.severity,
        "message": c.message,
        "evidence": c.evidence,
        "last_step": _greatest(conn, alerts.c.last_step, c.last_held),
        "updated_at": now,
    }
    if event is not None:
        values.update(_notified(now, event))
    conn.execute(update(alerts).where(alerts.c.id == alert_id).values(**values))


def refresh_quietly(
    conn: Connection, refreshes: Sequence[tuple[int, ActiveCondition]], now: datetime
) -> None:
    """`refresh` without a notification of each (alert id, condition), in one executemany: a collapsed
    run's alerts are refreshed on every step, and one statement per alert was the largest part of a
    detector pass outside the detector (psycopg pipelines the parameter sets)."""
    if not refreshes:
        return
    statement = (
        update(alerts)
        .where(alerts.c.id == bindparam("refreshed_id"))
        .values(
            severity=bindparam("refreshed_severity"),
            message=bindparam("refreshed_message"),
            evidence=bindparam("refreshed_evidence", type_=alerts.c.evidence.type),
            last_step=_greatest(conn, alerts.c.last_step, bindparam("refreshed_last_step")),
            updated_at=now,
        )
    )
    conn.execute(
        statement,
        [
            {
                "refreshed_id": alert_id,
                "refreshed_severity": c.severity,
                "refreshed_message": c.message,
                "refreshed_evidence": c.evidence,
                "refreshed_last_step": c.last_held,
            }
            for alert_id, c in refreshes
        ],
    )


def reopen(
    conn: Connection, alert_id: int, c: ActiveCondition, status: str, now: datetime, event: str | None = None
) -> bool:
    """Continue a resolved alert whose condition came back (`status`: open or acknowledged), counting
    the re-opening; False if it was not resolved any more (nothing changed)."""
    values: dict[str, Any] = {
        "status": status,
        "severity": c.severity,
        "message": c.message,
        "evidence": c.evidence,
        "last_step": _greatest(conn, alerts.c.last_step, c.last_held),
        "resolved_at": None,
        "resolved_step": None,
        "reopen_count": alerts.c.reopen_count + 1,
        "updated_at": now,
    }
    if event is not None:
        values.update(_notified(now, event))
    result = conn.execute(
        update(alerts)
        .where(alerts.c.id == alert_id, alerts.c.status == "resolved")
        .values(**values)
        .returning(alerts.c.id)
    )
    return result.first() is not None


def resolve(conn: Connection, alert_id: int, step: int, now: datetime, announced: bool) -> bool:
    """Resolve the alert as cleared at `step` (its `last_step` stays the last step its condition held);
    `announced`: a `resolved` notification is sent. False if it was resolved already (nothing changed)."""
    values: dict[str, Any] = {
        "status": "resolved",
        "resolved_at": now,
        "resolved_step": step,
        "updated_at": now,
    }
    if announced:
        values["last_event"] = RESOLVED
    result = conn.execute(
        update(alerts)
        .where(alerts.c.id == alert_id, alerts.c.status.in_(_UNRESOLVED))
        .values(**values)
        .returning(alerts.c.id)
    )
    return result.first() is not None


def _notified(now: datetime, event: str) -> dict[str, Any]:
    return {"last_notified_at": now, "notify_count": alerts.c.notify_count + 1, "last_event": event}


def _greatest(conn: Connection, column: Any, value: Any) -> Any:
    return func.max(column, value) if conn.dialect.name == "sqlite" else func.greatest(column, value)


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
    return None if row is None else _to_info(row, _deliveries_of(conn, [alert_id]))


def list_alerts(conn: Connection, run_id: int, status: str | None = None) -> list[AlertInfo]:
    query = select(alerts).where(alerts.c.run_id == run_id)
    if status is not None:
        query = query.where(alerts.c.status == status)
    rows = conn.execute(query.order_by(alerts.c.id)).all()
    states = _deliveries_of(conn, [int(r.id) for r in rows])
    return [_to_info(r, states) for r in rows]


def record_deliveries(conn: Connection, updates: Sequence[DeliveryUpdate]) -> None:
    """Upsert the latest state per (alert, sink); an alert deleted meanwhile (import --replace) is skipped."""
    now = datetime.now(timezone.utc)
    known = set(
        conn.execute(select(alerts.c.id).where(alerts.c.id.in_({u.alert_id for u in updates}))).scalars()
    )
    rows = [
        {
            "alert_id": u.alert_id,
            "sink": u.sink,
            "event": u.event,
            "status": u.status,
            "attempts": u.attempts,
            "last_error": u.error,
            "updated_at": now,
        }
        for u in updates
        if u.alert_id in known
    ]
    if not rows:
        return
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    for row in rows:  # one statement per row: a batch may update one (alert, sink) twice
        insert = dialect.insert(deliveries).values(**row)
        changed = {k: insert.excluded[k] for k in ("event", "status", "attempts", "last_error", "updated_at")}
        conn.execute(insert.on_conflict_do_update(index_elements=["alert_id", "sink"], set_=changed))


def _deliveries_of(conn: Connection, alert_ids: list[int]) -> dict[int, tuple[DeliveryInfo, ...]]:
    if not alert_ids:
        return {}
    found: dict[int, list[DeliveryInfo]] = {}
    query = select(deliveries).where(deliveries.c.alert_id.in_(alert_ids)).order_by(deliveries.c.sink)
    for r in conn.execute(query).all():
        info = DeliveryInfo(r.sink, r.event, r.status, r.attempts, r.last_error, r.updated_at)
        found.setdefault(int(r.alert_id), []).append(info)
    return {alert_id: tuple(states) for alert_id, states in found.items()}


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


def _to_info(r: Row[Any], states: dict[int, tuple[DeliveryInfo, ...]]) -> AlertInfo:
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
        deliveries=states.get(int(r.id), ()),
        reopen_count=int(r.reopen_count),
        resolved_step=None if r.resolved_step is None else int(r.resolved_step),
    )

"""Revision 0008 (alert hysteresis) goes up, down and up again with alerts in the table, on SQLite and
PostgreSQL: an alert resolved before it gets its `last_step` (where the old code resolved it) as
`resolved_step`, and the new code can continue it."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import inspect, text

from monitor.db.engine import make_engine
from monitor.db.migrate import downgrade, upgrade
from monitor.domain import ActiveCondition
from monitor.store import alerts as alert_store

NEW_COLUMNS = {"resolved_step", "reopen_count", "last_event"}


def test_hysteresis_migration_up_down_up_with_data(empty_url: str) -> None:
    upgrade(empty_url, "0007")
    engine = make_engine(empty_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO projects (id, name) VALUES (1, 'p')"))
        conn.execute(
            text(
                "INSERT INTO runs (id, project_id, name, config, status, directive_policy) "
                "VALUES (1, 1, 'r', '{}', 'running', 'alert')"
            )
        )
        for alert_id, kind, status, last_step in (
            (1, "reward_zero", "resolved", 30),
            (2, "dead_run", "open", 40),
        ):
            conn.execute(
                text(
                    "INSERT INTO alerts (id, run_id, kind, severity, status, message, evidence, first_step, "
                    f"last_step) VALUES ({alert_id}, 1, '{kind}', 'critical', '{status}', 'm', '{{}}', "
                    f"{last_step - 5}, {last_step})"
                )
            )
    upgrade(empty_url, "0008")
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id, resolved_step, reopen_count, last_event FROM alerts ORDER BY id")
        ).all()
        assert [tuple(r) for r in rows] == [(1, 30, 0, None), (2, None, 0, None)]
        [resolved] = alert_store.latest_resolved(conn, 1, {"reward_zero", "dead_run"})
        assert (resolved.id, resolved.resolved_step, resolved.first_step) == (1, 30, 25)
    with engine.begin() as conn:  # the new code continues a migrated alert
        now = datetime.now(timezone.utc)
        assert alert_store.reopen(
            conn, 1, ActiveCondition("reward_zero", "critical", 35, "m", {}, 36), "open", now
        )
        reopened = {
            a.id: (a.reopen_count, a.first_step, a.last_step) for a in alert_store.open_alerts(conn, 1)
        }
        assert reopened == {1: (1, 25, 36), 2: (0, 35, 40)}
    downgrade(empty_url, "0007")
    assert not NEW_COLUMNS & {c["name"] for c in inspect(engine).get_columns("alerts")}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM alerts")).scalar_one() == 2
    upgrade(empty_url)
    assert {c["name"] for c in inspect(engine).get_columns("alerts")} >= NEW_COLUMNS
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id, status, resolved_step, reopen_count FROM alerts ORDER BY id")
        ).all()
        assert [tuple(r) for r in rows] == [(1, "open", None, 0), (2, "open", None, 0)]
    engine.dispose()

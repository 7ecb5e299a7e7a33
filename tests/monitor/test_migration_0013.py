"""Revision 0013 (rollbacks), on SQLite and PostgreSQL: directives of 0012 read back with no rollback
request and an unchanged learning rate, a run may take policy `heal` and record rollbacks, and down
again turns `heal` runs into `auto` ones and drops the rollbacks, keeping the directives."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from monitor.db.engine import make_engine
from monitor.db.migrate import downgrade, upgrade
from monitor.store import events as event_store


def test_rollbacks_migration_up_down_up(empty_url: str) -> None:
    upgrade(empty_url, "0012")
    engine = make_engine(empty_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO projects (id, name) VALUES (1, 'p')"))
        conn.execute(
            text(
                "INSERT INTO runs (id, project_id, name, config, status, directive_policy) "
                "VALUES (1, 1, 'r', '{}', 'running', 'auto')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO directives (run_id, version, llds_enabled, llds_lam, reason, source, step) "
                "VALUES (1, 1, true, 0.2, 'auto: run entered decay (step 40)', 'detector', 40)"
            )
        )
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(text("UPDATE runs SET directive_policy = 'heal' WHERE id = 1"))

    upgrade(empty_url, "0013")
    assert "rollbacks" in inspect(engine).get_table_names()
    with engine.begin() as conn:
        [old] = event_store.directive_history(conn, 1)
        assert (old.rollback, old.rollback_to, old.lr_scale, old.llds.lam) == (0, None, 1.0, 0.2)
        conn.execute(text("UPDATE runs SET directive_policy = 'heal' WHERE id = 1"))
        event_store.append_directive(
            conn, 1, reason="heal", source="detector", step=60, rollback_to=40, lr_scale=0.5
        )
        event_store.record_rollback(conn, 1, 60, 40, 2)
        [rollback] = event_store.list_rollbacks(conn, 1)
        assert (rollback.from_step, rollback.to_step, rollback.version, rollback.steps_redone) == (
            60,
            40,
            2,
            20,
        )
        assert rollback.created_at is not None
        current = event_store.current_directive(conn, 1)
        assert (current.rollback, current.rollback_to, current.lr_scale) == (2, 40, 0.5)

    downgrade(empty_url, "0012")
    assert "rollbacks" not in inspect(engine).get_table_names()
    with engine.begin() as conn:
        assert conn.execute(text("SELECT directive_policy FROM runs WHERE id = 1")).scalar_one() == "auto"
        versions = conn.execute(sa.text("SELECT version FROM directives WHERE run_id = 1 ORDER BY version"))
        assert [v for (v,) in versions] == [1, 2]

    upgrade(empty_url, "0013")
    with engine.begin() as conn:
        assert [d.rollback for d in event_store.directive_history(conn, 1)] == [0, 0]
    engine.dispose()

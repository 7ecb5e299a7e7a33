"""Revision 0006 (directive levers) goes up, down and up again with directives in the table, on SQLite
and PostgreSQL: old versions get no requests, and `llds_manual` from a run's first manual version on."""

from __future__ import annotations

from sqlalchemy import inspect, text

from contracts.directive import LLDSDirective
from monitor.db.engine import make_engine
from monitor.db.migrate import downgrade, upgrade
from monitor.store import events as event_store

LEVER_COLUMNS = {"checkpoint", "stop", "stop_reason", "stop_on_collapse", "llds_manual"}


def test_levers_migration_up_down_up_with_data(empty_url: str) -> None:
    upgrade(empty_url, "0005")
    engine = make_engine(empty_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO projects (id, name) VALUES (1, 'p')"))
        for run_id in (1, 2):
            conn.execute(
                text(
                    "INSERT INTO runs (id, project_id, name, config, status, directive_policy) "
                    f"VALUES ({run_id}, 1, 'r{run_id}', '{{}}', 'running', 'auto')"
                )
            )
        for run_id, version, source in (
            (1, 1, "detector"),
            (1, 2, "manual"),
            (1, 3, "detector"),
            (2, 1, "detector"),
        ):
            conn.execute(
                text(
                    "INSERT INTO directives (run_id, version, llds_enabled, llds_lambda, reason, source, step) "
                    f"VALUES ({run_id}, {version}, true, 0.2, 'old', '{source}', {10 * version})"
                )
            )
    upgrade(empty_url, "0006")
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT run_id, version, checkpoint, stop, stop_reason, stop_on_collapse, llds_manual "
                "FROM directives ORDER BY run_id, version"
            )
        ).all()
        assert [tuple(r) for r in rows] == [
            (1, 1, 0, 0, "", False, False),
            (1, 2, 0, 0, "", False, True),  # before 0006 every manual version set LLDS
            (1, 3, 0, 0, "", False, True),  # ... and the detector left it alone from then on
            (2, 1, 0, 0, "", False, False),
        ]
    upgrade(empty_url)  # the code of today reads the columns of later revisions too
    with engine.begin() as conn:  # the new code on the migrated rows: a request carries the rest forward
        event_store.append_directive(conn, 2, reason="r", source="manual", step=20, checkpoint=True)
        d = event_store.current_directive(conn, 2)
    assert (d.version, d.checkpoint, d.llds, d.llds_manual) == (2, 2, LLDSDirective(True, 0.2), False)
    downgrade(empty_url, "0005")
    assert not LEVER_COLUMNS & {c["name"] for c in inspect(engine).get_columns("directives")}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM directives")).scalar_one() == 5
    upgrade(empty_url)
    assert {c["name"] for c in inspect(engine).get_columns("directives")} >= LEVER_COLUMNS
    with engine.connect() as conn:
        # down and up again, run 2's manual checkpoint request reads as a manual LLDS setting (the
        # downgrade dropped the difference): the conservative reading, the detector stays hands-off
        assert conn.execute(text("SELECT count(*) FROM directives WHERE llds_manual")).scalar_one() == 3
    engine.dispose()

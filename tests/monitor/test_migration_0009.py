"""Revision 0009 (directive acknowledgements) goes up, down and up again with directives and stored
acknowledgement metrics, on SQLite and PostgreSQL: each existing version gets the first step whose
finite stored value covers it as `applied_step`, and the new code reads it."""

from __future__ import annotations

import math

from sqlalchemy import Engine, inspect, text

from monitor.db.engine import make_engine
from monitor.db.migrate import downgrade, upgrade
from monitor.store import events as event_store


def test_acknowledgement_migration_up_down_up_with_data(empty_url: str) -> None:
    upgrade(empty_url, "0008")
    engine = make_engine(empty_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO projects (id, name) VALUES (1, 'p')"))
        for run_id in (1, 2):
            conn.execute(
                text(
                    "INSERT INTO runs (id, project_id, name, config, status, directive_policy) "
                    f"VALUES ({run_id}, 1, 'r{run_id}', '{{}}', 'running', 'alert')"
                )
            )
            for version in (1, 2, 3):
                conn.execute(
                    text(
                        "INSERT INTO directives (run_id, version, llds_enabled, llds_lambda, reason, source) "
                        f"VALUES ({run_id}, {version}, false, 0.2, '', 'manual')"
                    )
                )
        for step, value in ((2, math.inf), (3, math.nan), (4, 1.0), (5, 0.5), (6, 2.0), (7, 1.0)):
            conn.execute(
                text(
                    "INSERT INTO step_metrics (run_id, name, step, value) "
                    "VALUES (1, 'directive/applied_version', :step, :value)"
                ),
                {"step": step, "value": value},
            )
    upgrade(empty_url, "0009")
    assert _applied_steps(engine) == {1: [4, 6, None], 2: [None, None, None]}
    downgrade(empty_url, "0008")
    assert "applied_step" not in {c["name"] for c in inspect(engine).get_columns("directives")}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM directives")).scalar_one() == 6
    upgrade(empty_url)  # the code of today reads what 0009 wrote (through the later revisions)
    with engine.connect() as conn:
        assert [d.applied_step for d in event_store.directive_history(conn, 1)] == [4, 6, None]
        assert event_store.current_directive(conn, 1).applied_version == 2
        assert [d.applied_step for d in event_store.directive_history(conn, 2)] == [None, None, None]
        assert event_store.current_directive(conn, 2).applied_version == 0
    engine.dispose()


def _applied_steps(engine: Engine) -> dict[int, list[int | None]]:
    """Each run's `applied_step` by version, read with the SQL of revision 0009 (the store reads the
    columns of the latest revision)."""
    steps: dict[int, list[int | None]] = {}
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT run_id, applied_step FROM directives ORDER BY run_id, version"))
        for run_id, step in rows:
            steps.setdefault(run_id, []).append(step)
    return steps

"""Revision 0010 (`runs.status_final`): runs that ended before it keep behaving as they did. `finished`
and `failed` stay final (no batch revived them); `crashed` and `stalled` stay revivable; down and up
again. Both databases."""

from __future__ import annotations

from sqlalchemy import inspect, text

from monitor.db.engine import make_engine
from monitor.db.migrate import downgrade, upgrade

STATUSES = ("running", "finished", "failed", "crashed", "stalled")


def test_existing_runs_keep_their_revival_behaviour(empty_url: str) -> None:
    upgrade(empty_url, "0009")
    engine = make_engine(empty_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO projects (id, name) VALUES (1, 'p')"))
        for i, status in enumerate(STATUSES, start=1):
            conn.execute(
                text(
                    "INSERT INTO runs (id, project_id, name, config, status, directive_policy) "
                    "VALUES (:id, 1, :name, '{}', :status, 'alert')"
                ),
                {"id": i, "name": status, "status": status},
            )
    upgrade(empty_url, "0010")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status, status_final FROM runs ORDER BY id")).all()
    assert [(s, bool(f)) for s, f in rows] == [
        ("running", False),
        ("finished", True),
        ("failed", True),
        ("crashed", False),
        ("stalled", False),
    ]
    downgrade(empty_url, "0009")
    assert "status_final" not in {c["name"] for c in inspect(engine).get_columns("runs")}
    upgrade(empty_url, "0010")
    engine.dispose()

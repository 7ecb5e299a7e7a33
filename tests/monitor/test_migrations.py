"""Migrations are the schema's source of truth: they go up, down and up again, and match the models."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from monitor.api.app import SchemaOutdated, build_state
from monitor.config import Settings
from monitor.db.base import Base
from monitor.db.engine import make_engine
from monitor.db.migrate import current_revision, downgrade, head_revision, upgrade


def test_upgrade_downgrade_upgrade(empty_url: str) -> None:
    engine = make_engine(empty_url)
    upgrade(empty_url)
    assert current_revision(engine) == head_revision()
    assert {"runs", "step_metrics", "action_blocks", "ingest_batches", "directives"} <= set(
        inspect(engine).get_table_names()
    )
    downgrade(empty_url, "base")
    assert current_revision(engine) is None
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    upgrade(empty_url)
    assert current_revision(engine) == head_revision()
    engine.dispose()


def test_models_and_migrations_agree(empty_url: str) -> None:
    upgrade(empty_url)
    engine = make_engine(empty_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    engine.dispose()
    assert diff == []


VERSIONS = Path(__file__).resolve().parents[2] / "migrations" / "versions"
LIVE_CODE = "monitor.store"
"""Live code a revision must not import: its behaviour may change, and a revision must keep doing what it
did (a revision that needs such code carries a frozen copy, as 0007 does with the action codec)."""


def _imported_modules(path: Path) -> list[str]:
    modules: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            modules.append(node.module)
            modules.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def test_revisions_import_no_live_store_code() -> None:
    revisions = sorted(VERSIONS.glob("*.py"))
    assert any(path.name.startswith("0007_") for path in revisions)
    offending = {
        path.name: [m for m in _imported_modules(path) if f"{m}.".startswith(f"{LIVE_CODE}.")]
        for path in revisions
    }
    assert {name: found for name, found in offending.items() if found} == {}


def test_metric_query_is_served_by_an_index(empty_url: str) -> None:
    """'One run, some metric names, a step range' must be an index range scan, not a table scan."""
    upgrade(empty_url)
    engine = make_engine(empty_url)
    pk = inspect(engine).get_pk_constraint("step_metrics")
    engine.dispose()
    assert pk["constrained_columns"] == ["run_id", "name", "step"]


def test_empty_sqlite_is_upgraded_on_start(tmp_path: Path) -> None:
    state = build_state(Settings(data_dir=tmp_path))
    assert current_revision(state.db.engine) == head_revision()
    assert (tmp_path / "lldmon.db").exists()
    state.db.dispose()


def test_outdated_schema_fails_fast_with_the_command(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(SchemaOutdated, match="lldmon db upgrade"):
        build_state(Settings(database_url=url, auto_upgrade=False))


def test_ledger_migration_keeps_its_entries_up_and_down(empty_url: str) -> None:
    """0003 keys the ledger by (run, kind, batch id) with a digest: entries from before it stay (a
    re-send of one is still a duplicate) and downgrading keeps one entry per (run, batch id)."""
    from sqlalchemy import text

    from monitor.store import ingest as ingest_store

    upgrade(empty_url, "0002")
    engine = make_engine(empty_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO projects (id, name) VALUES (1, 'p')"))
        conn.execute(
            text(
                "INSERT INTO runs (id, project_id, name, config, status, directive_policy) "
                "VALUES (1, 1, 'r', '{}', 'running', 'alert')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO ingest_batches (run_id, batch_id, kind, n_rows) VALUES (1, 'old', 'metrics', 3)"
            )
        )
    upgrade(empty_url, "0003")
    assert inspect(engine).get_pk_constraint("ingest_batches")["constrained_columns"] == [
        "run_id",
        "kind",
        "batch_id",
    ]
    with engine.begin() as conn:
        old = ingest_store.claim_batch(conn, 1, "metrics", "old", "f" * 64, 3)
        assert old is not None and old.n_rows == 3 and old.digest is None  # a re-send: duplicate
        assert ingest_store.claim_batch(conn, 1, "actions", "old", "a" * 64, 2) is None  # its own ledger
    downgrade(empty_url, "0002")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT run_id, batch_id, kind, n_rows FROM ingest_batches")).all()
    assert [tuple(r) for r in rows] == [(1, "old", "metrics", 3)]
    assert "digest" not in {c["name"] for c in inspect(engine).get_columns("ingest_batches")}
    upgrade(empty_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ingest_batches")).scalar_one() == 1
    engine.dispose()

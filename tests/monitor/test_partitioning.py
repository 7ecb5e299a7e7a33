"""Scale-out (issue 17, item 6): every large table is keyed by run first, and hash partitioning by
run_id on PostgreSQL keeps the schema identical, keeps the rows, leaves migrations usable and spreads
runs over partitions. The ingest and query API tests run on such a database too ("postgres-partitioned"
in tests/conftest.py; see the overrides at the top of tests/monitor/api/test_ingest.py and test_query.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.operations import Operations
from fastapi.testclient import TestClient
from sqlalchemy import BigInteger, Column, Engine, inspect, text

from contracts.wire import API_PREFIX
from monitor.db import models  # noqa: F401  (registers the tables on Base.metadata)
from monitor.db.base import Base
from monitor.db.engine import make_engine
from monitor.db.migrate import current_revision, head_revision, upgrade
from monitor.db.partitioning import (
    LARGE_TABLES,
    PER_RUN_SMALL_TABLES,
    PartitioningError,
    is_partition_name,
    partition_by_run,
    partition_layout,
)
from tests.conftest import (
    PARTITIONED_MODULUS,
    drop_postgres_database,
    fresh_postgres_database,
    migrated_database,
)
from tests.monitor.api.helpers import action_batch, history, metrics_batch, new_run

PG_URL = os.environ.get("LLDMON_TEST_DATABASE_URL")
needs_pg = pytest.mark.skipif(PG_URL is None, reason="needs LLDMON_TEST_DATABASE_URL (PostgreSQL)")


def test_every_large_table_is_keyed_by_run_first() -> None:
    """A table that grows with the data must be partitionable by run_id: its primary key starts with
    it. A new table with a run_id column must be classified here (large or small per run)."""
    tables = Base.metadata.tables
    assert set(LARGE_TABLES) <= set(tables)
    for name in LARGE_TABLES:
        assert next(iter(tables[name].primary_key.columns)).name == "run_id", name
    with_run_id = {name for name, table in tables.items() if "run_id" in table.columns}
    assert with_run_id == set(LARGE_TABLES) | set(PER_RUN_SMALL_TABLES)


def test_refuses_sqlite_clearly(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    upgrade(url)
    engine = make_engine(url)
    with pytest.raises(PartitioningError, match="needs PostgreSQL; this database is sqlite"):
        partition_by_run(engine)
    engine.dispose()


@pytest.fixture
def pg_engine() -> Iterator[Engine]:
    """A fresh PostgreSQL database at head with rows in every large table, for 5 runs."""
    assert PG_URL is not None
    url = fresh_postgres_database(PG_URL)
    upgrade(url)
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO projects (id, name) VALUES (1, 'p')"))
        for run in range(1, 6):
            conn.execute(
                text(
                    "INSERT INTO runs (id, project_id, name, config, status, directive_policy) "
                    "VALUES (:r, 1, :n, '{}', 'running', 'alert')"
                ),
                {"r": run, "n": f"run-{run}"},
            )
            conn.execute(
                text("INSERT INTO step_metrics (run_id, name, step, value) VALUES (:r, 'loss', :s, :v)"),
                [{"r": run, "s": s, "v": None if s == 3 else s / 10} for s in range(10)],
            )
            conn.execute(
                text(
                    "INSERT INTO action_blocks (run_id, step, source, n_records, payload, summary) "
                    "VALUES (:r, :s, 'loss', 3, :p, '{\"levels\": []}')"
                ),
                [{"r": run, "s": s, "p": bytes([run, s, 0, 255])} for s in range(4)],
            )
            conn.execute(
                text(
                    "INSERT INTO ingest_batches (run_id, kind, batch_id, digest, n_rows) "
                    "VALUES (:r, 'metrics', :b, NULL, 10)"
                ),
                {"r": run, "b": f"b-{run}"},
            )
    yield engine
    engine.dispose()
    drop_postgres_database(url)


def schema_of(engine: Engine, table: str) -> dict[str, Any]:
    inspector = inspect(engine)
    return {
        "columns": [{**c, "type": str(c["type"])} for c in inspector.get_columns(table)],
        "pk": inspector.get_pk_constraint(table),
        "fks": inspector.get_foreign_keys(table),
        "checks": inspector.get_check_constraints(table),
        "indexes": inspector.get_indexes(table),
        "uniques": inspector.get_unique_constraints(table),
    }


def rows_of(engine: Engine, table: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(f"SELECT * FROM {table} ORDER BY 1, 2, 3")).all()]


@needs_pg
def test_partitioning_keeps_schema_rows_and_migrations(pg_engine: Engine) -> None:
    extra_indexes = {  # none in the model today: check that later ones are carried over too
        "ix_probe_step": "CREATE INDEX ix_probe_step ON step_metrics (step) WHERE value IS NOT NULL",
        "ix_probe_unique": "CREATE UNIQUE INDEX ix_probe_unique ON ingest_batches (run_id, batch_id, kind)",
    }
    with pg_engine.begin() as conn:
        for create in extra_indexes.values():
            conn.execute(text(create))
    before = {t: (schema_of(pg_engine, t), rows_of(pg_engine, t)) for t in LARGE_TABLES}
    assert all(rows for _, rows in before.values())
    assert {i["name"] for t in LARGE_TABLES for i in before[t][0]["indexes"]} == set(extra_indexes)

    assert partition_by_run(pg_engine, modulus=PARTITIONED_MODULUS) == dict.fromkeys(
        LARGE_TABLES, PARTITIONED_MODULUS
    )

    assert {t: (schema_of(pg_engine, t), rows_of(pg_engine, t)) for t in LARGE_TABLES} == before
    with pg_engine.connect() as conn:
        layout = partition_layout(conn)
        assert layout == {t: [f"{t}_p{i}" for i in range(PARTITIONED_MODULUS)] for t in LARGE_TABLES}
        keys = conn.execute(
            text("SELECT partrelid::regclass::text, pg_get_partkeydef(partrelid) FROM pg_partitioned_table")
        ).all()
        assert dict(keys) == dict.fromkeys(LARGE_TABLES, "HASH (run_id)")
        # 5 runs spread over more than one partition, and a one-run query reads one partition only.
        used = conn.execute(text("SELECT count(DISTINCT tableoid) FROM step_metrics")).scalar_one()
        assert used > 1
        plan = "\n".join(conn.execute(text("EXPLAIN SELECT * FROM step_metrics WHERE run_id = 3")).scalars())
        assert plan.count("step_metrics_p") == 1, plan
        # the compressed payload stays out of line in every partition (revision 0007's storage setting)
        storage = conn.execute(
            text(
                "SELECT DISTINCT attstorage FROM pg_attribute "
                "WHERE attname = 'payload' AND attrelid::regclass::text LIKE 'action_blocks%'"
            )
        ).scalars()
        assert list(storage) == ["e"]
        for index in extra_indexes:
            conn.execute(text(f"DROP INDEX {index}"))
        # Models and schema still agree (partitions are storage, not tables of the model).
        assert all(is_partition_name(p) for parts in layout.values() for p in parts)
        assert not any(is_partition_name(t) for t in Base.metadata.tables)
        context = MigrationContext.configure(
            conn,
            opts={
                "compare_type": True,
                "include_name": lambda name, kind, _: not (kind == "table" and is_partition_name(name)),
            },
        )
        assert compare_metadata(context, Base.metadata) == []
    # Alembic still works: current is head, upgrade head is a no-op, and a later migration's ALTER on
    # a partitioned parent reaches every partition.
    assert current_revision(pg_engine) == head_revision()
    upgrade(pg_engine.url.render_as_string(hide_password=False))
    assert current_revision(pg_engine) == head_revision()
    with pg_engine.begin() as conn:
        Operations(MigrationContext.configure(conn)).add_column("step_metrics", Column("extra", BigInteger))
    assert all(
        "extra" in {c["name"] for c in inspect(pg_engine).get_columns(p)} for p in layout["step_metrics"]
    )
    # Idempotent: partitioned tables are left as they are.
    assert partition_by_run(pg_engine, modulus=2) == dict.fromkeys(LARGE_TABLES, PARTITIONED_MODULUS)


@needs_pg
def test_refuses_a_table_not_keyed_by_run_and_changes_nothing(pg_engine: Engine) -> None:
    with pytest.raises(PartitioningError, match="alerts: its primary key must start with run_id"):
        partition_by_run(pg_engine, tables=["step_metrics", "alerts"])
    with pytest.raises(PartitioningError, match="does not exist"):
        partition_by_run(pg_engine, tables=["step_metrics", "nope"])
    with pytest.raises(PartitioningError, match="positive integer"):
        partition_by_run(pg_engine, modulus=0)
    with pg_engine.begin() as conn:
        conn.execute(text("CREATE UNIQUE INDEX ix_batch_only ON ingest_batches (batch_id)"))
    with pytest.raises(PartitioningError, match="unique index ix_batch_only lacks run_id"):
        partition_by_run(pg_engine)
    with pg_engine.connect() as conn:
        assert partition_layout(conn) == {}


@needs_pg
def test_a_failure_midway_rolls_every_table_back(pg_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from monitor.db import partitioning

    before = {t: rows_of(pg_engine, t) for t in LARGE_TABLES}
    convert = partitioning._convert

    def fail_on_the_last(conn: Any, spec: Any, modulus: int) -> None:
        if spec.name == LARGE_TABLES[-1]:
            raise RuntimeError("disk full")
        convert(conn, spec, modulus)

    monkeypatch.setattr(partitioning, "_convert", fail_on_the_last)
    with pytest.raises(RuntimeError, match="disk full"):
        partition_by_run(pg_engine)
    with pg_engine.connect() as conn:
        assert partition_layout(conn) == {}
    assert {t: rows_of(pg_engine, t) for t in LARGE_TABLES} == before


# The API test below runs on the partitioned backend only (same pair of overrides as test_ingest.py).
def test_cli_partitions_and_refuses_sqlite(tmp_path: Path) -> None:
    """`lldmon db partition`: the operator's way in; a clean one-line error where it cannot apply."""
    from typer.testing import CliRunner

    from monitor.cli import app

    runner = CliRunner()
    url = f"sqlite:///{tmp_path / 'x.db'}"
    upgrade(url)
    result = runner.invoke(app, ["db", "partition", "--database-url", url])
    assert result.exit_code == 1 and "needs PostgreSQL" in result.output
    if PG_URL is None:
        return
    pg = fresh_postgres_database(PG_URL)
    try:
        upgrade(pg)
        result = runner.invoke(app, ["db", "partition", "--database-url", pg, "--partitions", "3"])
        assert result.exit_code == 0, result.output
        for table in LARGE_TABLES:
            assert f"{table}: 3 partitions" in result.output
        engine = make_engine(pg)
        with engine.connect() as conn:
            layout = partition_layout(conn)
        engine.dispose()
        assert set(LARGE_TABLES) <= set(layout)
    finally:
        drop_postgres_database(pg)


@pytest.fixture(scope="session", params=["postgres-partitioned"] if PG_URL else [])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def migrated_url(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from migrated_database(backend, tmp_path_factory)


def test_the_partitioned_backend_is_used_and_spreads_runs(client: TestClient, db_url: str) -> None:
    """The conftest backend the ingest/query tests run on is partitioned, and the API's rows land in
    several partitions for several runs, and read back whole."""
    runs = [new_run(client, name=f"run-{i}") for i in range(8)]
    for run_id in runs:
        ok = client.post(
            f"{API_PREFIX}/runs/{run_id}/metrics", json=metrics_batch([0, 1], {"loss": [0.5, 0.25]})
        )
        assert ok.status_code == 200, ok.text
        ok = client.post(f"{API_PREFIX}/runs/{run_id}/actions", json=action_batch(6, step=1))
        assert ok.status_code == 200, ok.text
    for run_id in runs:
        assert history(client, run_id) == {"loss": {"steps": [0, 1], "values": [0.5, 0.25]}}
        actions = client.get(f"{API_PREFIX}/runs/{run_id}/actions").json()
        assert actions["traj_index"] == list(range(6))
    engine = make_engine(db_url)
    with engine.connect() as conn:
        assert set(partition_layout(conn)) == set(LARGE_TABLES)
        for table in LARGE_TABLES:
            spread = conn.execute(text(f"SELECT count(DISTINCT tableoid), count(*) FROM {table}")).one()
            assert spread[0] > 1 and spread[1] >= len(runs), (table, spread)
    engine.dispose()

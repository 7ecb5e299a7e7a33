"""Test databases: every storage/API test runs on SQLite and, with LLDMON_TEST_DATABASE_URL set,
also on PostgreSQL. Each backend gets a fresh database per test session, migrated to head;
tables are emptied before every test. The ingest and query API tests also run on
"postgres-partitioned" (the large tables hash-partitioned by run_id, docs/scale-out.md) by
overriding `backend` and `migrated_url` with `ALL_BACKENDS` and `migrated_database`."""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.timing import SCALE, scaled

if TYPE_CHECKING:
    from tests.live_server import LiveServer

PG_URL = os.environ.get("LLDMON_TEST_DATABASE_URL")
BACKENDS = ["sqlite"] + (["postgres"] if PG_URL else [])
ALL_BACKENDS = BACKENDS + (["postgres-partitioned"] if PG_URL else [])
PARTITIONED_MODULUS = 4


def fresh_postgres_database(base_url: str) -> str:
    """Create an empty database next to `base_url` and return its URL."""
    url = make_url(base_url)
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    name = f"lldmon_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return url.set(database=name).render_as_string(hide_password=False)


def drop_postgres_database(db_url: str) -> None:
    url = make_url(db_url)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
    admin.dispose()


@contextlib.contextmanager
def live_server_on(backend: str, tmp_dir: Path, env: dict[str, str] | None = None) -> Iterator[LiveServer]:
    """A real `lldmon serve` on a fresh database of `backend` (migrated), dropped afterwards."""
    from monitor.db.migrate import upgrade
    from tests.live_server import LiveServer

    database_url = None
    if backend != "sqlite":
        database_url = new_database(backend, tmp_dir)
        upgrade(database_url)
        if backend == "postgres-partitioned":
            partition(database_url)
    try:
        with LiveServer(tmp_dir / "data", env=env, database_url=database_url).start() as live:
            yield live
    finally:
        if database_url is not None:
            drop_postgres_database(database_url)


def new_database(backend: str, tmp_dir: Path) -> str:
    """An empty database URL of the given backend (no schema)."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_dir / f'{uuid.uuid4().hex[:8]}.db'}"
    assert PG_URL is not None
    return fresh_postgres_database(PG_URL)


def partition(database_url: str) -> None:
    """Hash-partition the large tables of a migrated PostgreSQL database by run_id."""
    from monitor.db.engine import make_engine
    from monitor.db.partitioning import partition_by_run

    engine = make_engine(database_url)
    try:
        partition_by_run(engine, modulus=PARTITIONED_MODULUS)
    finally:
        engine.dispose()


def migrated_database(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh database of `backend` migrated to head (partitioned for "postgres-partitioned")."""
    from monitor.db.migrate import upgrade

    url = new_database(backend, tmp_path_factory.mktemp(backend))
    upgrade(url)
    if backend == "postgres-partitioned":
        partition(url)
    yield url
    if backend != "sqlite":
        drop_postgres_database(url)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker more than the cores (pyproject's `--maxprocesses` caps it). Many tests
    wait on a subprocess, a server or PostgreSQL, and a worker per core left a core idle part of the
    time: a fresh-clone CI run on 2 cores took 17:40 of pytest with 3 workers and 19:55 with 2, on the
    same day, both green."""
    return (os.cpu_count() or 1) + 1


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """The suite's default timeout (pyproject's `timeout`) times `LLDMON_TEST_TIME_SCALE`
    (tests/timing.py), unless `--timeout` was given."""
    if SCALE != 1 and config.getoption("timeout", None) is None:
        config.option.timeout = scaled(float(config.getini("timeout") or 0)) or None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files that hold a `slow` test run first: the parallel run (pyproject's `-n`, a file per worker at
    a time) then starts the longest files early, instead of ending on one while the other workers idle.
    The order inside a file, and of the other files, is kept. Each `timeout` mark is scaled by
    `LLDMON_TEST_TIME_SCALE` (tests/timing.py)."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)
    if SCALE != 1:
        for item in items:
            mark = item.get_closest_marker("timeout")
            if mark is not None and mark.args:
                item.add_marker(pytest.mark.timeout(scaled(float(mark.args[0]))), append=False)


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def trainer_backend() -> str:
    """The one backend of a live service that a real training run (minutes of TRL) streams to:
    PostgreSQL where the session has it, else SQLite. What such a test checks is the trainer's side
    (levers, restarts, directives); how each backend stores the same requests is tested on both by the
    API tests (tests/monitor/api/test_rollback_flow.py, test_directive_levers_live.py)."""
    return BACKENDS[-1]


@pytest.fixture(scope="session")
def migrated_url(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # A module that overrides `backend` must override this too (with `migrated_database`): a session
    # fixture is cached once, and pytest would otherwise hand it a database of another backend.
    yield from migrated_database(backend, tmp_path_factory)


@pytest.fixture
def empty_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A database of `backend` with no schema (migration tests), dropped afterwards."""
    url = new_database(backend, tmp_path)
    yield url
    if backend != "sqlite":
        drop_postgres_database(url)


@pytest.fixture
def db_url(migrated_url: str) -> str:
    """A migrated database with every table empty."""
    from monitor.db.base import Base
    from monitor.db.engine import make_engine

    engine = make_engine(migrated_url)
    tables = Base.metadata.sorted_tables
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            # DELETE and rewound sequences, in one round trip: what TRUNCATE ... RESTART IDENTITY
            # leaves, at 2-5 ms instead of 35-70 ms (TRUNCATE makes new files for every table).
            conn.execute(text(empty_postgres_sql()))
        else:
            for table in reversed(tables):
                conn.execute(table.delete())
    engine.dispose()
    return migrated_url


@functools.cache
def empty_postgres_sql() -> str:
    """Empty every table of the schema (children before parents) and rewind every sequence to 1."""
    from monitor.db.base import Base

    deletes = [f"DELETE FROM {table.name}" for table in reversed(Base.metadata.sorted_tables)]
    rewind = (
        "SELECT setval(c.oid, 1, false) FROM pg_class c "
        "WHERE c.relkind = 'S' AND c.relnamespace = current_schema()::regnamespace"
    )
    return "; ".join([*deletes, rewind])


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    from monitor.config import Settings

    return Settings(database_url=db_url, data_dir=tmp_path, max_body_bytes=1024 * 1024)


@pytest.fixture
def app(settings):  # type: ignore[no-untyped-def]
    from monitor.api.app import create_app

    application = create_app(settings)
    yield application
    application.state.lldmon.db.dispose()


@pytest.fixture
def client(app):  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    with TestClient(app) as test_client:
        yield test_client

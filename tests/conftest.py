"""Test databases: every storage/API test runs on SQLite and, with LLDMON_TEST_DATABASE_URL set,
also on PostgreSQL. Each backend gets a fresh database per test session, migrated to head;
tables are emptied before every test."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

if TYPE_CHECKING:
    from tests.live_server import LiveServer

PG_URL = os.environ.get("LLDMON_TEST_DATABASE_URL")
BACKENDS = ["sqlite"] + (["postgres"] if PG_URL else [])


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
    if backend == "postgres":
        database_url = new_database(backend, tmp_dir)
        upgrade(database_url)
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


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def migrated_url(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from monitor.db.migrate import upgrade

    url = new_database(backend, tmp_path_factory.mktemp(backend))
    upgrade(url)
    yield url
    if backend == "postgres":
        drop_postgres_database(url)


@pytest.fixture
def empty_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A database of `backend` with no schema (migration tests), dropped afterwards."""
    url = new_database(backend, tmp_path)
    yield url
    if backend == "postgres":
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
            conn.execute(text(f"TRUNCATE {', '.join(t.name for t in tables)} RESTART IDENTITY CASCADE"))
        else:
            for table in reversed(tables):
                conn.execute(table.delete())
    engine.dispose()
    return migrated_url


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

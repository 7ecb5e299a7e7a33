"""Engine construction: WAL + busy timeout for the embedded SQLite, a sized pool for PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url


def make_engine(url: str, *, pool_size: int = 8) -> Engine:
    """Create the engine for `url`, creating the SQLite data directory if needed."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_on_connect)
        return engine
    return create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets the dashboard read while the ingest path writes; NORMAL sync is durable under WAL
    # against application crashes (only an OS crash can lose the last commits).
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"

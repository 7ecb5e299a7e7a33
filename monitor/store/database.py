"""One place for transactions and for translating driver errors into domain errors."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError, OperationalError

from monitor.errors import ServiceUnavailable


class Database:
    """Wraps the engine; `write()` is one transaction, `read()` a plain connection.

    SQLite allows one writer: a process-wide lock serialises writers here instead of letting them
    collide on the database lock (other processes still wait on SQLite's busy timeout).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.is_sqlite = engine.dialect.name == "sqlite"
        self._write_lock: contextlib.AbstractContextManager[object] = (
            threading.Lock() if self.is_sqlite else contextlib.nullcontext()
        )

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        with self._write_lock, _translate_errors(), self.engine.begin() as conn:
            yield conn

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        with _translate_errors(), self.engine.connect() as conn:
            yield conn

    def ping(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except DBAPIError:
            return False
        return True

    def dispose(self) -> None:
        self.engine.dispose()


@contextlib.contextmanager
def _translate_errors() -> Iterator[None]:
    try:
        yield
    except DBAPIError as exc:
        if isinstance(exc, OperationalError) or exc.connection_invalidated:
            raise ServiceUnavailable("database unavailable, retry later") from exc
        raise

"""One place for transactions and for translating driver errors into domain errors."""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterator
from types import TracebackType

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError, OperationalError

from monitor.errors import ServiceUnavailable


class Database:
    """Wraps the engine; `write()` is one transaction, `read()` a plain connection.

    SQLite allows one writer: a process-wide lock serialises writers here instead of letting them
    collide on the database lock (other processes still wait on SQLite's busy timeout). The lock is
    first come, first served, so a long job that commits in chunks lets other runs' writes in between.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.is_sqlite = engine.dialect.name == "sqlite"
        self._write_lock: contextlib.AbstractContextManager[object] = (
            FifoLock() if self.is_sqlite else contextlib.nullcontext()
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


class FifoLock:
    """A mutex handed to its waiters in arrival order.

    `threading.Lock` is not fair: a thread that releases it and asks again at once (the detector
    committing a huge batch chunk by chunk) usually gets it back before a waiting thread wakes, so
    another run's ingest could wait for the whole batch instead of one chunk.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._locked = False
        self._waiters: deque[threading.Lock] = deque()

    def acquire(self) -> None:
        with self._mutex:
            if not self._locked:
                self._locked = True
                return
            turn = threading.Lock()
            turn.acquire()
            self._waiters.append(turn)
        try:
            turn.acquire()  # released by `release` when it is this waiter's turn
        except BaseException:  # interrupted while waiting: leave the queue, or pass the lock on
            with self._mutex:
                if turn in self._waiters:
                    self._waiters.remove(turn)
                    raise
            self.release()
            raise

    def release(self) -> None:
        with self._mutex:
            if self._waiters:
                self._waiters.popleft().release()  # ownership passes on; the lock stays taken
            else:
                self._locked = False

    def __enter__(self) -> FifoLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

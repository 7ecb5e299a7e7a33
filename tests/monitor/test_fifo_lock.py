"""The SQLite write lock is handed out in arrival order, so chunked commits let other writers in."""

from __future__ import annotations

import threading
import time

from monitor.store.database import FifoLock


def _wait_until(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_waiters_get_the_lock_in_arrival_order() -> None:
    lock = FifoLock()
    order: list[int] = []
    lock.acquire()
    threads = []
    for i in range(8):
        t = threading.Thread(target=lambda i=i: (lock.acquire(), order.append(i), lock.release()))
        t.start()
        threads.append(t)
        _wait_until(lambda n=i + 1: len(lock._waiters) == n)
    lock.release()
    for t in threads:
        t.join(5)
    assert order == list(range(8))
    assert not lock._locked


def test_a_holder_that_asks_again_at_once_queues_behind_a_waiter() -> None:
    """What `threading.Lock` does not guarantee: a chunked job releasing and re-acquiring cannot starve
    another writer for more than one chunk."""
    lock = FifoLock()
    events: list[str] = []
    other_waiting = threading.Event()

    def other() -> None:
        other_waiting.set()
        with lock:
            events.append("other")

    lock.acquire()
    t = threading.Thread(target=other)
    t.start()
    other_waiting.wait(5)
    _wait_until(lambda: len(lock._waiters) == 1)
    for chunk in range(50):  # the job: release, then immediately take it again
        lock.release()
        lock.acquire()
        events.append(f"chunk{chunk}")
    lock.release()
    t.join(5)
    assert events[0] == "other"

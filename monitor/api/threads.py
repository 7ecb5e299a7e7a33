"""Ingest work runs in a small thread pool of its own.

An ingest request is CPU work under the GIL (decoding, the transaction's Python side, the detector
pass): more threads than that can use only contend for the GIL. With the default pool (40 threads per
process) 50 concurrent runs kept up to 40 ingest threads runnable in each worker, and the server spent
14 % more CPU per step than with 4 (`benchmarks.concurrent_runs`, README). A capacity limiter of its
own bounds ingest to `Settings.ingest_threads` threads without touching the default pool, where reads
that wait on the database (exports, dashboard queries) keep their concurrency.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread

T = TypeVar("T")

_limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, anyio.CapacityLimiter]] = (
    weakref.WeakKeyDictionary()
)


async def run_ingest(threads: int, func: Callable[..., T], *args: object) -> T:
    """`func(*args)` in a worker thread, at most `threads` of them at once per event loop (a limiter
    belongs to the loop it was made in; a test client may run a loop per request)."""
    per_loop = _limiters.setdefault(asyncio.get_running_loop(), {})
    limiter = per_loop.get(threads)
    if limiter is None:
        limiter = per_loop[threads] = anyio.CapacityLimiter(threads)
    return await anyio.to_thread.run_sync(func, *args, limiter=limiter)

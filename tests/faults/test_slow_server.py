"""A slow, hanging or connection-dropping server (tests/faults/proxy.py in front of a live one): the
training loop's step time stays at its no-monitoring baseline, the client's memory stays bounded, and
once the proxy passes traffic again every step arrives exactly once."""

from __future__ import annotations

import statistics
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts import spool
from tests.faults.delivery import ledger_batches, wait_until_delivered
from tests.faults.proxy import FaultProxy, Mode
from tests.live_server import LiveServer
from trainer_hooks.client import MonitorClient, RetryPolicy

pytestmark = [pytest.mark.fault, pytest.mark.timeout(120)]

N_METRICS = 20
STEPS_PER_MODE = 250
TOLERANCE_S = 0.005
"""Median step time may exceed the baseline median by at most this (the brief's bound)."""


def metrics(step: int) -> dict[str, float]:
    return {f"m{i:02d}": step + i / 100 for i in range(N_METRICS)}


def train_step() -> None:
    """About a millisecond of pure-Python work: it holds the GIL, so it competes with the client's thread."""
    total = 0
    for i in range(30_000):
        total += i * i
    assert total


def timed_steps(steps: range, client: MonitorClient | None) -> list[float]:
    durations = []
    for step in steps:
        start = time.perf_counter()
        train_step()
        if client is not None:
            client.log(step, metrics(step))
        durations.append(time.perf_counter() - start)
    return durations


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("slow")).start() as live:
        yield live


def test_slow_hanging_and_dropping_server_do_not_slow_training_and_nothing_is_lost(
    server: LiveServer, tmp_path: Path
) -> None:
    max_queue, spool_max = 200, 64 * 1024 * 1024
    with FaultProxy(server.port) as proxy:
        client = MonitorClient(
            proxy.url,
            "slow",
            spool_dir=tmp_path / "spool",
            max_queue=max_queue,
            max_batch_rows=50,
            flush_interval=0.05,
            timeout=0.5,
            spool_max_bytes=spool_max,
            retry=RetryPolicy(attempts=2, backoff_base=0.05, backoff_max=0.3, max_retry_after=1.0),
            enabled=True,
        )
        try:
            timed_steps(range(20), client)  # warm-up: registration, first batch, code paths
            assert client.flush(timeout=20) and client.stats.sent > 0
            baseline = statistics.median(timed_steps(range(STEPS_PER_MODE), None))

            step = 20
            medians: dict[str, float] = {}
            modes: list[tuple[Mode, float]] = [("delay", 0.4), ("hang", 0.0), ("drop", 0.0)]
            for mode, delay in modes:
                proxy.set_mode(mode, delay=delay)
                durations = timed_steps(range(step, step + STEPS_PER_MODE), client)
                step += STEPS_PER_MODE
                medians[mode] = statistics.median(durations)
            print(
                f"median step: baseline {baseline * 1e3:.2f} ms, "
                + ", ".join(f"{m} {v * 1e3:.2f} ms" for m, v in medians.items())
            )
            for name, median in medians.items():
                assert median < baseline + TOLERANCE_S, (
                    f"{name}: median step {median * 1e3:.2f} ms vs baseline {baseline * 1e3:.2f} ms"
                )

            # Memory while the server hangs: records beyond the queue go to disk, not to RAM.
            proxy.set_mode("hang")
            burst = 4000
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                for s in range(step, step + burst):
                    client.log(s, metrics(s))
                    assert client._queue.qsize() <= max_queue  # the bounded queue never grows past it
                peak = tracemalloc.get_traced_memory()[1] - before
            finally:
                tracemalloc.stop()
            step += burst
            one_record = 2 * 1024  # a dict of 20 floats and its Record, generously
            assert peak < (max_queue + 2 * 256) * one_record + 1024 * 1024, f"peak {peak / 1e6:.1f} MB"
            assert peak < burst * one_record / 2  # far below holding the burst
            print(f"tracemalloc peak over {burst} log() calls against a hanging server: {peak / 1e6:.2f} MB")
            count, size = spool.spool_size(client.spool_dir)
            assert count > 0 and size <= spool_max and client.stats.dropped == 0

            proxy.set_mode("pass")
            wait_until_delivered(client, timeout=60)
        finally:
            client.close(timeout=15)

    assert proxy.connections > 3  # the faults really met new connections
    run_id = server.run_id("slow")
    series = server.series(run_id)
    assert len(series) == N_METRICS
    assert series["m00"]["steps"] == list(range(step))
    assert series["m07"]["values"] == [s + 0.07 for s in range(step)]
    assert sum(ledger_batches(server, run_id).values()) == N_METRICS * step  # every point once
    assert client.stats.rejected == 0 and client.stats.dropped == 0

"""Ingest requests run in a bounded pool of their own (`Settings.ingest_threads`): the rest wait their
turn and are then served, and the default pool is not used up by them."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx

from contracts.wire import API_PREFIX
from monitor.api import threads
from monitor.api.app import create_app
from monitor.config import Settings
from tests.monitor.api.helpers import metrics_batch


def test_at_most_ingest_threads_requests_are_in_the_ingest_service_at_once(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path, ingest_threads=2))
    service = app.state.lldmon.ingest
    original = service.ingest_metrics
    release, lock = threading.Event(), threading.Lock()
    inside = peak = 0

    def held(*args: Any) -> Any:
        nonlocal inside, peak
        with lock:
            inside += 1
            peak = max(peak, inside)
        release.wait(60)
        with lock:
            inside -= 1
        return original(*args)

    service.ingest_metrics = held

    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://lldmon") as client:
            run = (await client.post(f"{API_PREFIX}/runs", json={"name": "r"})).json()["id"]
            posts = [
                asyncio.create_task(
                    client.post(f"{API_PREFIX}/runs/{run}/metrics", json=metrics_batch([s], {"loss": [1.0]}))
                )
                for s in range(5)
            ]

            def waiting() -> int:
                limiter = threads._limiters.get(asyncio.get_running_loop(), {}).get(2)
                return 0 if limiter is None else limiter.statistics().tasks_waiting

            while inside + waiting() < 5:  # a condition, not a duration: every request placed
                await asyncio.sleep(0.01)
            assert (inside, waiting()) == (2, 3)
            # Meanwhile a request that is not ingest is answered at once.
            assert (await client.get(f"{API_PREFIX}/runs/{run}")).status_code == 200
            release.set()
            return list(await asyncio.gather(*posts))

    try:
        responses = asyncio.run(main())
    finally:
        release.set()
        app.state.lldmon.close()
    assert [r.status_code for r in responses] == [200] * 5
    assert peak == 2

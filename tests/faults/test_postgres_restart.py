"""PostgreSQL dies (`pg_ctl stop -m immediate`) under a live `lldmon serve` while a client streams:
ingest and /readyz answer 503 with Retry-After while it is down (/healthz stays 200), the service
recovers by itself when the database is back (no restart of lldmon), and the client's data end up
complete and unduplicated. Runs on a private cluster (tests/faults/postgres.py), never on the shared
one on 5432."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.faults.delivery import wait_until_delivered
from tests.faults.postgres import PrivatePostgres, unavailable_reason
from tests.live_server import LiveServer
from tests.trainer_hooks.conftest import FAST
from tests.trainer_hooks.test_client import expected_points, metrics_at, wire
from trainer_hooks.client import MonitorClient

pytestmark = [pytest.mark.fault, pytest.mark.timeout(90)]

REASON = unavailable_reason()


def wait_for(url: str, status: int, timeout: float) -> float:
    """Seconds until GET `url` answers `status`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if httpx.get(url, timeout=2.0).status_code == status:
                return time.monotonic() - start
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer {status} within {timeout}s")


@pytest.mark.skipif(REASON is not None, reason=f"private PostgreSQL: {REASON}")
def test_database_restart_mid_stream_503_while_down_recovers_by_itself_nothing_lost(tmp_path: Path) -> None:
    from monitor.db.migrate import upgrade

    test_start = time.monotonic()
    with PrivatePostgres() as pg:
        upgrade(pg.url)
        with LiveServer(tmp_path / "server", database_url=pg.url).start() as server:
            client = MonitorClient(
                server.url,
                "pg-restart",
                spool_dir=tmp_path / "spool",
                retry=FAST,
                flush_interval=0.02,
                max_batch_rows=20,
                timeout=5.0,
                enabled=True,
            )
            steps = range(300)
            try:
                for step in steps[:100]:
                    client.log(step, metrics_at(step))
                    time.sleep(0.002)
                assert client.flush(timeout=20)
                run_id = client.run_id
                assert run_id is not None

                pg.stop_immediately()
                assert not pg.running()
                batch = {"batch_id": "during-outage", "steps": [10_000], "metrics": {"a": [1.0]}}
                during = httpx.post(f"{server.api}/runs/{run_id}/metrics", json=batch, timeout=10)
                assert during.status_code == 503, during.text
                assert during.headers["retry-after"] == "1"
                assert during.json()["error"]["code"] == "service_unavailable"
                assert httpx.get(f"{server.api}/runs", timeout=10).status_code == 503
                assert httpx.get(f"{server.url}/readyz", timeout=10).status_code == 503
                assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
                for step in steps[100:200]:  # training goes on: retries, then the spool
                    client.log(step, metrics_at(step))
                    time.sleep(0.002)
                assert client.flush(timeout=20)

                pg.start()
                assert wait_for(f"{server.url}/readyz", 200, timeout=15) < 15
                assert server.running  # recovered without a restart of lldmon
                again = httpx.post(f"{server.api}/runs/{run_id}/metrics", json=batch, timeout=10)
                assert (
                    again.status_code == 200 and again.json()["duplicate"] is False
                )  # the 503 wrote nothing
                for step in steps[200:]:
                    client.log(step, metrics_at(step))
                    time.sleep(0.002)
                wait_until_delivered(client, timeout=30)
            finally:
                client.close(timeout=15)
            assert client.stats.spooled > 0  # the outage reached the client, the spool carried it
            series = server.series(run_id)

        assert series["a"]["steps"] == [*steps, 10_000]
        assert series["b"]["values"] == [wire(metrics_at(s)["b"]) for s in steps]
        assert series["c"]["steps"] == [s for s in steps if s % 2 == 0]
        engine = create_engine(pg.url)
        with engine.connect() as conn:
            ledger_rows = conn.execute(
                text("SELECT sum(n_rows) FROM ingest_batches WHERE run_id = :r AND kind = 'metrics'"),
                {"r": run_id},
            ).scalar_one()
            points = conn.execute(
                text("SELECT count(*) FROM step_metrics WHERE run_id = :r"), {"r": run_id}
            ).scalar_one()
        engine.dispose()
    assert ledger_rows == points == expected_points(steps) + 1  # every point once, no batch twice
    assert time.monotonic() - test_start < 60

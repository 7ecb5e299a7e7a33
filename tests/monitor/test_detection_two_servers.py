"""Two `lldmon serve` processes on one PostgreSQL database, each keeping its own detector windows: a
run whose batches land on either of them in turn gets the same phase events, alerts and directives as
the same run streamed to one of them (whose cached windows are never made stale by the other)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from contracts.wire import encode_float
from lldmon_lab.scenarios import collapse_scenario
from monitor.db.migrate import upgrade
from tests.conftest import PG_URL, drop_postgres_database, fresh_postgres_database
from tests.live_server import LiveServer

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.timeout(300),
    pytest.mark.skipif(PG_URL is None, reason="needs LLDMON_TEST_DATABASE_URL (a PostgreSQL server)"),
]

TIMES = {"id", "run_id", "created_at", "updated_at", "acknowledged_at", "resolved_at", "deliveries"}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, LiveServer]]:
    assert PG_URL is not None
    url = fresh_postgres_database(PG_URL)
    upgrade(url)
    tmp = tmp_path_factory.mktemp("two-servers")
    try:
        with (
            LiveServer(tmp / "a", database_url=url).start() as a,
            LiveServer(tmp / "b", database_url=url).start() as b,
        ):
            yield a, b
    finally:
        drop_postgres_database(url)


def stream(servers: list[LiveServer], name: str, seed: int) -> int:
    """Register the run on the first server, then send a collapse run in batches of 1-8 steps (the same
    batches for every `servers`), each to a server picked at random; returns the run id."""
    sc = collapse_scenario(5)
    first = servers[0]
    run_id = int(httpx.post(f"{first.api}/runs", json={"name": name}).json()["id"])
    assert httpx.put(f"{first.api}/runs/{run_id}/policy", json={"policy": "auto"}).status_code == 200
    sizes, picks = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    lo = 0
    while lo < sc.steps.size:
        rows = range(lo, min(lo + int(sizes.integers(1, 9)), sc.steps.size))
        body = {
            "batch_id": uuid.uuid4().hex,
            "steps": [int(sc.steps[i]) for i in rows],
            "metrics": {
                name: [encode_float(float(v[i])) if sc.present[name][i] else None for i in rows]
                for name, v in sc.values.items()
            },
        }
        server = servers[int(picks.integers(len(servers)))]
        response = httpx.post(f"{server.api}/runs/{run_id}/metrics", json=body, timeout=30.0)
        assert response.status_code == 200, response.text
        lo = rows.stop
    return run_id


def judged(server: LiveServer, run_id: int) -> dict[str, Any]:
    def plain(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in item.items() if k not in TIMES} for item in items]

    return {
        "phases": plain(server.get(f"/runs/{run_id}/events")),
        "alerts": sorted(
            plain(server.get(f"/runs/{run_id}/alerts")), key=lambda a: (a["first_step"], a["kind"])
        ),
        "directives": plain(server.get(f"/runs/{run_id}/directives")),
        "phase": server.get(f"/runs/{run_id}")["phase"],
    }


def test_two_servers_judge_a_run_as_one_does(servers: tuple[LiveServer, LiveServer]) -> None:
    a, b = servers
    alone = stream([a], "one-server", seed=1)
    shared = stream([a, b], "two-servers", seed=1)
    expected = judged(a, alone)
    assert [e["phase"] for e in expected["phases"]][-1:] == ["collapse"]
    assert expected["alerts"] and len(expected["directives"]) > 1
    assert judged(b, shared) == expected

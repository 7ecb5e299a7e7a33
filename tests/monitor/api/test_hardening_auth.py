"""Issue 16 hardening: auth never switches itself off, another project's run is indistinguishable from a
missing one, and concurrent directive writes never fail (threads in one process, and two server
processes sharing one database)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from contracts.wire import API_PREFIX
from monitor.errors import Conflict
from tests.live_server import LiveServer
from tests.monitor.api.helpers import WRITE_BODIES as BODIES
from tests.monitor.api.helpers import bearer, history, metrics_batch, new_run

RUNS = f"{API_PREFIX}/runs"


def run_routes(app: Any) -> list[tuple[str, str]]:
    """(method, path template) of every API operation that takes a run id, from the app's OpenAPI."""
    paths: dict[str, dict[str, Any]] = app.openapi()["paths"]
    return sorted(
        (method.upper(), path.removeprefix(API_PREFIX))
        for path, operations in paths.items()
        if "{run_id}" in path
        for method in operations
    )


# 7: auth stays on once it has been on


def test_revoking_the_last_token_keeps_auth_on(client: TestClient, app: Any) -> None:
    auth = app.state.lldmon.auth
    token, token_id = auth.create_token("proj-a")
    run_id = new_run(client, headers=bearer(token))
    auth.revoke(token_id)
    for headers in ({}, bearer(token)):
        assert client.get(RUNS, headers=headers).status_code == 401
        assert client.get(f"{RUNS}/{run_id}", headers=headers).status_code == 401
        put = client.put(f"{RUNS}/{run_id}/directive", json={"llds": {"enabled": True}}, headers=headers)
        assert put.status_code == 401, put.text
    assert client.post(RUNS, json={"name": "anonymous"}).status_code == 401
    fresh = bearer(auth.create_token("proj-a")[0])
    assert client.get(f"{RUNS}/{run_id}/directives", headers=fresh).json() == []  # the PUTs wrote nothing
    assert auth.status().enabled


def test_auth_off_is_explicit_and_refused_while_a_token_is_active(client: TestClient, app: Any) -> None:
    auth = app.state.lldmon.auth
    assert not auth.status().enabled  # a fresh database is open
    first, first_id = auth.create_token("proj-a", "ci")
    _, second_id = auth.create_token("proj-b")
    auth.revoke(first_id)
    with pytest.raises(Conflict, match=rf"1 active token.*{second_id}"):
        auth.turn_off()
    assert client.get(RUNS).status_code == 401
    auth.revoke(second_id)
    status = auth.status()
    assert (status.enabled, status.active, status.revoked) == (True, 0, 2)
    assert auth.turn_off() == 2  # the revoked rows it deleted
    assert not auth.status().enabled
    assert client.get(RUNS).status_code == 200
    assert client.get(RUNS, headers=bearer(first)).status_code == 401  # a revoked token stays dead
    assert auth.list_tokens() == []


# 15: a run of another project answers exactly like a run that does not exist


def test_another_projects_run_is_indistinguishable_from_a_missing_one(client: TestClient, app: Any) -> None:
    auth = app.state.lldmon.auth
    a, b = bearer(auth.create_token("proj-a")[0]), bearer(auth.create_token("proj-b")[0])
    run_a = new_run(client, "a-run", headers=a)
    assert client.post(
        f"{RUNS}/{run_a}/metrics", json=metrics_batch([0], {"loss": [1.0]}), headers=a
    ).is_success
    missing = new_run(client, "b-run", headers=b) + 1000
    routes = run_routes(app)
    assert len(routes) >= 15, routes
    for method, template in routes:
        assert (method, template) in BODIES or method == "GET", f"add a valid body for {method} {template}"
        answers = []
        for run_id in (run_a, missing):
            url = API_PREFIX + template.replace("{run_id}", str(run_id)).replace("{alert_id}", "1")
            response = client.request(method, url, json=BODIES.get((method, template)), headers=b)
            answers.append((response.status_code, response.text.replace(str(run_id), "<id>")))
        assert answers[0] == answers[1], (method, template, answers)
        assert answers[0][0] == 404, (method, template, answers)
        assert "proj-a" not in answers[0][1] and "a-run" not in answers[0][1]
    # Nothing of project A changed.
    run = client.get(f"{RUNS}/{run_a}", headers=a).json()
    assert (run["status"], run["directive_policy"]) == ("running", "alert")
    assert history(client, run_a, headers=a) == {"loss": {"steps": [0], "values": [1.0]}}
    assert client.get(f"{RUNS}/{run_a}/directive", headers=a).json()["version"] == 0


# 4: concurrent directive writes


def put_directives(base: list[str], run_id: int, n: int) -> list[httpx.Response]:
    """`n` concurrent PUTs, spread round-robin over the servers in `base`."""

    def put(i: int) -> httpx.Response:
        body = {"llds": {"enabled": i % 2 == 0, "lam": 0.01 * i}, "reason": f"put {i}"}
        return httpx.put(f"{base[i % len(base)]}/runs/{run_id}/directive", json=body, timeout=60.0)

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(put, range(n)))


def assert_versions_contiguous(history_rows: list[dict[str, Any]], n: int) -> None:
    assert [d["version"] for d in history_rows] == list(range(1, n + 1))
    assert sorted(d["reason"] for d in history_rows) == sorted(f"put {i}" for i in range(n))


def test_concurrent_directive_puts_in_one_process(client: TestClient) -> None:
    run_id = new_run(client)
    n = 48

    def put(i: int) -> Any:
        body = {"llds": {"enabled": True, "lam": 0.01 * i}, "reason": f"put {i}"}
        return client.put(f"{RUNS}/{run_id}/directive", json=body)

    with ThreadPoolExecutor(max_workers=n) as pool:
        responses = list(pool.map(put, range(n)))
    assert [r.status_code for r in responses] == [200] * n, [
        r.text for r in responses if r.status_code != 200
    ]
    assert sorted(r.json()["version"] for r in responses) == list(range(1, n + 1))
    assert_versions_contiguous(client.get(f"{RUNS}/{run_id}/directives").json(), n)


@pytest.mark.timeout(180)
def test_concurrent_directive_puts_from_two_server_processes(db_url: str, tmp_path: Path) -> None:
    """Two `lldmon serve` processes on one database (one SQLite file, or one PostgreSQL)."""
    with (
        LiveServer(tmp_path / "one", database_url=db_url) as one,
        LiveServer(tmp_path / "two", database_url=db_url) as two,
    ):
        one.start()
        two.start()
        created = httpx.post(f"{one.api}/runs", json={"name": "steered"}, timeout=10.0)
        run_id = int(created.json()["id"])
        n = 48
        responses = put_directives([one.api, two.api], run_id, n)
        failed = [(r.status_code, r.text) for r in responses if r.status_code != 200]
        assert not failed, (failed, one.output(), two.output())
        assert sorted(r.json()["version"] for r in responses) == list(range(1, n + 1))
        assert_versions_contiguous(two.get(f"/runs/{run_id}/directives"), n)

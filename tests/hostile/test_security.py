"""Security with auth on: every route (enumerated from the app, not hand-listed) wants a token and a
token stays inside its project; tokens are stored hashed; SQL metacharacters are plain data; body
limits hold before the body is read (live server, raw sockets); the dashboard honours the same auth.

Complements tests/monitor/api/test_auth.py (token basics, revocation) and tests/dashboard/test_app.py
(the ?token= cookie flow, CSRF, the 403 page)."""

from __future__ import annotations

import re
import select
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy import select as sql_select
from starlette.routing import Mount

from contracts.wire import API_PREFIX
from dashboard.auth import PUBLIC_PREFIXES
from tests.live_server import LiveServer
from tests.monitor.api.helpers import WRITE_BODIES as BODIES
from tests.monitor.api.helpers import bearer, history, metrics_batch, new_run

pytestmark = pytest.mark.timeout(120)

RUNS = f"{API_PREFIX}/runs"
OPEN_PATHS = {"/healthz", "/readyz", "/metrics"}
"""Probes and the Prometheus scrape stay open (README, Auth)."""


def api_operations(app: Any) -> list[tuple[str, str]]:
    """(method, path) of every operation the app publishes in its OpenAPI document."""
    paths: dict[str, dict[str, Any]] = app.openapi()["paths"]
    return sorted((method.upper(), path) for path, ops in paths.items() for method in ops)


@pytest.fixture
def two_projects(client: TestClient, app: Any) -> dict[str, Any]:
    """Project A with a run holding one point; a token for A and one for B (auth on)."""
    auth = app.state.lldmon.auth
    a, b = auth.create_token("proj-a")[0], auth.create_token("proj-b")[0]
    run_a = new_run(client, "a-run", headers=bearer(a), tags=["secret-tag"])
    ok = client.post(f"{RUNS}/{run_a}/metrics", json=metrics_batch([0], {"loss": [1.0]}), headers=bearer(a))
    assert ok.status_code == 200
    run_b = new_run(client, "b-run", headers=bearer(b))
    return {"a": a, "b": b, "run_a": run_a, "run_b": run_b}


def send(client: TestClient, method: str, path: str, run_id: int, headers: dict[str, str]) -> Any:
    template = path.removeprefix(API_PREFIX)
    assert (method, template) in BODIES or method == "GET", f"add a valid body for {method} {template}"
    body = BODIES.get((method, template))
    url = path.replace("{run_id}", str(run_id)).replace("{alert_id}", "1")
    return client.request(method, url, json=body, headers=headers)


def assert_project_a_untouched(client: TestClient, setup: dict[str, Any]) -> None:
    a, run_a = bearer(setup["a"]), setup["run_a"]
    run = client.get(f"{RUNS}/{run_a}", headers=a).json()
    assert (run["status"], run["directive_policy"]) == ("running", "alert")
    assert history(client, run_a, headers=a) == {"loss": {"steps": [0], "values": [1.0]}}
    assert client.get(f"{RUNS}/{run_a}/actions", headers=a).json()["step"] == []
    assert client.get(f"{RUNS}/{run_a}/directive", headers=a).json()["version"] == 0
    assert [r["name"] for r in client.get(RUNS, headers=a).json()] == ["a-run"]


def test_every_api_operation_needs_a_token(
    client: TestClient, app: Any, two_projects: dict[str, Any]
) -> None:
    operations = api_operations(app)
    assert len(operations) >= 19, operations
    refused = []
    for method, path in operations:
        for headers in ({}, bearer("lldm_forged"), {"Authorization": f"Basic {two_projects['a']}"}):
            response = send(client, method, path, two_projects["run_a"], headers)
            if path in OPEN_PATHS:
                assert response.status_code == 200, (method, path, response.text)
            else:
                assert response.status_code == 401, (method, path, headers, response.text)
                assert response.json()["error"]["code"] == "unauthorized"
                refused.append((method, path))
    assert {p for _, p in refused} == {p for _, p in operations} - OPEN_PATHS
    assert_project_a_untouched(client, two_projects)


def test_another_projects_token_can_neither_read_write_nor_list(
    client: TestClient, app: Any, two_projects: dict[str, Any]
) -> None:
    b = bearer(two_projects["b"])
    checked = 0
    for method, path in api_operations(app):
        if "{run_id}" not in path:
            continue
        response = send(client, method, path, two_projects["run_a"], b)
        assert response.status_code in (403, 404), (method, path, response.status_code, response.text)
        assert "a-run" not in response.text and "secret-tag" not in response.text
        checked += 1
    assert checked >= 15
    # Registering into A, listing or filtering A's runs: refused or empty.
    assert send(client, "POST", f"{RUNS}", 0, b).status_code == 403
    assert [r["name"] for r in client.get(RUNS, headers=b).json()] == ["b-run"]
    filters: list[dict[str, str | int]] = [
        {"project": "proj-a"},
        {"tag": "secret-tag"},
        {"project": "proj-a", "limit": 1000},
    ]
    for params in filters:
        assert client.get(RUNS, params=params, headers=b).json() == []
    assert_project_a_untouched(client, two_projects)


def database_dump(url: str) -> str:
    """Every row of every table as text: what a leaked backup would show."""
    from monitor.db.base import Base

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return "\n".join(
                repr(tuple(row))
                for table in Base.metadata.sorted_tables
                for row in conn.execute(sql_select(table))
            )
    finally:
        engine.dispose()


def test_tokens_appear_nowhere_in_the_database(client: TestClient, app: Any, settings: Any) -> None:
    from monitor.services.auth import hash_token

    tokens = [app.state.lldmon.auth.create_token(f"p{i}", f"name-{i}")[0] for i in range(3)]
    for token in tokens:  # used, so any "last used" bookkeeping would have run
        new_run(client, "r", headers=bearer(token))
    dump = database_dump(settings.resolved_database_url())
    for token in tokens:
        secret = token.removeprefix("lldm_")
        assert token not in dump and secret not in dump and secret[:16] not in dump
        assert hash_token(token) in dump  # what is stored instead


EVIL = [
    "'; DROP TABLE runs; --",
    '"; DELETE FROM step_metrics WHERE "1"="1',
    "%",
    "_",
    "a%b_c",
    "back\\slash\\\\",
    'O\'Brien "quoted"',
    "ünïcødé ✓ 训练 🚀 \u202eRTL",
    "x" * 128,
]


def test_sql_metacharacters_are_stored_verbatim_and_harmless(client: TestClient, settings: Any) -> None:
    ids = {}
    for i, evil in enumerate(EVIL):
        body = {"name": evil, "project": evil, "tags": [evil, f"t{i}"], "config": {evil: evil}}
        response = client.post(RUNS, json=body)
        assert response.status_code == 201, response.text
        run = response.json()
        assert (run["name"], run["project"], sorted(run["tags"]), run["config"]) == (
            evil,
            evil,
            sorted([evil, f"t{i}"]),
            {evil: evil},
        )
        ids[evil] = run["id"]
        batch = metrics_batch([0, 1], {evil: [1.0, 2.0], f"plain{i}": [3.0, 4.0]})
        assert client.post(f"{RUNS}/{run['id']}/metrics", json=batch).status_code == 200
        reason = {"llds": {"enabled": True}, "reason": evil}
        assert client.put(f"{RUNS}/{run['id']}/directive", json=reason).json()["reason"] == evil
    for evil, run_id in ids.items():
        assert client.get(f"{RUNS}/{run_id}").json()["name"] == evil
        # Exact matches only: `%` and `_` are not wildcards, quotes do not end a string.
        assert [r["id"] for r in client.get(RUNS, params={"tag": evil}).json()] == [run_id]
        assert [r["id"] for r in client.get(RUNS, params={"project": evil}).json()] == [run_id]
        assert history(client, run_id, names=[evil]) == {evil: {"steps": [0, 1], "values": [1.0, 2.0]}}
        names = [m["name"] for m in client.get(f"{RUNS}/{run_id}/metric-names").json()]
        assert evil in names and len(names) == 2
    assert client.get(RUNS, params={"tag": "%%"}).json() == []
    assert history(client, ids["_"], names=["a"]) == {}
    engine = create_engine(settings.resolved_database_url())
    with engine.connect() as conn:  # every table still there, nothing deleted
        assert conn.execute(text("SELECT count(*) FROM runs")).scalar_one() == len(EVIL)
        assert conn.execute(text("SELECT count(*) FROM step_metrics")).scalar_one() == 4 * len(EVIL)
    engine.dispose()


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("post", RUNS, {"name": "a\x00b"}, "body.name"),
        ("post", RUNS, {"name": "ok", "tags": ["a\x00"]}, "body.tags.0"),
        ("post", RUNS, {"name": "ok", "project": "\x00"}, "body.project"),
        ("put", "directive", {"llds": {"enabled": True}, "reason": "a\x00"}, "body.reason"),
        ("post", "metrics", metrics_batch([0], {"a\x00b": [1.0]}), "metrics.a\x00b"),
        ("get", f"{RUNS}?project=a%00", None, "query.project"),
        ("get", f"{RUNS}?tag=%00", None, "query.tag"),
        ("get", "metrics?names=a%00", None, "query.names.0"),
    ],
)
def test_nul_characters_are_a_clear_422(
    client: TestClient, method: str, path: str, body: Any, field: str
) -> None:
    """PostgreSQL cannot hold NUL in text (it used to be a 500 there); SQLite gets the same answer."""
    run_id = new_run(client, "existing")
    url = path if path.startswith("/") else f"{RUNS}/{run_id}/{path}"
    response = client.request(method.upper(), url, json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
    assert [r["name"] for r in client.get(RUNS).json()] == ["existing"]
    assert history(client, run_id) == {}


# --- body limit on a live server: before reading, for every route ---------------------------------

LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def small_limit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {"LLDMON_MAX_BODY_BYTES": str(LIMIT)}
    with LiveServer(tmp_path_factory.mktemp("limit"), env=env).start() as live:
        yield live


def read_status(sock: socket.socket, timeout: float) -> int | None:
    """Status code of a response that has arrived within `timeout` seconds, else None."""
    ready, _, _ = select.select([sock], [], [], timeout)
    if not ready:
        return None
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    match = re.match(rb"HTTP/1\.1 (\d{3})", head)
    return int(match.group(1)) if match else None


def request_head(port: int, method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def limited_paths(server: LiveServer) -> list[str]:
    run_id = httpx.post(f"{server.api}/runs", json={"name": "limits"}).json()["id"]
    return [f"{API_PREFIX}/runs/{run_id}/metrics", f"{API_PREFIX}/runs", "/dashboard/_dash-update-component"]


def test_declared_length_over_the_limit_is_413_before_the_body_is_sent(
    small_limit_server: LiveServer,
) -> None:
    for path in limited_paths(small_limit_server):
        with socket.create_connection(("127.0.0.1", small_limit_server.port), timeout=10) as sock:
            head = request_head(small_limit_server.port, "POST", path, {"Content-Length": str(10**10)})
            sock.sendall(head + b'{"batch_id"')  # 11 of 10 GB sent, and no more
            start = time.monotonic()
            status = read_status(sock, timeout=5.0)
            assert status == 413, (path, status)
            assert time.monotonic() - start < 5.0
    assert httpx.get(f"{small_limit_server.url}/healthz").status_code == 200


def test_chunked_body_without_length_is_cut_off_at_the_limit(small_limit_server: LiveServer) -> None:
    """A chunked body that never ends: the 413 must arrive while the client is still sending."""
    chunk = b" " * 16384
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    for path in limited_paths(small_limit_server)[:2]:
        with socket.create_connection(("127.0.0.1", small_limit_server.port), timeout=10) as sock:
            sock.sendall(
                request_head(small_limit_server.port, "POST", path, {"Transfer-Encoding": "chunked"})
            )
            sent, status = 0, None
            while status is None and sent < 64 * LIMIT:
                status = read_status(sock, timeout=0.002)
                if status is None:
                    try:
                        sock.sendall(framed)
                    except OSError:  # the server closed the connection after answering
                        status = read_status(sock, timeout=2.0)
                        break
                    sent += len(chunk)
            assert status == 413, (path, status, sent)
            assert sent < 64 * LIMIT  # answered long before the (endless) body was over
    assert httpx.get(f"{small_limit_server.url}/healthz").status_code == 200


# --- dashboard: same tokens, every Flask rule --------------------------------------------------------


def dashboard_rules(app: Any) -> list[tuple[str, str]]:
    """(method, URL) of every rule of the dashboard's Flask server, converters filled in."""
    mount = next(r for r in app.routes if isinstance(r, Mount) and r.path == "/dashboard")
    wsgi_middleware: Any = mount.app
    server = wsgi_middleware.app.wsgi()  # a2wsgi middleware -> LazyDashboard -> Flask
    out = []
    for rule in server.url_map.iter_rules():
        url = re.sub(
            r"<(?:\w+:)?(\w+)>", lambda m: "dash" if m.group(1) == "package_name" else "run/1", rule.rule
        )
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            out.append((method, "/dashboard" + url))
    return out


def test_every_dashboard_endpoint_refuses_without_a_valid_token(client: TestClient, app: Any) -> None:
    new_run(client, "visible-only-with-a-token", project="nq")
    app.state.lldmon.auth.create_token("nq")
    rules = dashboard_rules(app)
    assert ("POST", "/dashboard/_dash-update-component") in rules and len(rules) >= 9
    public = []
    for method, url in rules:
        for headers in ({}, bearer("lldm_forged"), {"Cookie": "lldmon_token=lldm_forged"}):
            response = client.request(method, url, headers=headers, json={} if method == "POST" else None)
            if url.startswith(tuple("/dashboard" + p for p in PUBLIC_PREFIXES)):
                public.append(url)
                assert response.status_code != 401, url
            else:
                assert response.status_code == 401, (method, url, headers, response.status_code)
            assert "visible-only-with-a-token" not in response.text
    assert {u.split("/")[2] for u in public} == {"_dash-component-suites", "assets", "_favicon.ico"}

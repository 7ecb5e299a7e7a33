"""Auth: open until a token exists; then bearer tokens scoped to one project."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from contracts.wire import API_PREFIX
from tests.monitor.api.helpers import history, metrics_batch, new_run

RUNS = f"{API_PREFIX}/runs"


@pytest.fixture
def tokens(app) -> dict[str, str]:  # type: ignore[no-untyped-def]
    auth = app.state.lldmon.auth
    return {"a": auth.create_token("proj-a")[0], "b": auth.create_token("proj-b")[0]}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_open_without_tokens(client: TestClient) -> None:
    assert client.get(RUNS).status_code == 200


def test_reads_and_writes_need_a_token(client: TestClient, tokens: dict[str, str]) -> None:
    assert client.get(RUNS).status_code == 401
    assert client.post(RUNS, json={"name": "x"}).status_code == 401
    assert client.get(RUNS, headers=bearer("lldm_forged")).status_code == 401
    assert client.get(RUNS, headers={"Authorization": f"Basic {tokens['a']}"}).status_code == 401
    assert client.get("/healthz").status_code == 200  # probes stay open
    run_id = new_run(client, headers=bearer(tokens["a"]))
    assert client.get(f"{RUNS}/{run_id}").status_code == 401
    assert (
        client.post(f"{RUNS}/{run_id}/metrics", json=metrics_batch([0], {"loss": [1.0]})).status_code == 401
    )


def test_token_is_scoped_to_its_project(client: TestClient, tokens: dict[str, str]) -> None:
    a, b = bearer(tokens["a"]), bearer(tokens["b"])
    run_a = new_run(client, "shared-name", headers=a)
    run_b = new_run(client, "shared-name", headers=b)
    assert run_a != run_b
    assert client.get(f"{RUNS}/{run_a}", headers=a).json()["project"] == "proj-a"
    # Project B can neither read, write, steer nor list project A's run: to B it does not exist.
    assert client.get(f"{RUNS}/{run_a}", headers=b).status_code == 404
    assert (
        client.post(
            f"{RUNS}/{run_a}/metrics", json=metrics_batch([0], {"loss": [1.0]}), headers=b
        ).status_code
        == 404
    )
    assert client.get(f"{RUNS}/{run_a}/metrics", headers=b).status_code == 404
    put = client.put(f"{RUNS}/{run_a}/directive", json={"llds": {"enabled": True}}, headers=b)
    assert put.status_code == 404
    assert [r["id"] for r in client.get(RUNS, headers=b).json()] == [run_b]
    assert [r["id"] for r in client.get(RUNS, params={"project": "proj-a"}, headers=b).json()] == []
    assert client.post(RUNS, json={"name": "sneaky", "project": "proj-a"}, headers=b).status_code == 403
    client.post(f"{RUNS}/{run_a}/metrics", json=metrics_batch([0], {"loss": [1.0]}), headers=a)
    assert history(client, run_a, headers=a)["loss"]["values"] == [1.0]


def test_tokens_are_stored_hashed_and_can_be_revoked(client: TestClient, app, settings) -> None:  # type: ignore[no-untyped-def]
    auth = app.state.lldmon.auth
    token, token_id = auth.create_token("proj-a", "ci")
    engine = create_engine(settings.resolved_database_url())
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT token_hash, prefix FROM api_tokens")).one()
    engine.dispose()
    assert token not in stored[0] and len(stored[0]) == 64
    assert token.startswith(stored[1]) and len(stored[1]) < 16
    assert client.get(RUNS, headers=bearer(token)).status_code == 200
    auth.revoke(token_id)
    assert client.get(RUNS, headers=bearer(token)).status_code == 401
    # With the only token revoked, auth stays on (tests/monitor/api/test_hardening_auth.py).
    assert client.get(RUNS).status_code == 401

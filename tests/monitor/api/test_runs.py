"""Runs: get-or-create registration, filters, finish, policy."""

from __future__ import annotations

from fastapi.testclient import TestClient

from contracts.wire import API_PREFIX
from tests.monitor.api.helpers import new_run

RUNS = f"{API_PREFIX}/runs"


def test_register_is_get_or_create(client: TestClient) -> None:
    first = client.post(
        RUNS, json={"name": "grpo-nq", "project": "p1", "config": {"lr": 1e-6}, "tags": ["grpo"]}
    )
    assert first.status_code == 201
    body = first.json()
    assert body["project"] == "p1" and body["config"] == {"lr": 1e-6} and body["tags"] == ["grpo"]
    assert body["status"] == "running" and body["directive_policy"] == "alert"
    assert body["created_at"].endswith(("Z", "+00:00"))
    client.post(f"{RUNS}/{body['id']}/finish", json={"status": "crashed"})
    again = client.post(RUNS, json={"name": "grpo-nq", "project": "p1", "tags": ["resumed"]})
    assert again.status_code == 200
    assert again.json()["id"] == body["id"]
    assert again.json()["status"] == "running"  # a resumed run is running again
    assert again.json()["tags"] == ["grpo", "resumed"]
    assert again.json()["config"] == {"lr": 1e-6}
    other = client.post(RUNS, json={"name": "grpo-nq", "project": "p2"})
    assert other.status_code == 201 and other.json()["id"] != body["id"]


def test_list_filters_by_project_status_and_tag(client: TestClient) -> None:
    a = new_run(client, "a", project="p1", tags=["llds"])
    b = new_run(client, "b", project="p1", tags=["grpo"])
    c = new_run(client, "c", project="p2", tags=["llds"])
    client.post(f"{RUNS}/{b}/finish")

    def ids(**params: str) -> list[int]:
        response = client.get(RUNS, params=params)
        assert response.status_code == 200
        return [r["id"] for r in response.json()]

    assert ids() == [c, b, a]
    assert ids(project="p1") == [b, a]
    assert ids(status="finished") == [b]
    assert ids(status="running", tag="llds") == [c, a]
    assert ids(tag="nope") == []
    assert client.get(RUNS, params={"status": "sleeping"}).status_code == 422


def test_get_and_finish(client: TestClient) -> None:
    run_id = new_run(client)
    assert client.get(f"{RUNS}/{run_id}").json()["name"] == "run-a"
    finished = client.post(f"{RUNS}/{run_id}/finish").json()
    assert finished["status"] == "finished" and finished["finished_at"] is not None
    assert client.post(f"{RUNS}/{run_id}/finish", json={"status": "running"}).status_code == 422
    assert client.get(f"{RUNS}/999").status_code == 404
    assert client.post(f"{RUNS}/999/finish").status_code == 404


def test_bad_run_bodies_name_the_field(client: TestClient) -> None:
    for body, field in [
        ({}, "body.name"),
        ({"name": ""}, "body.name"),
        ({"name": "x", "tags": "a"}, "body.tags"),
        ({"name": "x", "config": [1]}, "body.config"),
        ({"name": "x", "colour": "red"}, "body.colour"),
    ]:
        response = client.post(RUNS, json=body)
        assert response.status_code == 422, body
        assert response.json()["error"]["field"] == field


def test_directive_policy(client: TestClient) -> None:
    run_id = new_run(client)
    assert client.put(f"{RUNS}/{run_id}/policy", json={"policy": "auto"}).json()["directive_policy"] == "auto"
    assert client.put(f"{RUNS}/{run_id}/policy", json={"policy": "sometimes"}).status_code == 422


def test_metacharacters_are_stored_verbatim(client: TestClient) -> None:
    name = "x'); DROP TABLE runs; --"
    run_id = new_run(client, name, tags=["%_\\'\""])
    run = client.get(f"{RUNS}/{run_id}").json()
    assert run["name"] == name and run["tags"] == ["%_\\'\""]
    assert [r["id"] for r in client.get(RUNS, params={"tag": "%"}).json()] == []

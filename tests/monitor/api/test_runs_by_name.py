"""GET /runs?name=: exact-name lookup (what `trainer_hooks.history` and the CLI resolve names with)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from contracts.wire import API_PREFIX
from tests.monitor.api.helpers import new_run

RUNS = f"{API_PREFIX}/runs"


def test_runs_filtered_by_exact_name(client: TestClient, app) -> None:  # type: ignore[no-untyped-def]
    nq = new_run(client, "grpo-3b", project="nq")
    hotpot = new_run(client, "grpo-3b", project="hotpot")
    new_run(client, "grpo-3b-v2", project="nq")

    def ids(**params: object) -> list[int]:
        response = client.get(RUNS, params=params, headers=headers)
        assert response.status_code == 200, response.text
        return [r["id"] for r in response.json()]

    headers: dict[str, str] = {}
    assert ids(name="grpo-3b") == [hotpot, nq]  # newest first, no prefix matches
    assert ids(name="grpo-3b", project="nq") == [nq]
    assert ids(name="grpo") == []
    nul = client.get(RUNS, params={"name": "a\x00"})
    assert nul.status_code == 422 and nul.json()["error"]["field"] == "query.name"
    token, _ = app.state.lldmon.auth.create_token("nq")
    headers = {"Authorization": f"Bearer {token}"}
    assert ids(name="grpo-3b") == [nq]  # a token sees only its project's run of that name

"""Small request builders shared by the API tests."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi.testclient import TestClient

from contracts.wire import API_PREFIX


def new_run(
    client: TestClient, name: str = "run-a", headers: dict[str, str] | None = None, **extra: Any
) -> int:
    response = client.post(f"{API_PREFIX}/runs", json={"name": name, **extra}, headers=headers)
    assert response.status_code in (200, 201), response.text
    return int(response.json()["id"])


def metrics_batch(
    steps: list[int], metrics: dict[str, list[Any]], batch_id: str | None = None
) -> dict[str, Any]:
    return {"batch_id": batch_id or uuid.uuid4().hex, "steps": steps, "metrics": metrics}


def action_batch(n: int, step: int = 0, batch_id: str | None = None, source: str = "loss") -> dict[str, Any]:
    return {
        "batch_id": batch_id or uuid.uuid4().hex,
        "step": [step] * n,
        "traj_index": list(range(n)),
        "action_index": [0] * n,
        "n_tokens": [5] * n,
        "delta": [-0.1 * i for i in range(n)],
        "old_logp_mean": [-1.0] * n,
        "advantage": [1.0 if i % 2 == 0 else -1.0 for i in range(n)],
        "reward": [1.0 if i % 2 == 0 else 0.0 for i in range(n)],
        "is_answer": [i % 3 == 0 for i in range(n)],
        "source": [source] * n,
    }


def history(
    client: TestClient, run_id: int, headers: dict[str, str] | None = None, **params: Any
) -> dict[str, Any]:
    response = client.get(f"{API_PREFIX}/runs/{run_id}/metrics", params=params, headers=headers)
    assert response.status_code == 200, response.text
    series: dict[str, Any] = response.json()["series"]
    return series


WRITE_BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/runs"): {"name": "intruder", "project": "proj-a"},
    ("POST", "/runs/{run_id}/finish"): {"status": "crashed"},
    ("PUT", "/runs/{run_id}/policy"): {"policy": "auto"},
    ("POST", "/runs/{run_id}/metrics"): metrics_batch([99], {"loss": [-1.0]}, batch_id="evil-m"),
    ("POST", "/runs/{run_id}/actions"): action_batch(2, step=99, batch_id="evil-a"),
    ("POST", "/runs/{run_id}/combined"): {
        "metrics": metrics_batch([99], {"loss": [-1.0]}, batch_id="evil-cm"),
        "actions": action_batch(2, step=99, batch_id="evil-ca"),
    },
    ("PUT", "/runs/{run_id}/directive"): {"llds": {"enabled": True, "lam": 0.9}, "reason": "evil"},
    ("PUT", "/runs/{run_id}/detector"): {"overrides": {}},
    ("POST", "/runs/{run_id}/alerts/{alert_id}/ack"): None,
    ("POST", "/runs/{run_id}/heartbeat"): None,
    ("PUT", "/runs/{run_id}/liveness"): {"stall_after_s": 600},
}
"""A valid body per write route (path under /api/v1), so that a refusal is about the token or the
run, never about the body. Security tests enumerate the routes and ask for an entry here."""


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}

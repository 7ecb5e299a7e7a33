"""Rollbacks through the API, on SQLite and PostgreSQL: policy `heal` answers a collapse with a rollback
request to the decay checkpoint (LLDS on, learning rate halved); the trainer's `directive/rollback_to`
rolls the run's history back (metrics, phase events, detector state) and is recorded; after the limit,
`heal` requests a stop and raises `heal_exhausted`; a rolled-back run re-judged on the same data finds
what it found the first time (the detector's rewind equals judging from scratch)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from contracts.directive import APPLIED_VERSION_METRIC, ROLLBACK_METRIC, LeverTracker
from contracts.wire import ALERT_HEAL_EXHAUSTED, API_PREFIX, encode_float
from lldmon_lab.scenarios import Scenario, collapse_scenario
from monitor.api.app import create_app
from tests.monitor.api.helpers import new_run


def batch(
    scenario: Scenario, lo: int, hi: int, extra: dict[int, dict[str, float]] | None = None
) -> dict[str, Any]:
    """Steps `lo` to `hi` (indices) of the scenario as a metrics batch, with `extra` metrics by step."""
    steps = [int(s) for s in scenario.steps[lo:hi]]
    metrics: dict[str, list[Any]] = {
        name: [
            encode_float(float(v)) if p else None
            for v, p in zip(values[lo:hi], scenario.present[name][lo:hi], strict=True)
        ]
        for name, values in scenario.values.items()
    }
    for step, values in (extra or {}).items():
        for name, value in values.items():
            metrics.setdefault(name, [None] * len(steps))[steps.index(step)] = value
    return {"batch_id": uuid.uuid4().hex, "steps": steps, "metrics": metrics}


def post(client: TestClient, run_id: int, body: dict[str, Any]) -> dict[str, Any]:
    reply = client.post(f"{API_PREFIX}/runs/{run_id}/metrics", json=body)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def get(client: TestClient, path: str) -> Any:
    reply = client.get(f"{API_PREFIX}{path}")
    assert reply.status_code == 200, reply.text
    return reply.json()


def stream_until(
    client: TestClient, run_id: int, scenario: Scenario, done: Any
) -> tuple[int, dict[str, Any]]:
    """Send the scenario step by step until `done(ack)`; (index of the last step sent, its ack)."""
    for i in range(len(scenario.steps)):
        ack = post(client, run_id, batch(scenario, i, i + 1))
        if done(ack):
            return i, ack
    raise AssertionError("the condition never held")


def heal_run(client: TestClient, name: str) -> int:
    run_id = new_run(client, name)
    reply = client.put(f"{API_PREFIX}/runs/{run_id}/policy", json={"policy": "heal"})
    assert reply.status_code == 200, reply.text
    return run_id


def heal_client(settings: Any, **update: Any) -> TestClient:
    return TestClient(create_app(settings.model_copy(update=update)))


def test_heal_rolls_a_collapse_back_to_its_decay_checkpoint(settings: Any) -> None:
    scenario = collapse_scenario(3)
    with heal_client(settings) as client:
        run_id = heal_run(client, "heal-me")
        last, ack = stream_until(client, run_id, scenario, lambda a: a["directive"]["rollback"] > 0)
        directive = ack["directive"]
        phases = get(client, f"/runs/{run_id}/events")
        decay = max(e["step"] for e in phases if e["phase"] == "decay")
        collapse = max(e["step"] for e in phases if e["phase"] == "collapse")
        assert decay < collapse <= int(scenario.steps[last])
        assert directive["rollback"] == directive["version"] and directive["rollback_to"] == decay
        assert directive["llds"]["enabled"] and directive["lr_scale"] == 0.5
        assert f"rollback to step {decay} requested" in directive["reason"] and "heal" in directive["reason"]
        levers = LeverTracker().take(directive)
        assert levers.rollback and levers.rollback_to == decay and levers.lr_scale == 0.5

        # the trainer restored checkpoint-<decay> and trains step decay + 1 again, acknowledging
        from_step = int(scenario.steps[last])
        at = list(scenario.steps).index(decay) + 1
        redo = batch(
            scenario,
            at,
            at + 3,
            {decay + 1: {ROLLBACK_METRIC: float(decay), APPLIED_VERSION_METRIC: float(directive["version"])}},
        )
        ack = post(client, run_id, redo)
        assert ack["directive"]["applied_version"] == directive["version"]
        [rollback] = get(client, f"/runs/{run_id}/rollbacks")
        assert (rollback["from_step"], rollback["to_step"], rollback["steps_redone"]) == (
            from_step,
            decay,
            from_step - decay,
        )
        assert rollback["version"] == directive["version"]
        assert any(p["phase"] == "collapse" for p in rollback["undone_phases"])
        assert all(e["step"] <= decay + 3 for e in get(client, f"/runs/{run_id}/events"))
        assert not any(e["phase"] == "collapse" for e in get(client, f"/runs/{run_id}/events"))
        summary = get(client, f"/runs/{run_id}/summary")
        assert summary["steps"]["last"] == decay + 3 and summary["run"]["last_step"] == decay + 3
        assert summary["run"]["phase"] != "collapse"
        assert summary["rollbacks"] == [rollback]
        series = get(client, f"/runs/{run_id}/metrics?names=reward/mean")["series"]["reward/mean"]
        assert max(series["steps"]) == decay + 3  # the undone steps' metrics are gone

        # the same collapse again: the next rollback goes before the checkpoint this one restored
        # (restoring it again would replay the same collapse)
        for i in range(at + 3, len(scenario.steps)):
            again = post(client, run_id, batch(scenario, i, i + 1))["directive"]
            if again["rollback"] > directive["rollback"]:
                break
        else:
            raise AssertionError("no second rollback")
        assert again["rollback_to"] == decay - 1 and again["lr_scale"] == 0.25


def test_heal_after_its_last_rollback_requests_a_stop_and_says_why(settings: Any) -> None:
    with heal_client(settings, heal_max_rollbacks=0) as client:
        run_id = heal_run(client, "heal-exhausted")
        _, ack = stream_until(client, run_id, collapse_scenario(3), lambda a: a["directive"]["stop"] > 0)
        directive = ack["directive"]
        assert directive["rollback"] == 0 and directive["rollback_to"] is None
        assert "0 rollbacks used (limit 0)" in directive["stop_reason"]
        [alert] = [a for a in get(client, f"/runs/{run_id}/alerts") if a["kind"] == ALERT_HEAL_EXHAUSTED]
        assert alert["severity"] == "critical" and alert["status"] == "open"
        assert "heal gave up" in alert["message"]


def test_a_rolled_back_run_judged_again_on_the_same_steps_finds_the_same_phases(settings: Any) -> None:
    """The rewind puts the detector where judging from scratch would: re-sending the undone steps'
    data unchanged gives the phase history of the first attempt, and the alerts it had."""
    scenario = collapse_scenario(5)
    n = len(scenario.steps)
    with heal_client(settings) as client:
        run_id = new_run(client, "replayed")  # policy alert: nothing steers
        for lo in range(0, n, 10):
            post(client, run_id, batch(scenario, lo, lo + 10))
        first = [(e["step"], e["phase"]) for e in get(client, f"/runs/{run_id}/events")]
        kinds = {a["kind"] for a in get(client, f"/runs/{run_id}/alerts")}
        assert ("collapse" in {p for _, p in first}) and len(first) >= 3
        to_step = first[1][0] + 2  # after the second phase change, before the last ones
        reply = client.put(
            f"{API_PREFIX}/runs/{run_id}/directive", json={"rollback": {"to_step": to_step}, "reason": "test"}
        )
        assert reply.status_code == 200, reply.text
        assert (reply.json()["rollback_to"], reply.json()["lr_scale"]) == (to_step, 1.0)
        at = list(scenario.steps).index(to_step) + 1
        post(client, run_id, batch(scenario, at, at + 7, {to_step + 1: {ROLLBACK_METRIC: float(to_step)}}))
        kept = [(s, p) for s, p in first if s <= to_step]
        assert [(e["step"], e["phase"]) for e in get(client, f"/runs/{run_id}/events")] == [
            (s, p) for s, p in first if s <= to_step + 7
        ]
        [rollback] = get(client, f"/runs/{run_id}/rollbacks")
        assert [(p["step"], p["phase"]) for p in rollback["undone_phases"]] == first[len(kept) :]
        for lo in range(at + 7, n, 10):
            post(client, run_id, batch(scenario, lo, lo + 10))
        assert [(e["step"], e["phase"]) for e in get(client, f"/runs/{run_id}/events")] == first
        assert {a["kind"] for a in get(client, f"/runs/{run_id}/alerts")} == kinds


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (50.0, "not below its own step"),
        (30.5, "a fraction"),
        (-1.0, "negative"),
        (45.0, "not below the last step"),
    ],
)
def test_a_rollback_value_that_cannot_be_one_changes_nothing(
    client: TestClient, value: float, why: str
) -> None:
    run_id = new_run(client, f"bad-rollback-{uuid.uuid4().hex[:6]}")
    steps = list(range(1, 46))
    post(
        client, run_id, {"batch_id": uuid.uuid4().hex, "steps": steps, "metrics": {"reward/mean": [0.5] * 45}}
    )
    step = 50 if why != "not below the last step" else 46
    post(
        client, run_id, {"batch_id": uuid.uuid4().hex, "steps": [step], "metrics": {ROLLBACK_METRIC: [value]}}
    )
    assert get(client, f"/runs/{run_id}/rollbacks") == [], why
    assert get(client, f"/runs/{run_id}/summary")["steps"]["count"] == 46, why


def test_a_manual_rollback_request_is_checked(client: TestClient) -> None:
    run_id = new_run(client, "manual-rollback")
    for body, field in (
        ({"rollback": {"to_step": -1}}, "to_step"),
        ({"rollback": {"to_step": 3, "lr_scale": 0}}, "lr_scale"),
        ({"rollback": {"to_step": 3, "lr_scale": 1.5}}, "lr_scale"),
        ({"rollback": {"lr_scale": 0.5}}, "to_step"),
    ):
        reply = client.put(f"{API_PREFIX}/runs/{run_id}/directive", json=body)
        assert reply.status_code == 422 and field in reply.text, (body, reply.text)
    first = client.put(
        f"{API_PREFIX}/runs/{run_id}/directive", json={"rollback": {"to_step": 3, "lr_scale": 0.5}}
    )
    second = client.put(
        f"{API_PREFIX}/runs/{run_id}/directive", json={"rollback": {"to_step": 2, "lr_scale": 0.5}}
    )
    assert (first.json()["rollback"], first.json()["lr_scale"]) == (1, 0.5)
    assert (second.json()["rollback"], second.json()["rollback_to"], second.json()["lr_scale"]) == (
        2,
        2,
        0.25,
    )
    assert "rollback to step 2" in second.json()["reason"]
    third = client.put(f"{API_PREFIX}/runs/{run_id}/directive", json={"checkpoint": True})
    assert (third.json()["rollback"], third.json()["rollback_to"], third.json()["lr_scale"]) == (2, 2, 0.25)

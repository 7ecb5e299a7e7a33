"""The detector's directive says once why it changed, at the step the run changed phase: the LLDS switch
and the checkpoint request of one phase entry are one cause, not two sentences with two steps."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from contracts.wire import API_PREFIX
from lldmon_lab.scenarios import collapse_scenario
from monitor.api.app import create_app
from tests.monitor.api.test_detection_flow import stream


def test_first_auto_directive_names_the_decay_entry_once_at_its_step(settings) -> None:  # type: ignore[no-untyped-def]
    app = create_app(settings)
    try:
        with TestClient(app) as client:
            run_id = client.post(f"{API_PREFIX}/runs", json={"name": "replay"}).json()["id"]
            client.put(f"{API_PREFIX}/runs/{run_id}/policy", json={"policy": "auto"})
            stream(client, run_id, collapse_scenario(7))  # the demo's replay, batches of 10 steps
            events = client.get(f"{API_PREFIX}/runs/{run_id}/events").json()
            history = client.get(f"{API_PREFIX}/runs/{run_id}/directives").json()
    finally:
        app.state.lldmon.db.dispose()
    decay = next(e for e in events if e["phase"] == "decay")
    first = min(history, key=lambda d: d["version"])
    reason = first["reason"]
    assert first["llds"]["enabled"] and first["checkpoint"], first
    assert reason.count("entered decay") == 1, reason
    assert re.findall(r"step (\d+)", reason) == [str(decay["step"])], reason
    assert "LLDS on" in reason and "checkpoint requested" in reason


def test_reason_groups_the_actions_of_one_phase_entry() -> None:
    from monitor.domain import DirectiveInfo
    from monitor.services.directive_policy import DirectiveRule, decide, decide_levers, explain

    off = DirectiveInfo()
    change = decide("auto", "decay", 99, off, DirectiveRule(), phase_since=96)
    levers = decide_levers("auto", [("decay", 96)], off)
    assert change is not None and levers is not None
    assert explain([*change.causes, *levers.causes]) == (
        "auto: run entered decay (step 96); LLDS on, lambda 0.2, checkpoint requested"
    )
    # two rules acting on one entry: still one clause; a second event gets its own
    opted_in = DirectiveInfo(version=2, stop_on_collapse=True)
    collapse = decide("auto", "collapse", 152, off, DirectiveRule(trigger_phase="collapse"), phase_since=150)
    stop = decide_levers("auto", [("decay", 120), ("collapse", 150)], opted_in)
    assert collapse is not None and stop is not None
    assert explain([*collapse.causes, *stop.causes]) == (
        "auto, stop-on-collapse: run entered collapse (step 150); LLDS on, lambda 0.2, stop requested; "
        "auto: run entered decay (step 120); checkpoint requested"
    )
    assert stop.reason.count("entered collapse") == 1

"""The dashboard's lever buttons (issue 15): checkpoint now, stop (always confirmed: it ends the run),
stop on collapse (a toggle); the status line and the timeline show requests and acknowledgements."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient

from contracts.directive import APPLIED_VERSION_METRIC
from contracts.wire import API_PREFIX
from dashboard.callbacks.base import DashContext
from dashboard.callbacks.directive import apply_action
from dashboard.data import run_context
from dashboard.pages.run import lever_text, timeline_rows
from monitor.api.state import AppState
from monitor.domain import Principal

OPEN = Principal()


def test_lever_buttons_and_what_the_page_shows(
    client: TestClient, dctx: DashContext, state: AppState
) -> None:
    run_id = client.post(f"{API_PREFIX}/runs", json={"name": "levers"}).json()["id"]
    done = apply_action(dctx, OPEN, run_id, "checkpoint-now", None, None)
    assert done.ok and done.confirm is None and "checkpoint requested, directive v1" in done.message
    asked = apply_action(dctx, OPEN, run_id, "stop-now", None, None)  # a running run: still asked
    assert asked.confirm is not None and "levers" in asked.confirm and not asked.ok
    assert state.directives.current(OPEN, run_id).stop == 0  # nothing written before the answer
    assert apply_action(dctx, OPEN, run_id, "stop-now", None, None, confirmed=True).ok
    toggled = apply_action(dctx, OPEN, run_id, "stop-on-collapse", None, None)
    assert toggled.ok and "stop on collapse on" in toggled.message
    assert "stop on collapse off" in apply_action(dctx, OPEN, run_id, "stop-on-collapse", None, None).message
    d = state.directives.current(OPEN, run_id)
    assert (d.version, d.checkpoint, d.stop, d.stop_on_collapse, d.llds_manual) == (4, 1, 2, False, False)
    assert "pending" in lever_text(d)

    # The trainer acknowledges v2 at step 7 (its metric); the timeline says so, v3 and v4 not yet.
    body = {"batch_id": uuid.uuid4().hex, "steps": [7], "metrics": {APPLIED_VERSION_METRIC: [2.0]}}
    assert client.post(f"{API_PREFIX}/runs/{run_id}/metrics", json=body).status_code == 200
    rows = {
        r.title.split(":")[0]: r
        for r in timeline_rows(run_context(state, OPEN, run_id))
        if r.kind == "directive"
    }
    assert "checkpoint #1" in rows["v1"].title and "stop #2" in rows["v2"].title
    assert "acknowledged at step 7" in rows["v1"].detail and "acknowledged at step 7" in rows["v2"].detail
    assert "not acknowledged yet" in rows["v3"].detail
    assert "trainer acknowledged v2 (v4 pending)" in lever_text(state.directives.current(OPEN, run_id))

"""Issue 16 on the dashboard (items 6, 8, 19 and the compare legend of 15), on SQLite and PostgreSQL.

A callback's arguments are whatever JSON a browser, or anyone holding a token, posts to Dash's update
endpoint: every callback is called there with values of every JSON type, and must answer (200 or 204)
instead of a 500, within bounded work. Writes from the dashboard pass the API's own request validation.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import plotly.graph_objects as go
import pytest
from dash import Patch, no_update
from fastapi.testclient import TestClient

from contracts import metrics as M
from contracts.wire import API_PREFIX
from dashboard.callbacks.actions import CHUNK_STEPS, action_figures
from dashboard.callbacks.base import DashContext
from dashboard.callbacks.compare import compare_metric_figure, graph_slots, url_search
from dashboard.callbacks.directive import apply_action, set_llds, set_policy
from dashboard.callbacks.routing import render_page
from dashboard.callbacks.run_panels import load_panels, panel_load, refresh_panels
from dashboard.callbacks.run_summary import run_summary
from dashboard.figures import panel_figure
from dashboard.inputs import MAX_ACTION_WINDOW
from dashboard.pages.compare import parse_query, query_string
from dashboard.panels import COMPARE_DEFAULT_METRICS, PANELS, PANELS_BY_KEY
from monitor.api.state import AppState
from monitor.domain import Principal, Series
from monitor.errors import InvalidInput
from tests.monitor.api.helpers import action_batch, metrics_batch, new_run

OPEN = Principal()
BIGINT = 2**63 - 1
HOSTILE: list[Any] = [
    "1",
    None,
    {},
    [],
    True,
    -1,
    2**31,
    2**63,
    10**30,
    1e30,
    -1e30,
    float("nan"),
    float("inf"),
    "x\x00y",
    "\ud800",
    "a" * 5000,
    [1, "2", None, {}],
]
"""Values of every JSON type, out of every range, and text no database takes."""
LINK = '<a href="http://x">click</a>'


def post(client: TestClient, path: str, body: Any) -> Any:
    """POST a JSON body as a browser could (NaN, Infinity and lone surrogates included)."""
    return client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


def ingest(client: TestClient, run_id: int, steps: list[int], metrics: dict[str, list[Any]]) -> None:
    response = post(client, f"{API_PREFIX}/runs/{run_id}/metrics", metrics_batch(steps, metrics))
    assert response.status_code == 200, response.text


def components(tree: Any) -> Iterator[Any]:
    """Every Dash component in a layout tree."""
    yield tree
    children = getattr(tree, "children", None)
    for child in children if isinstance(children, list | tuple) else [children]:
        if hasattr(child, "to_plotly_json"):
            yield from components(child)


def by_id(tree: Any, component_id: str) -> Any:
    return next(c for c in components(tree) if getattr(c, "id", None) == component_id)


def strings(value: Any) -> Iterator[str]:
    """Every string in a figure (keys excluded): what plotly may render as text."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from strings(item)


# --- item 6: every callback input, hostile ---------------------------------------------------------------


def _output_spec(output: str) -> Any:
    parts = output[2:-2].split("...") if output.startswith("..") else [output]
    specs = []
    for part in parts:
        component, _, prop = part.rpartition(".")
        specs.append(
            {"id": json.loads(component) if component.startswith("{") else component, "property": prop}
        )
    return specs if output.startswith("..") else specs[0]


def callback_body(dep: dict[str, Any], legit: dict[str, Any], target: Any = None, value: Any = None) -> Any:
    """The request dash-renderer sends for callback `dep`: legit values, `value` for the `target` input
    or state (triggered by it if it is an input)."""
    body: dict[str, Any] = {"output": dep["output"], "outputs": _output_spec(dep["output"]), "state": []}
    for kind in ("inputs", "state"):
        for item in dep[kind]:
            component = item["id"]
            given = value if item is target else legit.get(f"{component}.{item['property']}")
            if component.startswith("{"):  # the compare page's graphs: the metric is in the id
                component = given = {
                    "metric": value if item is target else M.REWARD_MEAN,
                    "type": "compare-graph",
                }
                body["outputs"] = {"id": component, "property": "figure"}
            body.setdefault(kind, []).append({"id": component, "property": item["property"], "value": given})
    trigger = target if target in dep["inputs"] else dep["inputs"][0]
    component = body["inputs"][dep["inputs"].index(trigger)]["id"]
    component = json.dumps(component, separators=(",", ":")) if isinstance(component, dict) else component
    body["changedPropIds"] = [f"{component}.{trigger['property']}"]
    return body


@pytest.mark.timeout(240)
def test_every_callback_answers_hostile_input_without_an_error(client: TestClient, state: AppState) -> None:
    run_id = new_run(client, "target", project="nq")
    ingest(client, run_id, [0, 1, BIGINT], {M.REWARD_MEAN: [0.1, 0.2, 0.3], M.GRAD_NORM: [1.0, 2.0, 3.0]})
    assert post(client, f"{API_PREFIX}/runs/{run_id}/actions", action_batch(6, step=1)).status_code == 200
    _, cursors = load_panels(state, OPEN, run_id)  # what the page holds after its first load
    legit: dict[str, Any] = {
        "url.pathname": f"/dashboard/run/{run_id}",
        "url.search": "",
        "run-id.data": run_id,
        "run-tick.n_intervals": 3,
        "action-window.value": 100,
        "action-source.value": "all",
        "llds-lam.value": 0.2,
        "policy.value": "alert",
        "compare-runs.value": [run_id],
        "compare-metrics.value": [M.REWARD_MEAN],
        **{f"cursor-{p.key}.data": c for p, c in zip(PANELS, cursors, strict=True)},
    }
    dependencies = client.get("/dashboard/_dash-dependencies").json()
    failures: dict[str, list[str]] = {}
    started = time.monotonic()
    for dep in dependencies:
        assert post(client, "/dashboard/_dash-update-component", callback_body(dep, legit)).status_code in (
            200,
            204,
        ), dep["output"]  # the live refresh of a run at the last BIGINT step included
        for target in [*dep["inputs"], *dep["state"]]:
            for hostile in HOSTILE:
                response = post(
                    client, "/dashboard/_dash-update-component", callback_body(dep, legit, target, hostile)
                )
                if response.status_code not in (200, 204):
                    where = f"{dep['output'][:50]} <- {target['id']}.{target['property']}"
                    failures.setdefault(where, []).append(f"{hostile!r:.24}: {response.status_code}")
    assert failures == {}
    assert time.monotonic() - started < 150  # bounded work per request (no window of 10**30 steps)


def test_action_window_and_step_are_clamped_and_run_ids_checked(
    client: TestClient, state: AppState, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = new_run(client, "actions")
    for step in (10, 10**6):
        assert (
            post(client, f"{API_PREFIX}/runs/{run_id}/actions", action_batch(4, step=step)).status_code == 200
        )
    ingest(client, run_id, [10**6], {M.REWARD_MEAN: [0.5]})
    calls = 0
    read = state.query.actions

    def counted(*args: Any, **kwargs: Any) -> dict[str, list[Any]]:
        nonlocal calls
        calls += 1
        if calls > 200:
            raise AssertionError("the action window is not bounded")
        return read(*args, **kwargs)

    monkeypatch.setattr(state.query, "actions", counted)
    hist, quantiles = (go.Figure(f) for f in action_figures(state, OPEN, run_id, 10**6, 10**9, "all"))
    assert calls <= MAX_ACTION_WINDOW // CHUNK_STEPS + 3  # the window's chunks and the step itself
    assert list(next(t for t in quantiles.data if t.name == "median").x) == [10**6]  # step 10 is outside
    assert "step 1000000" in hist.layout.meta["title"]
    # A step past the BIGINT column: the last step with records, not a database error.
    for step in (1e30, 2**63, 10**30):
        hist, _ = (go.Figure(f) for f in action_figures(state, OPEN, run_id, step, 100, "probe"))
        assert hist.layout.annotations[0].text == "no action records at or before this step"
    for bad_run in ("1", None, {}, [], True, 1.0):
        with pytest.raises(InvalidInput, match="run id must be an integer"):
            action_figures(state, OPEN, bad_run, None, 100, "all")
    for field, args in (
        ("step", ("5", 100, "all")),
        ("window", (None, {}, "all")),
        ("source", (None, 100, 3)),
    ):
        with pytest.raises(InvalidInput, match=field) as raised:
            action_figures(state, OPEN, run_id, *args)
        assert raised.value.field == field


def test_a_run_at_the_last_bigint_step_refreshes(
    client: TestClient, dctx: DashContext, state: AppState
) -> None:
    run_id = new_run(client, "at-the-end")
    ingest(client, run_id, [5, BIGINT], {M.REWARD_MEAN: [0.1, 0.2], M.GRAD_NORM: [1.0, 3.0]})
    figures, cursors = load_panels(state, OPEN, run_id)
    assert go.Figure(figures[0]).data[0].x[-1] == BIGINT
    outputs, new_cursors = refresh_panels(state, OPEN, run_id, cursors)
    assert outputs == [no_update] * len(PANELS) and new_cursors == [no_update] * len(PANELS)
    assert "last step 9223372036854775807" in str(run_summary(dctx, OPEN, run_id)[0])
    hist, _ = action_figures(state, OPEN, run_id, None, 500, "all")
    assert hist["layout"]["annotations"][0]["text"] == "no action records at or before this step"


def test_crafted_cursors_are_ignored(client: TestClient, state: AppState) -> None:
    run_id = new_run(client, "cursors")
    ingest(client, run_id, [0, 1], {M.REWARD_MEAN: [0.1, 0.2]})
    _, cursors = load_panels(state, OPEN, run_id)
    crafted: list[Any] = [
        {**cursors[0], "last_step": "x"},
        {**cursors[1], "last_step": 1e30},
        {**cursors[2], "present": ["not/a-panel-metric"]},
        {**cursors[3], "appended": {}},
        {**cursors[4], "run_id": str(run_id)},
        {**cursors[5], "last_step": 2**70},
        "cursor",
        [],
        {**cursors[8], "signature": None, "band_end": "x"},
    ]
    ingest(client, run_id, [2], {M.REWARD_MEAN: [0.3]})
    outputs, _ = refresh_panels(state, OPEN, run_id, crafted)
    assert outputs == [no_update] * len(PANELS)
    outputs, _ = refresh_panels(state, OPEN, run_id, cursors[:2])  # fewer cursors than panels
    assert isinstance(outputs[0], Patch) and outputs[2:] == [no_update] * (len(PANELS) - 2)
    assert refresh_panels(state, OPEN, "1", cursors) == ([no_update] * len(PANELS), [no_update] * len(PANELS))


# --- item 8: dashboard writes are validated like the API's ----------------------------------------------


def test_directive_controls_validate_exactly_like_the_api(
    client: TestClient, dctx: DashContext, state: AppState
) -> None:
    run_id = new_run(client, "steered")
    accepted = 0
    for lam in (0, 0.25, 1e6, 1e6 + 1, 1e308, -1.0, -1e-9, "0.3", "abc", {}, [], float("nan"), float("inf")):
        api = client.put(
            f"{API_PREFIX}/runs/{run_id}/directive",
            content=json.dumps({"llds": {"enabled": True, "lam": lam}}),
            headers={"content-type": "application/json"},
        )
        message, ok = set_llds(dctx, OPEN, run_id, True, lam)
        assert ok == (api.status_code == 200), (lam, message, api.text)
        assert api.status_code in (200, 422)
        if not ok:
            assert message.startswith("422: "), message
        accepted += 2 if ok else 0
    assert set_llds(dctx, OPEN, run_id, True, 1e308) == (
        "422: llds.lam: lambda must be a finite number in [0, 1e+06], got 1e+308",
        False,
    )
    history = state.directives.history(OPEN, run_id)
    assert len([d for d in history if d.version > 0]) == accepted
    assert max(d.llds.lam for d in history) <= 1e6  # nothing out of bounds ever reaches a trainer
    assert set_llds(dctx, OPEN, run_id, False, None)[1]  # an empty lambda box: the default
    message, ok = set_policy(dctx, OPEN, run_id, {})
    assert not ok and message.startswith("422: policy: ")
    assert state.runs.get(OPEN, run_id).directive_policy == "alert"


# --- item 19: confirmation on finished runs -------------------------------------------------------------


def test_directive_changes_on_a_finished_run_ask_first(
    client: TestClient, dctx: DashContext, state: AppState
) -> None:
    run_id = new_run(client, "done-run")
    assert client.post(f"{API_PREFIX}/runs/{run_id}/finish", json={"status": "finished"}).status_code == 200
    asked = apply_action(dctx, OPEN, run_id, "llds-on", 0.25, None)
    assert asked.confirm is not None and not asked.ok
    assert "done-run" in asked.confirm and "finished" in asked.confirm and "0.25" in asked.confirm
    assert state.directives.current(OPEN, run_id).version == 0  # nothing written before the answer
    done = apply_action(dctx, OPEN, run_id, "llds-on", 0.25, None, confirmed=True)
    assert done.ok and done.confirm is None and "LLDS on (λ=0.25)" in done.message
    assert state.directives.current(OPEN, run_id).llds.lam == pytest.approx(0.25)
    asked = apply_action(dctx, OPEN, run_id, "policy-apply", None, "auto")
    assert asked.confirm is not None and state.runs.get(OPEN, run_id).directive_policy == "alert"
    assert apply_action(dctx, OPEN, run_id, "policy-apply", None, "auto", confirmed=True).ok
    # Bad input is refused before anyone is asked.
    refused = apply_action(dctx, OPEN, run_id, "llds-on", 1e308, None)
    assert refused.confirm is None and not refused.ok and refused.message.startswith("422: llds.lam")
    assert not apply_action(dctx, OPEN, run_id, "nonsense", 0.2, None).ok
    # A running run is steered at once.
    live = new_run(client, "live-run")
    now = apply_action(dctx, OPEN, live, "llds-on", None, None)
    assert now.ok and now.confirm is None and state.directives.current(OPEN, live).llds.enabled


# --- item 15 (dashboard part): user text in Plotly figures is escaped -----------------------------------


def test_user_text_in_figures_is_html_escaped(client: TestClient, state: AppState) -> None:
    weird_metric = '<a href="http://x">m</a>'
    first = new_run(client, LINK, project="nq")
    second = new_run(client, "<b>", project="nq")
    for run_id in (first, second):
        ingest(client, run_id, [0, 1], {M.REWARD_MEAN: [0.1, 0.2], weird_metric: [1.0, 2.0]})
    reason = client.put(
        f"{API_PREFIX}/runs/{first}/directive", json={"llds": {"enabled": True, "lam": 0.2}, "reason": LINK}
    )
    assert reason.status_code == 200
    figures = [
        compare_metric_figure(state, OPEN, [first, second], M.REWARD_MEAN),
        compare_metric_figure(state, OPEN, [first, second], weird_metric),
        compare_metric_figure(state, OPEN, [first, second], "<b>nothing</b>"),  # empty: "no data for ..."
        graph_slots([weird_metric])[0].children[1].figure,
    ]
    for figure in figures:
        texts = list(strings(figure))
        assert not [t for t in texts if "<a " in t or "<b>" in t], texts
    reward = json.dumps(figures[0])
    assert '&lt;a href=\\"http://x\\"&gt;click&lt;/a&gt; (#' in reward and "&lt;b&gt; (#" in reward
    # The graph's title is an HTML heading: Dash sets its text as text, so the name shows as written.
    assert graph_slots([weird_metric])[0].children[0].children == weird_metric
    assert [t["name"] for t in figures[0]["data"]] == [
        f'&lt;a href="http://x"&gt;click&lt;/a&gt; (#{first})',
        f"&lt;b&gt; (#{second})",
    ]
    # Directive reasons, alert text and evidence reach the panels' hover labels escaped.
    panels, _ = load_panels(state, OPEN, first)
    hover = [t for p in panels for t in strings(p) if "click" in t]
    assert hover and all("<a " not in t and "&lt;a href" in t for t in hover)


# --- item 19: shareable compare URL, runs by name, readable log ticks -----------------------------------


def test_compare_url_round_trips_the_pick() -> None:
    metrics = [M.REWARD_MEAN, "odd, name & more/x", "π"]
    search = query_string([3, 1], metrics)
    assert search.startswith("?runs=3,1&metrics=")
    assert parse_query(search) == ([3, 1], metrics)
    assert query_string([1, 2], list(COMPARE_DEFAULT_METRICS)) == "?runs=1,2"
    assert query_string([], list(COMPARE_DEFAULT_METRICS)) == ""
    assert parse_query("?runs=1,2") == ([1, 2], list(COMPARE_DEFAULT_METRICS))
    # The callback writes the URL only when the pick differs from it (no extra history entries).
    assert url_search([1, 2], list(COMPARE_DEFAULT_METRICS), "?runs=1,2", None) is no_update
    assert url_search([1, 2, 5], list(COMPARE_DEFAULT_METRICS), "?runs=1,2", None) == "?runs=1,2,5"
    assert url_search([1], [M.GRAD_NORM], None, "") == f"?runs=1&metrics={M.GRAD_NORM}"
    assert url_search({}, "x", 5, None) is no_update  # nothing valid picked, nothing in the URL
    # Crafted URLs: odd digits, ids beyond any int column, NUL, huge lists.
    hostile = "?runs=²,1,99999999999999999999999999,1,-3,&metrics=%00x,,ok&metrics=" + ",".join(["m"] * 500)
    run_ids, picked = parse_query(hostile)
    assert run_ids == [1] and picked[:2] == ["ok", "m"] and len(picked) == 2


def test_compare_page_restores_the_pick_from_its_url(client: TestClient, dctx: DashContext) -> None:
    a, b = new_run(client, "a"), new_run(client, "b")
    page = render_page(dctx, OPEN, "compare", query_string([b, a], [M.GRAD_NORM]))
    assert by_id(page, "compare-runs").value == [b, a]
    assert by_id(page, "compare-metrics").value == [M.GRAD_NORM]
    assert by_id(page, "compare-location") is not None


def test_a_run_page_reads_the_run_context_once(
    client: TestClient, dctx: DashContext, state: AppState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building the page reads the run, its phases, alerts and directives in one go; the panels' loads
    read only their series (they used to read the whole context each: ~100 read transactions a page)."""
    run_id = new_run(client, "read-once")
    body = metrics_batch(list(range(30)), {M.GRAD_NORM: [1.0] * 30, M.REWARD_MEAN: [0.5] * 30})
    assert client.post(f"{API_PREFIX}/runs/{run_id}/metrics", json=body).status_code == 200
    contexts: list[int] = []
    real_context = state.query.context
    monkeypatch.setattr(
        state.query, "context", lambda principal, rid: contexts.append(rid) or real_context(principal, rid)
    )
    reads = 0
    real_read = state.db.read

    def counted_read() -> Any:
        nonlocal reads
        reads += 1
        return real_read()

    monkeypatch.setattr(state.db, "read", counted_read)
    page = render_page(dctx, OPEN, f"run/{run_id}", None)
    overlay = by_id(page, "run-overlay").data
    for panel in PANELS:
        figure, cursor = panel_load(state, OPEN, run_id, panel, overlay)
        assert cursor is not None and cursor["signature"] == overlay["signature"], panel.key
        assert figure["data"][-1]["name"] == "events", panel.key  # the page's markers, on every panel
    assert contexts == [run_id]
    assert reads <= 2 * (1 + len(PANELS))  # an access check and one read for the context and per panel
    # An overlay the page did not make (crafted, or another run's) is read again, not trusted.
    for crafted in ({"run_id": run_id, "shapes": "x"}, {**overlay, "run_id": run_id + 1}, None, []):
        _, cursor = panel_load(state, OPEN, run_id, PANELS[0], crafted)
        assert cursor is not None and cursor["signature"] == overlay["signature"]
    assert contexts == [run_id] * 5


def test_run_page_by_name(client: TestClient, dctx: DashContext, state: AppState) -> None:
    nq = new_run(client, "grpo 3b", project="nq")
    hotpot = new_run(client, "grpo 3b", project="hotpot")
    solo = new_run(client, "solo/run", project="nq")

    def page_run_id(path: str, principal: Principal = OPEN) -> Any:
        page = render_page(dctx, principal, path, None)
        return by_id(page, "run-id").data

    assert page_run_id("run/nq/grpo%203b") == nq
    assert page_run_id("run/hotpot/grpo 3b") == hotpot
    assert page_run_id("run/solo%2Frun") == solo
    assert page_run_id("run/solo/run") == solo
    assert page_run_id(f"run/{solo}") == solo
    ambiguous = render_page(dctx, OPEN, "run/grpo%203b", None)
    choices = str(by_id(ambiguous, "run-choices"))
    assert f"/dashboard/run/{nq}" in choices and f"/dashboard/run/{hotpot}" in choices
    for missing in ("run/nope", "run/x%00y", "run/" + "a" * 5000, "run/%ED%A0%80", "run/nq/nope/deeper"):
        assert "no run named" in str(render_page(dctx, OPEN, missing, None)), missing
    # Project scoping: a token of hotpot sees only its own run of that name.
    hotpot_token = state.auth.authenticate(f"Bearer {state.auth.create_token('hotpot')[0]}")
    assert page_run_id("run/grpo%203b", hotpot_token) == hotpot
    assert "no run named" in str(render_page(dctx, hotpot_token, "run/solo%2Frun", None))
    assert "no run named" in str(render_page(dctx, hotpot_token, "run/nq/grpo%203b", None))


def test_log_axis_labels_stay_readable(client: TestClient, state: AppState) -> None:
    grad = PANELS_BY_KEY["grad"]

    def y_axis(lo: float, hi: float) -> Any:
        values = [float(v) for v in 10 ** np.linspace(lo, hi, 60)]
        return go.Figure(
            panel_figure(grad, {M.GRAD_NORM: Series(M.GRAD_NORM, list(range(60)), values)})
        ).layout.yaxis

    for lo, hi in ((0, 1), (-1, 1), (-1, 2), (-2, 3), (-5, 12)):
        axis = y_axis(lo, hi)
        assert axis.type == "log" and isinstance(axis.dtick, int) and axis.dtick >= 1, (lo, hi, axis.dtick)
        assert (hi - lo) / axis.dtick + 1 <= 6  # powers of ten only, at most six labels
    assert y_axis(-0.3, 0.3).dtick is None  # inside one decade plotly's own ticks are fine

    # The live refresh keeps it so when the range widens (a collapse under way).
    run_id = new_run(client, "exploding")
    ingest(client, run_id, list(range(10)), {M.GRAD_NORM: [1.0 + i / 10 for i in range(10)]})
    figures, cursors = load_panels(state, OPEN, run_id)
    assert figures[PANELS.index(grad)]["layout"]["yaxis"].get("dtick") is None
    ingest(client, run_id, list(range(10, 20)), {M.GRAD_NORM: [10.0 ** (i - 9) for i in range(10, 20)]})
    outputs, _ = refresh_panels(state, OPEN, run_id, cursors)
    patch = outputs[PANELS.index(grad)]
    assert isinstance(patch, Patch)
    ops = patch.to_plotly_json()["operations"]
    assert {"operation": "Assign", "location": ["layout", "yaxis", "dtick"], "params": {"value": 2}} in ops

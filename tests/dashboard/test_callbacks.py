"""The functions behind the callbacks, on a real AppState (SQLite, and PostgreSQL when configured), with a
run that slides into collapse streamed through the API as a trainer would."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import plotly.graph_objects as go
import pytest
from dash import Patch, no_update
from fastapi.testclient import TestClient

from contracts import metrics as M
from contracts.wire import API_PREFIX
from dashboard.callbacks.actions import action_figures
from dashboard.callbacks.base import DashContext
from dashboard.callbacks.compare import compare_metric_figure, compare_options, graph_slots
from dashboard.callbacks.directive import set_llds, set_policy
from dashboard.callbacks.export import export_csv
from dashboard.callbacks.routing import render_page, whoami
from dashboard.callbacks.run_panels import load_panels, refresh_panels
from dashboard.callbacks.run_summary import run_summary
from dashboard.callbacks.runs_list import runs_table
from dashboard.data import run_context
from dashboard.figures import legend_entries
from dashboard.pages.run import timeline_rows
from dashboard.panels import PANELS
from lldmon_lab.scenarios import Scenario, collapse_scenario
from monitor.api.state import AppState
from monitor.domain import Principal
from tests.monitor.api.helpers import action_batch, metrics_batch, new_run
from tests.monitor.api.test_detection_flow import stream

OPEN = Principal()
KEYS = [p.key for p in PANELS]


def head(scenario: Scenario, n: int) -> Scenario:
    return replace(
        scenario,
        steps=scenario.steps[:n],
        values={k: v[:n] for k, v in scenario.values.items()},
        present={k: v[:n] for k, v in scenario.present.items()},
    )


def tail(scenario: Scenario, n: int) -> Scenario:
    return replace(
        scenario,
        steps=scenario.steps[n:],
        values={k: v[n:] for k, v in scenario.values.items()},
        present={k: v[n:] for k, v in scenario.present.items()},
    )


@pytest.fixture
def state(app: Any) -> AppState:
    s: AppState = app.state.lldmon
    return s


@pytest.fixture
def dctx(state: AppState) -> DashContext:
    return DashContext(
        state=state, path_for=lambda p: "/dashboard" + p, run_refresh_ms=5000, runs_refresh_ms=10000
    )


@pytest.fixture
def collapsed(client: TestClient) -> int:
    run_id = new_run(client, "grpo-3b", project="nq", tags=["grpo"])
    stream(client, run_id, collapse_scenario(3))
    return run_id


def by_key(items: list[Any]) -> dict[str, Any]:
    """Per-panel outputs by panel key; figure dicts are validated as plotly figures."""
    return {
        k: go.Figure(v) if isinstance(v, dict) and "data" in v else v
        for k, v in zip(KEYS, items, strict=True)
    }


def test_load_panels_draws_every_panel_with_bands_markers_and_empty_states(
    state: AppState, collapsed: int
) -> None:
    figures, cursors = load_panels(state, OPEN, collapsed)
    figs = by_key(figures)
    n = len(collapse_scenario(3).steps)
    assert len(figs["reward"].data[0].x) == n and figs["reward"].data[-1].name == "events"
    events = state.query.phase_events(OPEN, collapsed)
    collapse_step = next(e.step for e in events if e.phase == "collapse")
    for fig in figs.values():  # bands behind every panel, the collapse running to the last step
        bands = {s.name: (s.x0, s.x1) for s in fig.layout.shapes}
        assert bands["phase:collapse"] == (collapse_step, n - 1)
        assert "phase:decay" in bands
    assert figs["grad"].layout.yaxis.type == "log"
    assert "no data for llds/active" in figs["llds"].layout.annotations[0].text
    assert "no data for ratio/pos_min" in figs["ratio"].layout.annotations[0].text
    assert "alert" in figs["reward"].data[-1].customdata
    cursor = by_key(cursors)
    assert all(c["last_step"] == n - 1 and c["run_id"] == collapsed for c in cursors)
    assert cursor["llds"]["present"] == []
    assert cursor["logp"]["present"] == [M.LOGP_POS, M.LOGP_NEG, M.LOGP_CORRECT, M.ANCHOR_LOGP]


def test_load_panels_downsamples_but_keeps_spikes(state: AppState, collapsed: int) -> None:
    figures, _ = load_panels(state, OPEN, collapsed, max_points=40)
    grad = by_key(figures)["grad"].data[0]
    assert len(grad.x) <= 40
    full = state.query.history(OPEN, collapsed, [M.GRAD_NORM])[0]
    finite = [v for v in full.values if v == v]
    assert max(v for v in grad.y if v is not None and v == v) == pytest.approx(max(finite))


def test_refresh_fetches_only_new_steps_and_patches_in_place(client: TestClient, state: AppState) -> None:
    scenario = collapse_scenario(3)
    run_id = new_run(client, "live")
    stream(client, run_id, head(scenario, 100))
    _, cursors = load_panels(state, OPEN, run_id)
    assert {c["last_step"] for c in cursors} == {99}

    outputs, same = refresh_panels(state, OPEN, run_id, cursors)
    assert outputs == [no_update] * len(PANELS) and same == [no_update] * len(PANELS)  # nothing new

    stream(client, run_id, tail(scenario, 100))
    outputs, cursors2 = refresh_panels(state, OPEN, run_id, cursors)
    assert all(isinstance(p, Patch) for p in outputs)
    ops = by_key(outputs)["reward"].to_plotly_json()["operations"]
    extend_x = next(op for op in ops if op["operation"] == "Extend" and op["location"] == ["data", 0, "x"])
    assert extend_x["params"]["value"] == list(range(100, len(scenario.steps)))  # only the new steps
    shapes = next(op for op in ops if op["location"] == ["layout", "shapes"])["params"]["value"]
    assert "phase:collapse" in [s["name"] for s in shapes]  # the collapse happened after step 100
    markers = next(op for op in ops if op["location"] == ["data", 1])["params"]["value"]
    assert markers["name"] == "events" and "alert" in markers["customdata"]
    llds_ops = by_key(outputs)["llds"].to_plotly_json()["operations"]  # no data: bands and markers only
    assert [op["location"] for op in llds_ops] == [["layout", "shapes"], ["data", 0]]
    reward = by_key(cursors2)["reward"]
    assert reward["last_step"] == len(scenario.steps) - 1 and reward["appended"] == len(scenario.steps) - 100

    # A metric seen for the first time (the trainer starts reporting LLDS): that panel is redrawn.
    body = metrics_batch([reward["last_step"] + 1], {M.LLDS_ACTIVE: [1.0], M.REWARD_MEAN: [0.1]})
    assert client.post(f"{API_PREFIX}/runs/{run_id}/metrics", json=body).status_code == 200
    outputs, cursors3 = refresh_panels(state, OPEN, run_id, cursors2)
    panels = by_key(outputs)
    assert [t.name for t in panels["llds"].data] == [M.LLDS_ACTIVE, "events"]
    assert isinstance(panels["reward"], Patch)
    assert by_key(cursors3)["llds"]["present"] == [M.LLDS_ACTIVE]

    # Many appended points: each panel is reloaded downsampled.
    stale = [dict(c, appended=0, last_step=0) for c in cursors]
    outputs, cursors4 = refresh_panels(state, OPEN, run_id, stale, max_points=50, rebuild_after=10)
    assert all(isinstance(f, dict) for f in outputs) and all(c["appended"] == 0 for c in cursors4)
    assert len(by_key(outputs)["reward"].data[0].x) <= 50


def test_refresh_waits_for_each_panel_to_load(state: AppState, collapsed: int) -> None:
    nothing = ([no_update] * len(PANELS), [no_update] * len(PANELS))
    assert refresh_panels(state, OPEN, collapsed, [None] * len(PANELS)) == nothing
    assert refresh_panels(state, OPEN, collapsed, [{"run_id": collapsed + 1}] * len(PANELS)) == nothing
    _, cursors = load_panels(state, OPEN, collapsed)
    behind = [dict(c, last_step=c["last_step"] - 5) for c in cursors]
    outputs, _ = refresh_panels(state, OPEN, collapsed, [behind[0], *[None] * (len(PANELS) - 1)])
    assert isinstance(outputs[0], Patch) and outputs[1:] == [no_update] * (len(PANELS) - 1)


def test_summary_header_and_timeline(dctx: DashContext, state: AppState, collapsed: int) -> None:
    header, status, timeline, signature = run_summary(dctx, OPEN, collapsed)
    assert "collapse" in str(header) and "grpo-3b" in str(header)
    assert "LLDS off" in str(status)
    assert "timeline-table" in str(timeline)
    rows = timeline_rows(run_context(state, OPEN, collapsed))
    assert rows[0].step >= rows[-1].step  # newest first
    kinds = {r.kind for r in rows}
    assert kinds == {"phase", "alert"}
    assert any(r.kind == "alert" and r.title.startswith("lld_collapse") for r in rows)
    # Evidence in words (statistic named, no internal keys); the raw JSON only behind its own toggle.
    collapse = next(r for r in rows if r.kind == "alert" and r.title.startswith("lld_collapse"))
    assert collapse.explanation and all("active_at" not in line for line in collapse.explanation)
    assert any(" = " in line and "threshold" in line for line in collapse.explanation)
    assert not any("degraded" in line for r in rows for line in r.explanation)  # hooks present
    assert "raw evidence (JSON)" in str(timeline)
    # Nothing changed: the timeline is not re-sent (expanded evidence stays open); the header is.
    header2, _, timeline2, signature2 = run_summary(dctx, OPEN, collapsed, signature)
    assert timeline2 is no_update and signature2 is no_update and "grpo-3b" in str(header2)
    assert run_summary(dctx, OPEN, 999)[2].children == "404: run 999 does not exist"


def test_directive_controls_write_through_the_services(
    dctx: DashContext, state: AppState, collapsed: int
) -> None:
    message, ok = set_llds(dctx, OPEN, collapsed, True, 0.3)
    assert ok and "LLDS on" in message
    directive = state.directives.current(OPEN, collapsed)
    assert (
        directive.llds.enabled and directive.llds.lam == pytest.approx(0.3) and directive.source == "manual"
    )
    assert set_llds(dctx, OPEN, collapsed, True, -1.0) == (
        "422: llds.lam: lambda must be a finite number in [0, 1e+06], got -1.0",  # contracts.directive's rule
        False,
    )
    assert set_llds(dctx, OPEN, collapsed, False, None)[1]
    assert not state.directives.current(OPEN, collapsed).llds.enabled
    assert set_policy(dctx, OPEN, collapsed, "auto") == ("policy set to auto", True)
    assert state.runs.get(OPEN, collapsed).directive_policy == "auto"
    message, ok = set_policy(dctx, OPEN, collapsed, "sometimes")
    assert not ok and message.startswith("422")
    _, status, timeline, _ = run_summary(dctx, OPEN, collapsed)
    assert "directive v2 (manual)" in str(status) and "LLDS switched off by hand" in str(timeline)


def test_export_csv_matches_the_api(client: TestClient, dctx: DashContext, collapsed: int) -> None:
    download = export_csv(dctx, OPEN, collapsed)
    api = client.get(f"{API_PREFIX}/runs/{collapsed}/metrics", params={"format": "csv"}).text
    assert download["filename"] == f"run-{collapsed}-metrics.csv"
    assert download["content"] == api and api.startswith("step,")


def test_action_distribution(client: TestClient, state: AppState) -> None:
    run_id = new_run(client, "actions")
    for step in (3, 4, 6):
        body = action_batch(8, step=step)
        assert client.post(f"{API_PREFIX}/runs/{run_id}/actions", json=body).status_code == 200
    body = metrics_batch([6], {M.REWARD_MEAN: [0.5]})
    client.post(f"{API_PREFIX}/runs/{run_id}/metrics", json=body)
    hist, quantiles = (go.Figure(f) for f in action_figures(state, OPEN, run_id, 5, 100, "all"))
    # step 5 has no records: the histogram shows step 4
    assert "step 4" in hist.layout.meta["title"] and sum(len(t.x) for t in hist.data) == 8
    median = next(t for t in quantiles.data if t.name == "median")
    assert list(median.x) == [3, 4]
    latest, _ = action_figures(state, OPEN, run_id, None, 100, None)  # no step chosen: the latest
    assert "step 6" in latest["layout"]["meta"]["title"]
    none, _ = action_figures(state, OPEN, run_id, 2, 100, "probe")
    assert none["layout"]["annotations"][0]["name"] == "empty-state"
    # A row budget shortens the window from the oldest end and says so.
    _, budgeted = action_figures(state, OPEN, run_id, 6, 100, "all", budget=10)
    assert list(go.Figure(budgeted).data[-1].x) == [6]
    assert "(row budget)" in budgeted["layout"]["meta"]["title"]


def test_runs_table_filters(client: TestClient, dctx: DashContext, collapsed: int) -> None:
    new_run(client, "healthy-a", project="hotpot", tags=["llds"])
    table, options = runs_table(dctx, OPEN, None, None, None, None)
    text = str(table)
    assert "grpo-3b" in text and "healthy-a" in text
    assert [o["value"] for o in options] == ["hotpot", "nq"]
    assert "healthy-a" not in str(runs_table(dctx, OPEN, "nq", None, None, None)[0])
    assert "grpo-3b" not in str(runs_table(dctx, OPEN, None, None, "llds", None)[0])
    assert "grpo-3b" not in str(runs_table(dctx, OPEN, None, None, None, "HEALTHY")[0])
    assert "No runs match" in str(runs_table(dctx, OPEN, None, "failed", None, None)[0])
    row = next(r for r in table.children[1].children if r.id == f"run-row-{collapsed}")
    cells = row.children
    assert cells[3].children.children == "collapse"  # phase badge
    open_alerts = [
        a for a in client.get(f"{API_PREFIX}/runs/{collapsed}/alerts").json() if a["status"] != "resolved"
    ]
    assert cells[6].children == str(len(open_alerts)) and open_alerts
    quiet = next(r for r in table.children[1].children if r.id != f"run-row-{collapsed}")
    assert quiet.children[6].children == "0"  # a run without alerts counts 0 (one query for all runs)


def test_compare_runs(client: TestClient, state: AppState, collapsed: int) -> None:
    other = new_run(client, "grpo-llds")
    stream(client, other, head(collapse_scenario(4), 60))
    reward, grad = (
        go.Figure(compare_metric_figure(state, OPEN, [collapsed, other], m))
        for m in (M.REWARD_MEAN, M.GRAD_NORM)
    )
    assert [t.name for t in reward.data] == [f"grpo-3b (#{collapsed})", f"grpo-llds (#{other})"]
    assert len(reward.data[1].x) == 60  # aligned by step: the shorter run just ends earlier
    assert grad.layout.yaxis.type == "log"
    assert [s.name for s in reward.layout.shapes] == [f"collapse:grpo-3b (#{collapsed})"]
    notes, available = compare_options(state, OPEN, [collapsed, other])
    assert notes == [] and M.LOGP_POS in available and M.KL_OLD in available
    notes, _ = compare_options(state, OPEN, [collapsed, 999, other, collapsed + 100, other + 100])
    assert "showing the first 4 runs" in notes and any(n.startswith("run 999: 404") for n in notes)
    assert "pick 2 to 4 runs to compare" in compare_options(state, OPEN, [collapsed])[0]
    unknown = go.Figure(compare_metric_figure(state, OPEN, [collapsed, 999], M.REWARD_MEAN))
    assert len(unknown.data) == 1
    [slot] = graph_slots([M.KL_OLD])
    heading, graph = slot.children
    assert heading.children == M.KL_OLD and graph.id == {"type": "compare-graph", "metric": M.KL_OLD}


def test_pages_by_url(client: TestClient, dctx: DashContext, state: AppState, collapsed: int) -> None:
    assert "runs-table" in str(render_page(dctx, OPEN, "", None))
    run_page = str(render_page(dctx, OPEN, f"run/{collapsed}", None))
    assert "panel-grad" in run_page and "llds-on" in run_page
    # The legend: every phase colour and every marker kind (derived from the figures' constants).
    for entry in legend_entries():
        assert f"data-legend='{entry.group}:{entry.key}'" in run_page, entry
    assert "compare-runs" in str(render_page(dctx, OPEN, "compare", "?runs=1,2"))
    assert "404" in str(render_page(dctx, OPEN, "nowhere", None))
    assert "run 999 does not exist" in str(render_page(dctx, OPEN, "run/999", None))
    other = state.auth.authenticate(f"Bearer {state.auth.create_token('other')[0]}")
    page = str(render_page(dctx, other, f"run/{collapsed}", None))
    assert f"run {collapsed} does not exist" in page and "llds-on" not in page
    assert whoami(other) == "project other" and whoami(OPEN) == "auth off (local)"


def test_a_rollback_redraws_every_panel_with_the_new_attempt_and_marks_it(
    client: TestClient, state: AppState
) -> None:
    """After a rollback the steps after the restored one hold the new attempt's values, which an
    append-only refresh would never fetch: every panel is reloaded, with a rollback marker."""
    run_id = new_run(client, "rolled")
    steps = list(range(1, 41))
    body = metrics_batch(steps, {M.REWARD_MEAN: [0.5] * 40})
    assert client.post(f"{API_PREFIX}/runs/{run_id}/metrics", json=body).status_code == 200
    _, cursors = load_panels(state, OPEN, run_id)
    redo = metrics_batch([21, 22], {M.REWARD_MEAN: [0.9, 0.8], "directive/rollback_to": [20.0, None]})
    assert client.post(f"{API_PREFIX}/runs/{run_id}/metrics", json=redo).status_code == 200
    outputs, new_cursors = refresh_panels(state, OPEN, run_id, cursors)
    reward = by_key(outputs)["reward"]
    assert isinstance(reward, go.Figure)  # a full figure, not a patch
    assert list(reward.data[0].x) == [*range(1, 21), 21, 22] and list(reward.data[0].y)[-2:] == [0.9, 0.8]
    assert all(c["rollbacks"] == 1 for c in new_cursors)
    markers = reward.data[1]
    assert "rollback" in markers.customdata and "rolled back to step 20</b> from step 40" in " ".join(
        markers.hovertext
    )
    again, _ = refresh_panels(state, OPEN, run_id, new_cursors)
    assert again == [no_update] * len(PANELS)

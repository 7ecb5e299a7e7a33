"""Compare page: 2-4 runs overlaid on chosen metrics, aligned by step (e.g. GRPO vs GRPO+LLDS).

One callback per graph (pattern-matching on the metric): each reads one metric of the chosen runs, so
the graphs load in parallel and each stays fast on long runs. The picks arrive as the browser sends
them: entries that cannot be run ids or metric names are dropped (`dashboard.inputs`).
"""

from __future__ import annotations

from typing import Any

from dash import MATCH, Dash, Input, Output, State, dcc, no_update

from contracts.metrics import CANONICAL_METRICS
from dashboard import data, inputs
from dashboard.auth import current_principal
from dashboard.callbacks.base import DashContext, error_text
from dashboard.figures import COMPARE_HEIGHT, CompareRun, Figure, compare_figure, empty_figure
from dashboard.layout import graph_card
from dashboard.pages.compare import MAX_RUNS, parse_query, query_string
from dashboard.pages.run import GRAPH_CONFIG
from monitor.detector.types import COLLAPSE
from monitor.domain import Principal
from monitor.errors import LLDMonError
from monitor.ports import DashboardPort

MAX_POINTS = 1500


def compare_options(
    state: DashboardPort, principal: Principal, picked: object
) -> tuple[list[str], list[str]]:
    """(notes for the user, metric names to offer: canonical ones plus those the chosen runs logged)."""
    run_ids = inputs.run_ids(picked)
    notes: list[str] = []
    if len(run_ids) > MAX_RUNS:
        notes.append(f"showing the first {MAX_RUNS} runs")
    available = set(CANONICAL_METRICS)
    readable = 0
    for run_id in list(run_ids)[:MAX_RUNS]:
        try:
            available |= {m.name for m in state.query.metric_names(principal, run_id)}
            readable += 1
        except LLDMonError as exc:
            notes.append(f"run {run_id}: {error_text(exc)}")
    if readable < 2:
        notes.append("pick 2 to 4 runs to compare")
    return notes, sorted(available)


def compare_metric_figure(
    state: DashboardPort,
    principal: Principal,
    run_ids: object,
    metric: object,
    *,
    max_points: int = MAX_POINTS,
) -> Figure:
    """One metric of the first MAX_RUNS runs (runs the caller cannot read are left out)."""
    try:
        metric = inputs.metric_name(metric)
    except LLDMonError as exc:
        return empty_figure(error_text(exc), height=COMPARE_HEIGHT)
    runs: list[CompareRun] = []
    for run_id in inputs.run_ids(run_ids)[:MAX_RUNS]:
        try:
            run = state.runs.get(principal, run_id)
            series = data.series_map(state, principal, run_id, [metric], max_points=max_points)
            events = state.query.phase_events(principal, run_id)
        except LLDMonError:
            continue
        collapse = next((e.step for e in events if e.phase == COLLAPSE), None)
        runs.append(CompareRun(f"{run.name} (#{run.id})", series.get(metric), collapse))
    return compare_figure(metric, runs)


def graph_slots(metrics: object) -> list[Any]:
    """One card per metric, titled by the metric (text, never markup); each graph's own callback fills it."""
    return [
        graph_card(
            metric,
            dcc.Graph(
                id={"type": "compare-graph", "metric": metric},
                figure=empty_figure("loading ...", height=COMPARE_HEIGHT),
                config=GRAPH_CONFIG,
                style={"height": f"{COMPARE_HEIGHT}px"},
            ),
        )
        for metric in inputs.metric_names(metrics)
    ]


def url_search(run_ids: object, metrics: object, shown: object, loaded: object) -> Any:
    """The URL query for the pick, or no_update when the address bar already says it (`shown`: the
    page's own location, None until it has read the address bar; `loaded`: the query the page was
    rendered from), so opening or going back to a URL adds no history entry."""
    wanted = query_string(inputs.run_ids(run_ids)[:MAX_RUNS], inputs.metric_names(metrics))
    current = shown if isinstance(shown, str) else loaded
    return no_update if wanted == query_string(*parse_query(current)) else wanted


def register(app: Dash, ctx: DashContext) -> None:
    @app.callback(
        Output("compare-note", "children"),
        Output("compare-metrics", "options"),
        Input("compare-runs", "value"),
    )
    def _options(run_ids: object) -> tuple[Any, ...]:
        notes, available = compare_options(ctx.state, current_principal(), run_ids)
        return "; ".join(notes), [{"label": m, "value": m} for m in available]

    @app.callback(
        Output("compare-graphs", "children"),
        Input("compare-runs", "value"),
        Input("compare-metrics", "value"),
    )
    def _slots(_run_ids: object, metrics: object) -> list[Any]:
        return graph_slots(metrics)

    @app.callback(
        Output("compare-location", "search"),
        Input("compare-runs", "value"),
        Input("compare-metrics", "value"),
        State("compare-location", "search"),
        State("url", "search"),
    )
    def _url(run_ids: object, metrics: object, shown: object, loaded: object) -> Any:
        return url_search(run_ids, metrics, shown, loaded)

    @app.callback(
        Output({"type": "compare-graph", "metric": MATCH}, "figure"),
        Input({"type": "compare-graph", "metric": MATCH}, "id"),
        State("compare-runs", "value"),
    )
    def _graph(graph_id: object, run_ids: object) -> Figure:
        metric = graph_id.get("metric") if isinstance(graph_id, dict) else None
        return compare_metric_figure(ctx.state, current_principal(), run_ids, metric)

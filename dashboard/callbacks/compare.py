"""Compare page: 2-4 runs overlaid on chosen metrics, aligned by step (e.g. GRPO vs GRPO+LLDS).

One callback per graph (pattern-matching on the metric): each reads one metric of the chosen runs, so
the graphs load in parallel and each stays fast on long runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dash import MATCH, Dash, Input, Output, State, dcc, html

from contracts.metrics import CANONICAL_METRICS
from dashboard import data
from dashboard.auth import current_principal
from dashboard.callbacks.base import DashContext, error_text
from dashboard.figures import COMPARE_HEIGHT, CompareRun, Figure, compare_figure, empty_figure
from dashboard.pages.compare import MAX_RUNS
from dashboard.pages.run import GRAPH_CONFIG
from monitor.api.state import AppState
from monitor.detector.types import COLLAPSE
from monitor.domain import Principal
from monitor.errors import LLDMonError

MAX_POINTS = 1500


def compare_options(
    state: AppState, principal: Principal, run_ids: Sequence[int]
) -> tuple[list[str], list[str]]:
    """(notes for the user, metric names to offer: canonical ones plus those the chosen runs logged)."""
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
    state: AppState,
    principal: Principal,
    run_ids: Sequence[int],
    metric: str,
    *,
    max_points: int = MAX_POINTS,
) -> Figure:
    """One metric of the first MAX_RUNS runs (runs the caller cannot read are left out)."""
    runs: list[CompareRun] = []
    for run_id in list(run_ids)[:MAX_RUNS]:
        try:
            run = state.runs.get(principal, run_id)
            series = data.series_map(state, principal, run_id, [metric], max_points=max_points)
            events = state.query.phase_events(principal, run_id)
        except LLDMonError:
            continue
        collapse = next((e.step for e in events if e.phase == COLLAPSE), None)
        runs.append(CompareRun(f"{run.name} (#{run.id})", series.get(metric), collapse))
    return compare_figure(metric, runs)


def graph_slots(metrics: Sequence[str]) -> list[Any]:
    """One card per metric; each graph's own callback fills it."""
    return [
        html.Div(
            dcc.Graph(
                id={"type": "compare-graph", "metric": metric},
                figure=empty_figure("loading ...", title=metric, height=COMPARE_HEIGHT),
                config=GRAPH_CONFIG,
                style={"height": f"{COMPARE_HEIGHT}px"},
            ),
            className="card",
        )
        for metric in metrics
    ]


def register(app: Dash, ctx: DashContext) -> None:
    @app.callback(
        Output("compare-note", "children"),
        Output("compare-metrics", "options"),
        Input("compare-runs", "value"),
    )
    def _options(run_ids: list[int] | None) -> tuple[Any, ...]:
        notes, available = compare_options(ctx.state, current_principal(), run_ids or [])
        return "; ".join(notes), [{"label": m, "value": m} for m in available]

    @app.callback(
        Output("compare-graphs", "children"),
        Input("compare-runs", "value"),
        Input("compare-metrics", "value"),
    )
    def _slots(_run_ids: list[int] | None, metrics: list[str] | None) -> list[Any]:
        return graph_slots(metrics or [])

    @app.callback(
        Output({"type": "compare-graph", "metric": MATCH}, "figure"),
        Input({"type": "compare-graph", "metric": MATCH}, "id"),
        State("compare-runs", "value"),
    )
    def _graph(graph_id: dict[str, str], run_ids: list[int] | None) -> Figure:
        return compare_metric_figure(ctx.state, current_principal(), run_ids or [], graph_id["metric"])

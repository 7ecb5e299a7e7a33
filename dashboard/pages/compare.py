"""Compare page (/dashboard/compare?runs=1,2&metrics=...): 2-4 runs overlaid on chosen metrics."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import parse_qs

from dash import dcc, html
from dash.development.base_component import Component

from contracts.metrics import CANONICAL_METRICS
from dashboard.panels import COMPARE_DEFAULT_METRICS

MAX_RUNS = 4


def parse_query(search: str | None) -> tuple[list[int], list[str]]:
    """Run ids and metric names from `?runs=1,2&metrics=a,b` (bad ids are dropped)."""
    query = parse_qs((search or "").lstrip("?"))
    ids: list[int] = []
    for chunk in query.get("runs", []):
        for part in chunk.split(","):
            if part.strip().isdigit():
                ids.append(int(part))
    metrics = [m for chunk in query.get("metrics", []) for m in chunk.split(",") if m]
    return list(dict.fromkeys(ids))[:MAX_RUNS], metrics or list(COMPARE_DEFAULT_METRICS)


def layout(
    run_ids: Sequence[int], metrics: Sequence[str], run_options: Sequence[dict[str, object]]
) -> Component:
    """Options are in the layout with the values (a dropdown drops values its options lack)."""
    metric_options = [{"label": m, "value": m} for m in dict.fromkeys([*CANONICAL_METRICS, *metrics])]
    return html.Div(
        [
            html.Div(
                [
                    html.Div(
                        [
                            html.Label(f"runs (up to {MAX_RUNS})"),
                            dcc.Dropdown(
                                id="compare-runs", multi=True, value=list(run_ids), options=list(run_options)
                            ),
                        ],
                        style={"flex": "1 1 380px"},
                    ),
                    html.Div(
                        [
                            html.Label("metrics"),
                            dcc.Dropdown(
                                id="compare-metrics", multi=True, value=list(metrics), options=metric_options
                            ),
                        ],
                        style={"flex": "1 1 380px"},
                    ),
                ],
                className="card filters",
            ),
            html.Div(id="compare-note", className="muted"),
            html.Div(id="compare-graphs", className="panels"),
        ]
    )

"""Compare page (/dashboard/compare?runs=1,2&metrics=...): 2-4 runs overlaid on chosen metrics.

The URL is the page's state: picking runs or metrics rewrites it (a `dcc.Location` of the page's own,
so the page is not rendered again), and opening it restores the pick, so a comparison can be shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote_plus, unquote_plus

from dash import dcc, html
from dash.development.base_component import Component

from contracts.metrics import CANONICAL_METRICS
from dashboard import inputs
from dashboard.panels import COMPARE_DEFAULT_METRICS

MAX_RUNS = 4
MAX_QUERY_CHARS = 16_384
"""Longer query strings are cut (4 ids and a few dozen metric names fit many times over)."""


def _values(search: str, key: str) -> list[str]:
    """The comma-separated values of `key` (repeatable) in a query string, each percent-decoded after
    splitting, so a metric name may hold a comma (written %2C)."""
    values: list[str] = []
    for pair in search[:MAX_QUERY_CHARS].lstrip("?").split("&"):
        name, _, value = pair.partition("=")
        if unquote_plus(name) == key:
            values += [unquote_plus(part) for part in value.split(",") if part]
    return values


def parse_query(search: object) -> tuple[list[int], list[str]]:
    """Run ids and metric names from `?runs=1,2&metrics=a,b`; what cannot be an id or a metric name is
    dropped, and no metrics means the default ones."""
    text = search if isinstance(search, str) else ""
    ids = [i for i in (inputs.run_id_text(part) for part in _values(text, "runs")) if i is not None]
    metrics = inputs.metric_names(_values(text, "metrics"))
    return inputs.run_ids(ids)[:MAX_RUNS], metrics or list(COMPARE_DEFAULT_METRICS)


def query_string(run_ids: Sequence[int], metrics: Sequence[str]) -> str:
    """The URL query of a pick ("" for none; the default metrics are left out): `parse_query`'s inverse."""
    parts = []
    if run_ids:
        parts.append("runs=" + ",".join(str(i) for i in run_ids))
    if metrics and list(metrics) != list(COMPARE_DEFAULT_METRICS):
        parts.append("metrics=" + ",".join(quote_plus(m, safe="/") for m in metrics))
    return "?" + "&".join(parts) if parts else ""


def layout(
    run_ids: Sequence[int], metrics: Sequence[str], run_options: Sequence[dict[str, object]]
) -> Component:
    """Options are in the layout with the values (a dropdown drops values its options lack)."""
    metric_options = [{"label": m, "value": m} for m in dict.fromkeys([*CANONICAL_METRICS, *metrics])]
    return html.Div(
        [
            dcc.Location(id="compare-location", refresh=False),  # written when the pick changes
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

"""Runs list (/dashboard/): filters and a table of runs with their phase badge."""

from __future__ import annotations

from collections.abc import Sequence

from dash import dcc, html
from dash.development.base_component import Component

from contracts.wire import RUN_STATUSES
from dashboard.data import RunRow
from dashboard.layout import PathFor, ago, phase_badge, status_badge, tag_list

REFRESH_MS = 10_000


def layout(refresh_ms: int = REFRESH_MS) -> Component:
    return html.Div(
        [
            html.Div(
                [
                    dcc.Dropdown(id="runs-project", placeholder="project", clearable=True),
                    dcc.Dropdown(
                        id="runs-status",
                        options=[{"label": s, "value": s} for s in RUN_STATUSES],
                        placeholder="status",
                        clearable=True,
                    ),
                    dcc.Input(
                        id="runs-tag", type="text", placeholder="tag", debounce=True, style={"width": "180px"}
                    ),
                    dcc.Input(
                        id="runs-search",
                        type="search",
                        placeholder="search name / project / tag",
                        debounce=True,
                    ),
                ],
                className="card filters",
            ),
            html.Div(id="runs-table", className="card"),
            dcc.Interval(id="runs-tick", interval=refresh_ms),
        ]
    )


COLUMNS = ("run", "project", "status", "phase", "last step", "last seen", "open alerts", "tags")


def table(rows: Sequence[RunRow], path_for: PathFor) -> Component:
    if not rows:
        return html.P(
            "No runs match. Register one with POST /api/v1/runs.", className="muted", id="runs-empty"
        )
    body = [
        html.Tr(
            [
                html.Td(dcc.Link(r.run.name, href=path_for(f"/run/{r.run.id}"), className="run-link")),
                html.Td(r.run.project),
                html.Td(status_badge(r.run.status, r.run.last_seen_at)),
                html.Td(phase_badge(r.run.phase)),
                html.Td("-" if r.run.last_step is None else str(r.run.last_step)),
                html.Td(ago(r.run.last_seen_at), title=r.run.last_seen_at.isoformat()),
                html.Td(str(r.open_alerts), className="alerts-open"),
                html.Td(tag_list(r.run.tags)),
            ],
            id=f"run-row-{r.run.id}",
            className="run-row",
        )
        for r in rows
    ]
    return html.Table(
        [html.Thead(html.Tr([html.Th(c) for c in COLUMNS])), html.Tbody(body)], className="grid"
    )

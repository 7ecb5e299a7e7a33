"""Run page (/dashboard/run/<id>): live panels, action-delta distribution, timeline, directive controls."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dash import dcc, html
from dash.development.base_component import Component

from contracts.wire import DIRECTIVE_POLICIES
from dashboard.data import RunContext
from dashboard.figures import ACTION_HEIGHT, PANEL_HEIGHT, empty_figure, evidence_lines
from dashboard.layout import PathFor, ago, phase_badge, tag_list
from dashboard.panels import PANELS
from monitor.domain import DirectiveInfo, RunInfo

REFRESH_MS = 5_000
ACTION_WINDOWS = (20, 100, 500)
GRAPH_CONFIG: Any = {"displaylogo": False, "responsive": True}
"""Responsive width; the height is fixed by each graph's style (a responsive graph fills its box)."""


def layout(
    run: RunInfo, directive: DirectiveInfo, *, steer: bool, path_for: PathFor, refresh_ms: int = REFRESH_MS
) -> Component:
    return html.Div(
        [
            dcc.Store(id="run-id", data=run.id),
            *[dcc.Store(id=f"cursor-{panel.key}") for panel in PANELS],
            dcc.Store(id="directive-changed"),
            dcc.Store(id="timeline-signature"),
            dcc.Interval(id="run-tick", interval=refresh_ms),
            dcc.Download(id="run-download"),
            html.Div(
                [
                    html.Div(id="run-header", children=header_children(run)),
                    html.Div(
                        [
                            html.Button("Export metrics (CSV)", id="export-csv", className="btn"),
                            dcc.Link("compare with other runs", href=path_for(f"/compare?runs={run.id}")),
                        ],
                        className="runhead",
                        style={"marginTop": "8px"},
                    ),
                ],
                className="card",
            ),
            directive_card(run, directive, steer),
            html.Div(
                [
                    html.Div(
                        dcc.Graph(
                            id=f"panel-{panel.key}",
                            figure=empty_figure("loading ...", title=panel.title),
                            config=GRAPH_CONFIG,
                            className="panel-graph",
                            style={"height": f"{PANEL_HEIGHT}px"},
                        ),
                        className="card",
                    )
                    for panel in PANELS
                ],
                className="panels",
            ),
            actions_card(),
            html.Div(
                [html.H3("Alerts, phase changes and directives"), html.Div(id="run-timeline")],
                className="card",
            ),
        ]
    )


def header_children(run: RunInfo) -> list[Component]:
    return [
        html.Div(
            [
                html.H2(run.name, id="run-name"),
                phase_badge(run.phase),
                html.Span(f"project {run.project}"),
                html.Span(f"status {run.status}", id="run-status"),
                html.Span(f"last step {'-' if run.last_step is None else run.last_step}", id="run-last-step"),
                html.Span(
                    f"seen {ago(run.last_seen_at)}", className="muted", title=run.last_seen_at.isoformat()
                ),
                html.Span(tag_list(run.tags)),
                html.Span(f"policy {run.directive_policy}", className="muted"),
            ],
            className="runhead",
        )
    ]


def directive_status(directive: DirectiveInfo, policy: str) -> Component:
    state = "on" if directive.llds_enabled else "off"
    data_attrs: dict[str, Any] = {"data-enabled": str(directive.llds_enabled).lower()}
    return html.Div(
        [
            html.B(f"LLDS {state}", id="directive-llds", **data_attrs),
            html.Span(f" λ={directive.llds_lambda:g} · directive v{directive.version} ({directive.source})"),
            html.Span(f" · policy {policy}", id="directive-policy"),
            html.Div(directive.reason, className="muted"),
        ]
    )


def directive_card(run: RunInfo, directive: DirectiveInfo, steer: bool) -> Component:
    status = html.Div(directive_status(directive, run.directive_policy), id="directive-status")
    if not steer:
        return html.Div([html.H3("Trainer directive"), status], className="card")
    controls = html.Div(
        [
            html.Button("Switch LLDS on", id="llds-on"),
            html.Button("Switch LLDS off", id="llds-off", className="off"),
            html.Label(
                [
                    "λ ",
                    dcc.Input(
                        id="llds-lambda",
                        type="number",
                        value=directive.llds_lambda,
                        min=0,
                        step=0.01,
                        style={"width": "110px"},
                    ),
                ]
            ),
            html.Span("policy:", className="muted"),
            dcc.RadioItems(
                id="policy",
                options=[{"label": p, "value": p} for p in DIRECTIVE_POLICIES],
                value=run.directive_policy,
                inline=True,
            ),
            html.Button("Apply policy", id="policy-apply"),
            html.Span(id="directive-msg", className="msg"),
        ],
        className="controls",
    )
    return html.Div([html.H3("Trainer directive"), status, controls], className="card", id="directive-card")


def actions_card() -> Component:
    return html.Div(
        [
            html.H3("Action-level likelihood displacement"),
            html.Div(
                [
                    html.Label(
                        [
                            "step ",
                            dcc.Input(
                                id="action-step",
                                type="number",
                                min=0,
                                placeholder="latest",
                                debounce=True,
                                style={"width": "130px"},
                            ),
                        ]
                    ),
                    html.Label(
                        [
                            "window ",
                            dcc.Dropdown(
                                id="action-window",
                                options=[{"label": f"last {w} steps", "value": w} for w in ACTION_WINDOWS],
                                value=ACTION_WINDOWS[1],
                                clearable=False,
                                style={"width": "170px"},
                            ),
                        ]
                    ),
                    html.Label(
                        [
                            "source ",
                            dcc.Dropdown(
                                id="action-source",
                                options=[
                                    {"label": "all", "value": "all"},
                                    {"label": "loss (in-loss proxy)", "value": "loss"},
                                    {"label": "probe (exact)", "value": "probe"},
                                ],
                                value="all",
                                clearable=False,
                                style={"width": "190px"},
                            ),
                        ]
                    ),
                ],
                className="controls",
            ),
            html.Div(
                [
                    dcc.Graph(
                        id=graph_id,
                        figure=empty_figure("loading ...", height=ACTION_HEIGHT),
                        config=GRAPH_CONFIG,
                        style={"height": f"{ACTION_HEIGHT}px"},
                    )
                    for graph_id in ("action-hist", "action-quantiles")
                ],
                className="panels",
            ),
        ],
        className="card",
    )


@dataclass(frozen=True)
class TimelineRow:
    step: int
    kind: str
    title: str
    detail: str
    evidence: dict[str, object]


def timeline_rows(ctx: RunContext) -> list[TimelineRow]:
    rows = [
        TimelineRow(
            e.step,
            "phase",
            f"{e.previous_phase or '-'} → {e.phase}",
            str(e.evidence.get("note", "")),
            e.evidence,
        )
        for e in ctx.events
    ]
    rows += [
        TimelineRow(
            a.first_step,
            "alert",
            f"{a.kind} ({a.severity}, {a.status})",
            f"steps {a.first_step}-{a.last_step}: {a.message}",
            a.evidence,
        )
        for a in ctx.alerts
    ]
    rows += [
        TimelineRow(
            d.step or 0,
            "directive",
            f"v{d.version}: LLDS {'on' if d.llds_enabled else 'off'} λ={d.llds_lambda:g}",
            f"{d.source}: {d.reason}",
            {},
        )
        for d in ctx.directives
        if d.version > 0
    ]
    order = {"phase": 0, "alert": 1, "directive": 2}
    return sorted(rows, key=lambda r: (-r.step, order[r.kind]))


def timeline_table(ctx: RunContext) -> Component:
    rows = timeline_rows(ctx)
    if not rows:
        return html.P("No phase changes, alerts or directives yet.", className="muted")
    body = []
    for r in rows:
        evidence: Component | str = ""
        if r.evidence:
            evidence = html.Details(
                [
                    html.Summary("; ".join(evidence_lines(r.evidence, limit=3))[:140] or "evidence"),
                    html.Pre(json.dumps(r.evidence, indent=1, default=str), className="evidence"),
                ]
            )
        body.append(
            html.Tr(
                [
                    html.Td(str(r.step)),
                    html.Td(r.kind),
                    html.Td(r.title),
                    html.Td(r.detail),
                    html.Td(evidence),
                ],
                className=f"timeline-{r.kind}",
            )
        )
    head = html.Thead(html.Tr([html.Th(c) for c in ("step", "kind", "what", "detail", "evidence")]))
    return html.Table([head, html.Tbody(body)], className="grid", id="timeline-table")

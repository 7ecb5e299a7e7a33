"""Run page (/dashboard/run/<id>, /run/<name> or /run/<project>/<name>): live panels, action-delta
distribution, timeline, directive controls."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dash import dcc, html
from dash.development.base_component import Component

from contracts.wire import DIRECTIVE_POLICIES
from dashboard.figures import (
    ACTION_HEIGHT,
    HISTOGRAM_TITLE,
    PANEL_HEIGHT,
    LegendEntry,
    empty_figure,
    legend_entries,
    quantiles_title,
)
from dashboard.inputs import DEFAULT_ACTION_WINDOW, MAX_ACTION_WINDOW
from dashboard.layout import PathFor, ago, graph_card, phase_badge, status_badge, tag_list
from dashboard.panels import PANELS
from dashboard.theme import BAND_OPACITY, SYMBOL_GLYPHS
from monitor.detector.explain import (
    PHASE_DESCRIPTIONS,
    alert_steps,
    explain_finding,
    explain_phase_change,
)
from monitor.domain import DirectiveInfo, RunContext, RunInfo

REFRESH_MS = 5_000
ACTION_WINDOWS = (20, DEFAULT_ACTION_WINDOW, MAX_ACTION_WINDOW)
GRAPH_CONFIG: Any = {"displaylogo": False, "responsive": True}
"""Responsive width; the height is fixed by each graph's style (a responsive graph fills its box)."""


def layout(
    rc: RunContext,
    overlay: dict[str, Any],
    *,
    steer: bool,
    path_for: PathFor,
    refresh_ms: int = REFRESH_MS,
) -> Component:
    """The page of a run, drawn from its context as read once for this page: header, directive, timeline,
    and `overlay` (the bands and markers every panel draws, `dashboard.callbacks.run_panels.overlay_of`)
    for the panels' load callbacks; the refresh callbacks take over from there."""
    run = rc.run
    return html.Div(
        [
            dcc.Store(id="run-id", data=run.id),
            dcc.Store(id="run-overlay", data=overlay),
            *[dcc.Store(id=f"cursor-{panel.key}") for panel in PANELS],
            dcc.Store(id="directive-changed"),
            dcc.Store(id="timeline-signature", data=overlay["signature"]),
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
            directive_card(run, rc.directive, steer),
            legend_card(),
            html.Div(
                [
                    graph_card(
                        panel.title,
                        dcc.Graph(
                            id=f"panel-{panel.key}",
                            figure=empty_figure("loading ..."),
                            config=GRAPH_CONFIG,
                            className="panel-graph",
                            style={"height": f"{PANEL_HEIGHT}px"},
                        ),
                    )
                    for panel in PANELS
                ],
                className="panels",
            ),
            actions_card(),
            html.Div(
                [
                    html.H3("Alerts, phase changes and directives"),
                    html.Div(timeline_table(rc), id="run-timeline"),
                ],
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
                html.Span(["status ", status_badge(run.status, run.last_seen_at)], id="run-status"),
                html.Span(f"last step {'-' if run.last_step is None else run.last_step}", id="run-last-step"),
                html.Span(
                    f"last seen {ago(run.last_seen_at)}",
                    className="muted",
                    title=run.last_seen_at.isoformat(),
                    id="run-last-seen",
                ),
                html.Span(tag_list(run.tags)),
                html.Span(f"policy {run.directive_policy}", className="muted"),
            ],
            className="runhead",
        )
    ]


def directive_status(directive: DirectiveInfo, policy: str) -> Component:
    state = "on" if directive.llds.enabled else "off"
    data_attrs: dict[str, Any] = {"data-enabled": str(directive.llds.enabled).lower()}
    return html.Div(
        [
            html.B(f"LLDS {state}", id="directive-llds", **data_attrs),
            html.Span(f" λ={directive.llds.lam:g} · directive v{directive.version} ({directive.source})"),
            html.Span(f" · policy {policy}", id="directive-policy"),
            html.Div(lever_text(directive), id="directive-levers"),
            html.Div(directive.reason, className="muted"),
        ]
    )


def lever_text(d: DirectiveInfo) -> str:
    """Checkpoint/rollback/stop requests and how far the trainer acknowledged them, in words."""
    parts = [f"checkpoint request #{d.checkpoint}" if d.checkpoint else "no checkpoint request"]
    if d.rollback:
        parts.append(f"rollback request #{d.rollback} to step {d.rollback_to}")
    if d.lr_scale != 1.0:
        parts.append(f"learning rate x{d.lr_scale:g}")
    parts.append(f"stop requested (#{d.stop})" if d.stop else "no stop request")
    parts.append(f"stop on collapse {'on' if d.stop_on_collapse else 'off'}")
    ack = (
        f"trainer acknowledged v{d.applied_version}"
        if d.applied_version
        else "trainer acknowledged nothing yet"
    )
    if d.version > d.applied_version:
        ack += f" (v{d.version} pending)"
    return " · ".join([*parts, ack])


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
                        id="llds-lam",
                        type="number",
                        value=directive.llds.lam,
                        min=0,
                        step=0.01,
                        style={"width": "150px"},  # the - and + steppers take ~65 px of it
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
            html.Button("Save checkpoint now", id="checkpoint-now"),
            html.Button("Stop training", id="stop-now", className="off"),
            html.Button(
                f"Stop on collapse: turn {'off' if directive.stop_on_collapse else 'on'}",
                id="stop-on-collapse",
            ),
            html.Span(id="directive-msg", className="msg"),
            dcc.ConfirmDialog(id="directive-confirm"),  # asked before steering a run that is not running
            dcc.Store(id="directive-pending"),  # the button press waiting for that answer
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
                    graph_card(
                        title,
                        dcc.Graph(
                            id=graph_id,
                            figure=empty_figure("loading ...", height=ACTION_HEIGHT, title=title),
                            config=GRAPH_CONFIG,
                            style={"height": f"{ACTION_HEIGHT}px"},
                        ),
                        title_id=f"{graph_id}-title",  # the callback names the step shown
                        card=False,
                    )
                    for graph_id, title in (
                        ("action-hist", HISTOGRAM_TITLE),
                        ("action-quantiles", quantiles_title()),
                    )
                ],
                className="panels",
            ),
        ],
        className="card",
    )


def _legend_item(entry: LegendEntry) -> Component:
    if entry.symbol is None:
        mark = html.Span(className="swatch", style={"background": entry.color})
        if entry.banded:  # also shown as the shaded band behind the charts
            band = {"background": entry.color, "opacity": BAND_OPACITY, "border": f"1px solid {entry.color}"}
            mark = html.Span([mark, html.Span(className="swatch", style=band)], className="item")
    else:
        mark = html.Span(
            SYMBOL_GLYPHS.get(entry.symbol, "●"), className="glyph", style={"color": entry.color}
        )
    data_attrs: dict[str, Any] = {"data-legend": f"{entry.group}:{entry.key}"}
    return html.Span([mark, html.Span(entry.label)], className="item", title=entry.description, **data_attrs)


def legend_card() -> Component:
    """What the phase colours and the marker shapes on the panels mean (from the figures' own constants)."""
    entries = legend_entries()
    phases = [e for e in entries if e.symbol is None]
    markers = [e for e in entries if e.symbol is not None]
    return html.Div(
        [
            html.Div(
                [
                    html.Span(
                        "Phases", className="head", title="badge colour; shaded band behind the charts"
                    ),
                    *[_legend_item(e) for e in phases],
                ],
                className="legend",
            ),
            html.Div(
                [html.Span("Markers", className="head"), *[_legend_item(e) for e in markers]],
                className="legend",
                style={"marginTop": "6px"},
            ),
            html.Div(
                "A phase's colour is its badge and its phase-change marker; stagnation, decay and collapse are"
                " also shaded (light swatch) behind the charts from the step the phase began."
                " Hover a marker for the evidence.",
                className="muted",
                style={"fontSize": "12px", "marginTop": "4px"},
            ),
        ],
        className="card",
        id="run-legend",
    )


@dataclass(frozen=True)
class TimelineRow:
    step: int
    kind: str
    title: str
    detail: str
    explanation: list[str]
    """Human lines (no internal keys): what fired, the statistic by name, the metric's values."""
    evidence: dict[str, object]
    """The raw evidence (JSON), behind a "raw" toggle."""


def _phase_detail(note: object, phase: str) -> str:
    return note.strip() if isinstance(note, str) and note.strip() else PHASE_DESCRIPTIONS.get(phase, "")


def timeline_rows(ctx: RunContext) -> list[TimelineRow]:
    rows = [
        TimelineRow(
            e.step,
            "phase",
            f"{e.previous_phase or '-'} → {e.phase}",
            _phase_detail(e.evidence.get("note"), e.phase),
            explain_phase_change(e.phase, e.previous_phase, e.evidence, e.step)[1:],
            e.evidence,
        )
        for e in ctx.phases
    ]
    rows += [
        TimelineRow(
            a.first_step,
            "alert",
            f"{a.kind} ({a.severity}, {a.status})",
            f"{alert_steps(a.first_step, a.last_step, a.reopen_count)}: {a.message}",
            explain_finding(a.kind, "", a.evidence, a.first_step),
            a.evidence,
        )
        for a in ctx.alerts
    ]
    rows += [
        TimelineRow(
            d.step or 0,
            "directive",
            f"v{d.version}: LLDS {'on' if d.llds.enabled else 'off'} λ={d.llds.lam:g}"
            + (f", checkpoint #{d.checkpoint}" if d.checkpoint == d.version else "")
            + (f", stop #{d.stop}" if d.stop == d.version else ""),
            f"{d.source}: {d.reason} · "
            + (
                f"acknowledged at step {d.applied_step}"
                if d.applied_step is not None
                else "not acknowledged yet"
            ),
            [],
            {},
        )
        for d in ctx.directives
        if d.version > 0
    ]
    order = {"phase": 0, "alert": 1, "directive": 2}
    return sorted(rows, key=lambda r: (-r.step, order[r.kind]))


SUMMARY_CHARS = 160


def _evidence_cell(r: TimelineRow) -> Component | str:
    if not r.explanation and not r.evidence:
        return ""
    first = r.explanation[0] if r.explanation else "evidence"
    summary = first if len(first) <= SUMMARY_CHARS else first[: SUMMARY_CHARS - 3] + "..."
    more = f" (+{len(r.explanation) - 1} more)" if len(r.explanation) > 1 else ""
    children: list[Component] = [html.Summary(summary + more)]
    if r.explanation:
        children.append(html.Ul([html.Li(line) for line in r.explanation], className="explanation"))
    if r.evidence:
        children.append(
            html.Details(
                [
                    html.Summary("raw evidence (JSON)", className="muted"),
                    html.Pre(json.dumps(r.evidence, indent=1, default=str), className="evidence"),
                ]
            )
        )
    return html.Details(children)


def timeline_table(ctx: RunContext) -> Component:
    rows = timeline_rows(ctx)
    if not rows:
        return html.P("No phase changes, alerts or directives yet.", className="muted")
    body = [
        html.Tr(
            [
                html.Td(str(r.step)),
                html.Td(r.kind),
                html.Td(r.title),
                html.Td(r.detail),
                html.Td(_evidence_cell(r)),
            ],
            className=f"timeline-{r.kind}",
        )
        for r in rows
    ]
    head = html.Thead(html.Tr([html.Th(c) for c in ("step", "kind", "what", "detail", "evidence")]))
    return html.Table([head, html.Tbody(body)], className="grid", id="timeline-table")

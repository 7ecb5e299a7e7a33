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


DEFAULT_SERVER_URL = "http://127.0.0.1:8000"


def first_run_help(server_url: str | None = None) -> Component:
    """What a dashboard with no runs shows: the ways a first run gets here, with this server's address
    (the API's base URL, never the dashboard's: a client given `/dashboard/` is refused)."""
    url = (server_url or DEFAULT_SERVER_URL).rstrip("/")
    trl = (
        "from trainer_hooks.trl import MonitoredGRPOTrainer   # in place of trl.GRPOTrainer\n"
        'trainer = MonitoredGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(run_name="my-run"), ...)\n'
        "trainer.train()"
    )
    loop = (
        "from trainer_hooks.client import MonitorClient\n"
        f'client = MonitorClient("{url}", "my-run")\n'
        'client.log(step, {"reward/mean": reward})   # every step; client.close() at the end'
    )
    return html.Div(
        [
            html.P("No runs yet. A first run gets here in one of these ways:"),
            html.Ul(
                [
                    html.Li(
                        [
                            "a TRL GRPO job: ",
                            html.Code(f"LLDMON_URL={url}"),
                            " in its environment, and three lines:",
                            html.Pre(trl, className="evidence"),
                        ]
                    ),
                    html.Li(
                        ["any training loop, through MonitorClient:", html.Pre(loop, className="evidence")]
                    ),
                    html.Li(
                        [
                            html.Code("lldmon demo"),
                            ": a replayed collapse and a real GRPO training on CPU (its own server)",
                        ]
                    ),
                    html.Li(
                        [
                            html.Code(f"lldmon import run.jsonl --run my-run --url {url}"),
                            ": a training log you already have (TRL, verl, JSONL, CSV, TensorBoard)",
                        ]
                    ),
                ]
            ),
        ],
        id="runs-empty",
    )


def table(
    rows: Sequence[RunRow], path_for: PathFor, *, filtered: bool = False, server_url: str | None = None
) -> Component:
    """The runs table; with no rows, why: nothing matches the filters (`filtered`), or no run exists yet
    (how to get one, addressed to `server_url`)."""
    if not rows:
        if filtered:
            return html.P("No runs match these filters.", className="muted", id="runs-empty")
        return first_run_help(server_url)
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

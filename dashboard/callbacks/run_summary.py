"""Run page header, directive status and the alerts/events timeline, refreshed with the panels (the
page is built with them: this callback only refreshes).

The timeline is re-sent only when a phase event, alert or directive changed, so evidence the user
has expanded stays open between refreshes.
"""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, State, html, no_update
from dash.development.base_component import Component

from dashboard import data, inputs
from dashboard.auth import current_principal
from dashboard.callbacks.base import DashContext, error_text
from dashboard.pages import run as run_page
from monitor.domain import Principal
from monitor.errors import LLDMonError


def run_summary(
    ctx: DashContext, principal: Principal, run_id: object, shown: object = None
) -> tuple[list[Component], Component, Component | Any, str | Any]:
    """(header children, directive status, timeline table or no_update, signature of the timeline)."""
    try:
        rc = data.run_context(ctx.state, principal, inputs.run_id(run_id))
    except LLDMonError as exc:
        message = html.P(error_text(exc), className="msg err")
        return [message], message, message, None
    timeline: Component | Any = no_update
    signature = data.signature(rc)
    if signature != shown:
        timeline = run_page.timeline_table(rc)
    return (
        run_page.header_children(rc.run),
        run_page.directive_status(rc.directive, rc.run.directive_policy),
        timeline,
        signature if signature != shown else no_update,
    )


def register(app: Dash, ctx: DashContext) -> None:
    @app.callback(
        Output("run-header", "children"),
        Output("directive-status", "children"),
        Output("run-timeline", "children"),
        Output("timeline-signature", "data"),
        Input("run-tick", "n_intervals"),
        Input("directive-changed", "data"),
        State("run-id", "data"),
        State("timeline-signature", "data"),
        prevent_initial_call=True,
    )
    def _summary(_tick: object, _changed: object, run_id: object, shown: object) -> tuple[Any, ...]:
        return run_summary(ctx, current_principal(), run_id, shown)

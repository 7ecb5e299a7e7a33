"""Runs list: filters -> table (refreshed every few seconds)."""

from __future__ import annotations

from typing import Any

import flask
from dash import Dash, Input, Output, html
from dash.development.base_component import Component

from dashboard import data, inputs
from dashboard.auth import current_principal
from dashboard.callbacks.base import DashContext, error_text
from dashboard.pages import runs as runs_page
from monitor.domain import Principal
from monitor.errors import LLDMonError


def runs_table(
    ctx: DashContext,
    principal: Principal,
    project: object,
    status: object,
    tag: object,
    search: object,
    *,
    server_url: str | None = None,
) -> tuple[Component, list[dict[str, Any]]]:
    """The table for the filters, and the project filter's options (a filter that is not usable text
    is a message naming it). `server_url`: the address trainers reach this server at, for the help an
    empty list shows."""
    try:
        filters = {
            "project": inputs.text(project, "project"),
            "status": inputs.text(status, "status"),
            "tag": inputs.text(tag, "tag"),
            "search": inputs.text(search, "search"),
        }
        rows = data.list_runs(ctx.state, principal, **filters)
        options = [{"label": p, "value": p} for p in data.projects(ctx.state, principal)]
    except LLDMonError as exc:
        return html.P(error_text(exc), className="msg err"), []
    filtered = any(filters.values())
    return runs_page.table(rows, ctx.path_for, filtered=filtered, server_url=server_url), options


def _server_url() -> str | None:
    """The base URL the browser reached this server at (the dashboard is mounted below it)."""
    return flask.request.host_url.rstrip("/") if flask.has_request_context() else None


def register(app: Dash, ctx: DashContext) -> None:
    @app.callback(
        Output("runs-table", "children"),
        Output("runs-project", "options"),
        Input("runs-project", "value"),
        Input("runs-status", "value"),
        Input("runs-tag", "value"),
        Input("runs-search", "value"),
        Input("runs-tick", "n_intervals"),
    )
    def _runs(
        project: object, status: object, tag: object, search: object, _tick: object
    ) -> tuple[Component, list[dict[str, Any]]]:
        return runs_table(ctx, current_principal(), project, status, tag, search, server_url=_server_url())

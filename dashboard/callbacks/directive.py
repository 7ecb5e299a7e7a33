"""Directive controls: LLDS on/off with lambda, and the run's directive policy (off/alert/auto).

Writes go through `state.query.set_directive` / `state.runs.set_policy` with the caller's Principal, so
the API's project scoping applies; the controls are only rendered for callers allowed to steer.
"""

from __future__ import annotations

import time
from typing import Any

from dash import Dash, Input, Output, State, no_update
from dash import ctx as dash_ctx

from contracts.directive import DEFAULT_LLDS_LAMBDA
from dashboard.auth import current_principal
from dashboard.callbacks.base import DashContext, error_text
from monitor.domain import Principal
from monitor.errors import LLDMonError


def set_llds(
    ctx: DashContext, principal: Principal, run_id: int, enabled: bool, lam: float | None
) -> tuple[str, bool]:
    """Switch LLDS; returns (message, ok)."""
    lam = DEFAULT_LLDS_LAMBDA if lam is None else float(lam)
    reason = f"dashboard: LLDS switched {'on' if enabled else 'off'} by hand"
    try:
        directive = ctx.state.query.set_directive(
            principal, run_id, llds_enabled=enabled, llds_lambda=lam, reason=reason
        )
    except LLDMonError as exc:
        return error_text(exc), False
    state = "on" if directive.llds_enabled else "off"
    return f"LLDS {state} (λ={directive.llds_lambda:g}), directive v{directive.version}", True


def set_policy(ctx: DashContext, principal: Principal, run_id: int, policy: str | None) -> tuple[str, bool]:
    try:
        run = ctx.state.runs.set_policy(principal, run_id, policy or "")
    except LLDMonError as exc:
        return error_text(exc), False
    return f"policy set to {run.directive_policy}", True


def register(app: Dash, ctx: DashContext) -> None:
    @app.callback(
        Output("directive-msg", "children"),
        Output("directive-msg", "className"),
        Output("directive-changed", "data"),
        Input("llds-on", "n_clicks"),
        Input("llds-off", "n_clicks"),
        Input("policy-apply", "n_clicks"),
        State("llds-lambda", "value"),
        State("policy", "value"),
        State("run-id", "data"),
        prevent_initial_call=True,
    )
    def _apply(
        _on: int | None,
        _off: int | None,
        _policy: int | None,
        lam: float | None,
        policy: str | None,
        run_id: int,
    ) -> tuple[Any, ...]:
        principal = current_principal()
        trigger = dash_ctx.triggered_id
        if trigger in ("llds-on", "llds-off"):
            message, ok = set_llds(ctx, principal, run_id, trigger == "llds-on", lam)
        elif trigger == "policy-apply":
            message, ok = set_policy(ctx, principal, run_id, policy)
        else:
            return no_update, no_update, no_update
        return message, "msg" if ok else "msg err", time.time() if ok else no_update

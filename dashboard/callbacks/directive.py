"""Directive controls: LLDS on/off with lambda, the run's directive policy (off/alert/auto), and the
levers: save a checkpoint now, stop training (always confirmed: it ends the run), stop on collapse.

Writes go through `state.directives.set_manual` / `state.runs.set_policy` with the caller's Principal, so
the API's project scoping applies; the controls are only rendered for callers allowed to steer. The
values are checked by `dashboard.inputs` with the rules every entry point applies
(`contracts.directive.directive_problem`, `contracts.wire.DIRECTIVE_POLICIES`) before anyone is asked to
confirm, and again by the services, so the dashboard stores nothing PUT /directive or PUT /policy would
refuse. On a run that is not running (no trainer
reads its directive until it resumes) a change is only made after the user confirms it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Final

from dash import Dash, Input, Output, State, no_update
from dash import ctx as dash_ctx

from dashboard import inputs
from dashboard.auth import current_principal
from dashboard.callbacks.base import DashContext, error_text
from monitor.domain import Principal
from monitor.errors import LLDMonError

LEVERS: Final = ("checkpoint-now", "stop-now", "stop-on-collapse")
"""The lever buttons (their component ids)."""
ACTIONS: Final = ("llds-on", "llds-off", "policy-apply", *LEVERS)
"""The buttons (their component ids)."""


def set_llds(
    ctx: DashContext, principal: Principal, run_id: object, enabled: bool, lam: object
) -> tuple[str, bool]:
    """Switch LLDS (an empty lambda box: the default lambda); returns (message, ok)."""
    try:
        directive = ctx.state.directives.set_manual(
            principal,
            inputs.run_id(run_id),
            llds_enabled=enabled,
            lam=inputs.lam(lam),
            reason=f"dashboard: LLDS switched {'on' if enabled else 'off'} by hand",
        )
    except LLDMonError as exc:
        return error_text(exc), False
    state = "on" if directive.llds.enabled else "off"
    return f"LLDS {state} (λ={directive.llds.lam:g}), directive v{directive.version}", True


def set_lever(ctx: DashContext, principal: Principal, run_id: int, action: str) -> tuple[str, bool]:
    """A lever button: request a checkpoint or a stop, or flip stop-on-collapse; returns (message, ok)."""
    try:
        if action == "stop-on-collapse":
            on = not ctx.state.directives.current(principal, run_id).stop_on_collapse
            d = ctx.state.directives.set_manual(
                principal,
                run_id,
                stop_on_collapse=on,
                reason=f"dashboard: stop on collapse {'on' if on else 'off'}",
            )
        elif action == "stop-now":
            d = ctx.state.directives.set_manual(
                principal, run_id, stop=True, reason="dashboard: stop requested by hand"
            )
        else:
            d = ctx.state.directives.set_manual(
                principal, run_id, checkpoint=True, reason="dashboard: checkpoint requested by hand"
            )
    except LLDMonError as exc:
        return error_text(exc), False
    if action == "stop-on-collapse":
        return f"stop on collapse {'on' if d.stop_on_collapse else 'off'}, directive v{d.version}", True
    what = "stop" if action == "stop-now" else "checkpoint"
    return f"{what} requested, directive v{d.version}: the trainer acts on its next step", True


def set_policy(ctx: DashContext, principal: Principal, run_id: object, policy: object) -> tuple[str, bool]:
    try:
        run = ctx.state.runs.set_policy(principal, inputs.run_id(run_id), inputs.directive_policy(policy))
    except LLDMonError as exc:
        return error_text(exc), False
    return f"policy set to {run.directive_policy}", True


@dataclass(frozen=True)
class Outcome:
    message: str = ""
    ok: bool = False
    confirm: str | None = None
    """A question for the user; nothing was written (ask, then call again with confirmed=True)."""


def _what(action: str, lam: object, policy: object) -> str:
    """What the button does, in words, for the confirmation (the values are already validated)."""
    if action == "policy-apply":
        return f"set its directive policy to {inputs.directive_policy(policy)}"
    if action == "checkpoint-now":
        return "request a checkpoint"
    if action == "stop-now":
        return "stop its training (the trainer saves a checkpoint, then ends)"
    if action == "stop-on-collapse":
        return "change whether it stops on collapse"
    return f"switch LLDS {'on' if action == 'llds-on' else 'off'} (λ={inputs.lam(lam):g})"


def apply_action(
    ctx: DashContext,
    principal: Principal,
    run_id: object,
    action: object,
    lam: object,
    policy: object,
    *,
    confirmed: bool = False,
) -> Outcome:
    """A directive button: checked like the API, then written, or first a question when the run is
    not running, and always before a stop."""
    if action not in ACTIONS:
        return Outcome("unknown action")
    try:
        what = _what(str(action), lam, policy)
        run = ctx.state.runs.get(principal, inputs.run_id(run_id))
    except LLDMonError as exc:
        return Outcome(error_text(exc))
    if run.status != "running" and not confirmed:
        return Outcome(
            confirm=f"Run {run.name!r} is {run.status}: no trainer reads its directive until it resumes. "
            f"{what[0].upper()}{what[1:]} anyway?"
        )
    if action == "stop-now" and not confirmed:
        return Outcome(confirm=f"Stop run {run.name!r}? The trainer saves a checkpoint and ends training.")
    if action in LEVERS:
        message, ok = set_lever(ctx, principal, run.id, str(action))
    elif action == "policy-apply":
        message, ok = set_policy(ctx, principal, run.id, policy)
    else:
        message, ok = set_llds(ctx, principal, run.id, action == "llds-on", lam)
    return Outcome(message, ok)


def pending_action(pending: object) -> tuple[object, object, object]:
    """(action, lambda, policy) of the request waiting for confirmation (kept in the browser)."""
    if not isinstance(pending, dict):
        return None, None, None
    return pending.get("action"), pending.get("lam"), pending.get("policy")


def register(app: Dash, ctx: DashContext) -> None:
    @app.callback(
        Output("directive-msg", "children"),
        Output("directive-msg", "className"),
        Output("directive-changed", "data"),
        Output("directive-confirm", "displayed"),
        Output("directive-confirm", "message"),
        Output("directive-pending", "data"),
        Input("llds-on", "n_clicks"),
        Input("llds-off", "n_clicks"),
        Input("policy-apply", "n_clicks"),
        Input("checkpoint-now", "n_clicks"),
        Input("stop-now", "n_clicks"),
        Input("stop-on-collapse", "n_clicks"),
        Input("directive-confirm", "submit_n_clicks"),
        State("llds-lam", "value"),
        State("policy", "value"),
        State("run-id", "data"),
        State("directive-pending", "data"),
        prevent_initial_call=True,
    )
    def _apply(
        _on: object,
        _off: object,
        _policy: object,
        _checkpoint: object,
        _stop: object,
        _stop_on_collapse: object,
        _confirmed: object,
        lam: object,
        policy: object,
        run_id: object,
        pending: object,
    ) -> tuple[Any, ...]:
        trigger = dash_ctx.triggered_id
        if trigger == "directive-confirm":
            action, lam, policy = pending_action(pending)
            outcome = apply_action(ctx, current_principal(), run_id, action, lam, policy, confirmed=True)
        elif trigger in ACTIONS:
            outcome = apply_action(ctx, current_principal(), run_id, trigger, lam, policy)
        else:
            return (no_update,) * 6
        if outcome.confirm is not None:
            request = {"action": trigger, "lam": lam, "policy": policy}
            return "", "msg", no_update, True, outcome.confirm, request
        changed = time.time() if outcome.ok else no_update
        return outcome.message, "msg" if outcome.ok else "msg err", changed, False, no_update, None

"""`lldmon directive`: show or change what the trainer is told, on the database or over a remote API."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from contracts.directive import DEFAULT_LLDS_LAMBDA
from monitor.cli._common import (
    AsJson,
    DatabaseUrl,
    DataDir,
    Policy,
    RemoteToken,
    RemoteUrl,
    closing,
    console,
    open_state,
    print_json,
    run_id_of,
)
from monitor.text import printable


def directive(
    run: Annotated[str, typer.Argument(help="Run id or unique name.")],
    llds: Annotated[Literal["on", "off"] | None, typer.Option("--llds")] = None,
    lam: Annotated[
        float | None, typer.Option("--lambda", help=f"LLDS weight (paper: {DEFAULT_LLDS_LAMBDA}).")
    ] = None,
    checkpoint: Annotated[
        bool, typer.Option("--checkpoint", help="Ask the trainer to save a checkpoint now (once).")
    ] = False,
    stop: Annotated[
        bool | None,
        typer.Option(
            "--stop/--withdraw-stop", help="Ask the trainer to save and stop gracefully, or withdraw that."
        ),
    ] = None,
    stop_on_collapse: Annotated[
        Literal["on", "off"] | None,
        typer.Option("--stop-on-collapse", help="Request a stop when the run enters collapse."),
    ] = None,
    rollback_to: Annotated[
        int | None,
        typer.Option(
            "--rollback-to",
            min=0,
            help="Ask the trainer (under `lldmon supervise`) to restore its newest checkpoint at or before "
            "this step and continue from there.",
        ),
    ] = None,
    lr_scale: Annotated[
        float | None,
        typer.Option("--lr-scale", min=0, max=1, help="With --rollback-to: learning rate times this factor."),
    ] = None,
    policy: Annotated[Policy | None, typer.Option(help="How far lldmon may steer the trainer.")] = None,
    reason: Annotated[str, typer.Option(help="Recorded with the change.")] = "",
    as_json: AsJson = False,
    url: RemoteUrl = None,
    token: RemoteToken = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Show or change what the trainer is told (`--llds on --lambda 0.3`, `--checkpoint`,
    `--rollback-to 96 --lr-scale 0.5`, `--stop`, `--stop-on-collapse on`) and the run's policy; the trainer acknowledges each change in its next batch.
    --json: the directive as the API shows it (after the change)."""
    from monitor.domain import Principal

    state = open_state(url, token, database_url, data_dir)
    with closing(state):
        run_id = run_id_of(state, run)
        if policy is not None:
            state.runs.set_policy(Principal(), run_id, policy)
        sets_llds = llds is not None or lam is not None
        if lr_scale is not None and rollback_to is None:
            raise typer.BadParameter("--lr-scale goes with --rollback-to", param_hint="--lr-scale")
        if (
            sets_llds
            or checkpoint
            or rollback_to is not None
            or stop is not None
            or stop_on_collapse is not None
        ):
            current = state.directives.current(Principal(), run_id)
            state.directives.set_manual(
                Principal(),
                run_id,
                llds_enabled=(current.llds.enabled if llds is None else llds == "on") if sets_llds else None,
                lam=(current.llds.lam if lam is None else lam) if sets_llds else None,
                checkpoint=checkpoint,
                stop=stop,
                stop_on_collapse=None if stop_on_collapse is None else stop_on_collapse == "on",
                reason=reason,
                rollback_to=rollback_to,
                lr_scale=lr_scale,
            )
        current = state.directives.current(Principal(), run_id)
        run_info = state.runs.get(Principal(), run_id)
    if as_json:
        from monitor.api.schemas import DirectiveOut

        print_json(DirectiveOut.of(current).model_dump(mode="json"))
        return
    levers = [
        f"checkpoint request #{current.checkpoint}" if current.checkpoint else "",
        f"rollback request #{current.rollback} to step {current.rollback_to}" if current.rollback else "",
        f"learning rate x{current.lr_scale:g}" if current.lr_scale != 1.0 else "",
        f"stop requested (#{current.stop}: {printable(current.stop_reason)})" if current.stop else "",
        "stop on collapse" if current.stop_on_collapse else "",
        f"acknowledged v{current.applied_version}" if current.applied_version else "not acknowledged yet",
    ]
    console.print(
        f"run {run_id}: policy {run_info.directive_policy}; directive v{current.version}: "
        f"LLDS {'on' if current.llds.enabled else 'off'}, lambda {current.llds.lam} "
        f"({printable(current.source)}: {printable(current.reason)}); {'; '.join(x for x in levers if x)}",
        markup=False,
        soft_wrap=True,
    )

"""`lldmon runs`: list runs, show one, set its liveness thresholds; on the database or, with --url, over
a remote service's HTTP API (the token's project scope)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from monitor.cli._common import (
    AsJson,
    DatabaseUrl,
    DataDir,
    ProjectOfRun,
    RemoteToken,
    RemoteUrl,
    RunStatus,
    closing,
    console,
    open_state,
    print_json,
    run_id_of,
    shown,
)

runs_app = typer.Typer(help="Inspect runs (--url: of a remote service).", no_args_is_help=True)


@runs_app.command("list")
def runs_list(
    project: Annotated[str | None, typer.Option()] = None,
    status: Annotated[RunStatus | None, typer.Option(help="Only runs in this status.")] = None,
    tag: Annotated[str | None, typer.Option()] = None,
    as_json: AsJson = False,
    url: RemoteUrl = None,
    token: RemoteToken = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    from monitor.domain import Principal, RunFilter

    state = open_state(url, token, database_url, data_dir)
    with closing(state):
        runs = state.runs.list(Principal(), RunFilter(project=project, status=status, tag=tag))
    if as_json:
        from monitor.api.schemas import RunOut

        print_json([RunOut.of(r).model_dump(mode="json") for r in runs])
        return
    table = Table("id", "project", "name", "status", "phase", "last step", "last seen", "tags")
    for r in runs:
        table.add_row(
            str(r.id),
            shown(r.project),
            shown(r.name),
            r.status,
            r.phase or "",
            str(r.last_step or ""),
            str(r.last_seen_at),
            shown(",".join(r.tags)),
        )
    console.print(table)


@runs_app.command("show")
def runs_show(
    run: Annotated[str, typer.Argument(help="Run id or name.")],
    project: ProjectOfRun = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output (strict JSON).")] = False,
    url: RemoteUrl = None,
    token: RemoteToken = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Summary of a run: steps, last metric values, phases, alerts and directive history."""
    from monitor.domain import Principal
    from monitor.run_report import render_summary, summary_json

    state = open_state(url, token, database_url, data_dir)
    with closing(state, exit_code=1):
        summary = state.query.summary(Principal(), run_id_of(state, run, project))
    if as_json:
        print_json(summary_json(summary))
    else:
        render_summary(summary, console)


@runs_app.command("liveness")
def runs_liveness(
    run: Annotated[str, typer.Argument(help="Run id or name.")],
    stall_after: Annotated[
        float | None, typer.Option("--stall-after", help="Seconds of silence before `stalled`.")
    ] = None,
    crash_after: Annotated[
        float | None, typer.Option("--crash-after", help="Seconds of silence before `crashed`.")
    ] = None,
    default: Annotated[
        bool, typer.Option("--default", help="Back to the service's default thresholds.")
    ] = False,
    project: ProjectOfRun = None,
    as_json: AsJson = False,
    url: RemoteUrl = None,
    token: RemoteToken = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Show or set how long a run may be silent (no batch, no heartbeat) before it is marked stalled
    (alert `run_stalled`) and crashed, e.g. `lldmon runs liveness grpo-7b --stall-after 600`."""
    from monitor.domain import Principal

    state = open_state(url, token, database_url, data_dir)
    with closing(state):
        service = state.liveness
        run_id = run_id_of(state, run, project)
        live = service.get(Principal(), run_id)
        if default or stall_after is not None or crash_after is not None:
            stall = None if default else stall_after if stall_after is not None else live.stall_after_s
            crash = None if default else crash_after if crash_after is not None else live.crash_after_s
            live = service.set_thresholds(Principal(), run_id, stall, crash)
    if as_json:
        from pydantic import TypeAdapter

        print_json(TypeAdapter(type(live)).dump_python(live, mode="json"))
        return

    def source(value: float | None) -> str:
        return "set on the run" if value is not None else "default"

    console.print(
        f"run {run_id}: {live.status}, last seen {live.silent_s:.0f} s ago; stalled after "
        f"{live.effective_stall_after_s:g} s ({source(live.stall_after_s)}), crashed after "
        f"{live.effective_crash_after_s:g} s ({source(live.crash_after_s)})"
    )

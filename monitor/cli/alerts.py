"""`lldmon alerts`: list and acknowledge a run's alerts, on the database or over a remote service's API."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from monitor.cli._common import (
    AlertStatus,
    DatabaseUrl,
    DataDir,
    RemoteToken,
    RemoteUrl,
    closing,
    console,
    open_state,
    print_json,
    run_id_of,
    shown,
)

alerts_app = typer.Typer(
    help="List and acknowledge alerts (--url: of a remote service).", no_args_is_help=True
)


@alerts_app.command("list")
def alerts_list(
    run: Annotated[str, typer.Argument(help="Run id or unique name.")],
    status: Annotated[AlertStatus | None, typer.Option(help="Only alerts in this status.")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="The API's alert objects, deliveries included (strict JSON).")
    ] = False,
    url: RemoteUrl = None,
    token: RemoteToken = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """The run's alerts. `steps`: from the step its condition started at to the last step it held (still
    moving while open); `delivery`: where each one's latest notification stands per sink."""
    from monitor.detector.explain import reopened_text
    from monitor.domain import Principal

    state = open_state(url, token, database_url, data_dir)
    with closing(state):
        alerts = state.alerts.list(Principal(), run_id_of(state, run), status)
    if as_json:
        from monitor.api.schemas import AlertOut

        print_json([AlertOut.of(a).model_dump(mode="json") for a in alerts])
        return

    def describe(d: Any) -> str:  # "webhook:host/1a2b3c4d firing failed (5 attempts, ReadTimeout)"
        detail = [f"{d.attempts} attempts"] if d.attempts > 1 else []
        detail += [d.last_error] if d.last_error and d.status != "delivered" else []
        return f"{d.sink} {d.event} {d.status}" + (f" ({', '.join(detail)})" if detail else "")

    table = Table("id", "severity", "kind", "status", "steps", "message", "delivery")
    for a in alerts:
        delivery = "\n".join(shown(describe(d)) for d in a.deliveries)  # one line per sink
        reopened = reopened_text(a.reopen_count)
        table.add_row(
            str(a.id),
            a.severity,
            a.kind,
            a.status + (f", {reopened}" if reopened else ""),
            f"{a.first_step}-{a.last_step}",
            shown(a.message),
            delivery or "-",
        )
    console.print(table)


@alerts_app.command("ack")
def alerts_ack(
    run: Annotated[str, typer.Argument(help="Run id or unique name.")],
    alert_id: int,
    url: RemoteUrl = None,
    token: RemoteToken = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Acknowledge an alert: no more re-notifications until it resolves."""
    from monitor.domain import Principal

    state = open_state(url, token, database_url, data_dir)
    with closing(state):
        alert = state.alerts.acknowledge(Principal(), run_id_of(state, run), alert_id)
    console.print(f"alert {alert.id} ({shown(alert.kind)}) {alert.status}")

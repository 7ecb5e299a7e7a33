"""`lldmon serve`: the API and dashboard on one port."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from monitor.cli._common import DatabaseUrl, DataDir, console, redact, settings_from
from monitor.serving import DEFAULT_KEEP_ALIVE, DEFAULT_REQUEST_TIMEOUT


def serve(
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
    host: Annotated[str | None, typer.Option(envvar="LLDMON_HOST")] = None,
    port: Annotated[
        int | None, typer.Option(envvar="LLDMON_PORT", min=0, max=65535, help="0: any free port.")
    ] = None,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes (PostgreSQL only).")] = 1,
    timeout_keep_alive: Annotated[
        int,
        typer.Option(
            envvar="LLDMON_TIMEOUT_KEEP_ALIVE",
            min=1,
            help="Seconds an idle keep-alive connection stays open.",
        ),
    ] = DEFAULT_KEEP_ALIVE,
    timeout_request: Annotated[
        float,
        typer.Option(
            envvar="LLDMON_TIMEOUT_REQUEST",
            min=0.1,
            help="Seconds a client has to send a request head, and the longest pause inside a body.",
        ),
    ] = DEFAULT_REQUEST_TIMEOUT,
) -> None:
    """Run the API (upgrades an empty or outdated embedded SQLite first).

    The port is bound before the service is announced: a busy port is an error here, not in a log.
    """
    from monitor.api.app import SchemaOutdated, create_app
    from monitor.serving import bind
    from monitor.serving import serve as serve_app

    settings = settings_from(database_url, data_dir, host=host, port=port)
    if workers > 1 and settings.is_sqlite:
        console.print("[red]error:[/red] --workers > 1 needs PostgreSQL (SQLite allows one writer)")
        raise typer.Exit(2)
    try:
        application = create_app(settings)
    except SchemaOutdated as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    try:
        sock = bind(settings.host, settings.port)
    except OSError as exc:
        application.state.lldmon.db.dispose()
        reason = (exc.strerror or str(exc)).lower()
        console.print(f"[red]error:[/red] cannot listen on {settings.host}:{settings.port}: {reason}")
        raise typer.Exit(2) from None
    host_text = f"[{settings.host}]" if ":" in settings.host else settings.host
    url = f"http://{host_text}:{sock.getsockname()[1]}"
    console.print(f"lldmon serving on [bold]{url}[/bold]  (API docs: {url}/docs)", soft_wrap=True)
    for path in application.state.mounted:
        console.print(f"dashboard: [bold]{url}{path}[/bold]", soft_wrap=True)
    console.print(f"database: {redact(settings.resolved_database_url())}", soft_wrap=True)
    console.print(f"raw action records kept: {settings.actions_retention or 'forever'}", soft_wrap=True)
    timeouts: dict[str, Any] = {"keep_alive": timeout_keep_alive, "request_timeout": timeout_request}
    with sock:
        if workers > 1:
            application.state.lldmon.db.dispose()
            # Worker processes build their settings from the environment (monitor.api.factory).
            os.environ["LLDMON_DATABASE_URL"] = settings.resolved_database_url()
            serve_app("monitor.api.factory:app", sock, factory=True, workers=workers, **timeouts)
            return
        serve_app(application, sock, log_level=settings.log_level, **timeouts)

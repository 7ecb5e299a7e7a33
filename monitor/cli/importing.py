"""`lldmon import`: trainer logs into a run, on the database or through a remote service's ingest API."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from monitor.cli._common import (
    DatabaseUrl,
    DataDir,
    RemoteToken,
    RemoteUrl,
    console,
    require_server,
    services,
)


def import_logs(
    paths: Annotated[
        list[Path], typer.Argument(help="Log files of one run, in the order written (a later file wins).")
    ],
    run: Annotated[
        str | None,
        typer.Option(
            "--run",
            help="Run name (created if missing); needed unless the log names its run (lab-fixture: its "
            "header's name).",
        ),
    ] = None,
    project: Annotated[str | None, typer.Option(help="Project (default: default).")] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="auto, verl-jsonl, verl-console, trl-log, trl-state, wandb-csv, csv, ms-swift, tensorboard, "
            "lldmon (what lldmon export writes; auto finds it for Parquet) or lab-fixture (the recorded "
            "runs of tests/fixtures/lab). Gzip-compressed text logs are read as they are.",
        ),
    ] = "auto",
    strict: Annotated[bool, typer.Option(help="Fail on the first malformed line; write nothing.")] = False,
    append: Annotated[
        bool, typer.Option(help="Add to a run that has metrics (a stored step is overwritten).")
    ] = False,
    replace: Annotated[bool, typer.Option(help="Delete the run's metrics, phases and alerts first.")] = False,
    first_step: Annotated[
        list[int] | None,
        typer.Option(min=0, help="trl-log: step of each file's first dict (once per file)."),
    ] = None,
    tag: Annotated[list[str] | None, typer.Option(help="Tag the run (repeatable).")] = None,
    chunk_steps: Annotated[
        int | None, typer.Option(min=1, help="Steps per ingest batch (default 50).")
    ] = None,
    notify: Annotated[
        bool,
        typer.Option(
            help="Send alerts to the configured webhooks too (local only: with --url the service's detector "
            "raises the alerts and its own sinks deliver them)."
        ),
    ] = False,
    url: RemoteUrl = None,
    token: RemoteToken = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Import trainer logs into a run; the detector runs as for a live run, phases and alerts are printed.

    With --url the logs are parsed here and sent through the service's ingest API in batches whose ids
    come from the run, the files' content and the step range, as a trainer's: importing the same files
    again is a no-op (duplicates on the service's ledger). --replace needs the database (local only).
    """
    from monitor.import_command import ImportOptions, run_import

    options = ImportOptions(
        paths=paths,
        run=run or "",
        project=project,
        fmt=fmt,
        strict=strict,
        append=append,
        replace=replace,
        first_step=first_step or [],
        tags=tag or [],
        chunk_steps=chunk_steps,
        notify=notify,
    )
    if url:
        from monitor.cli.remote_import import import_over_http

        code = import_over_http(options, console, url, token)
        if code:
            raise typer.Exit(code)
        return
    require_server()
    # An old log should not page anyone: webhook and Slack sinks only with --notify.
    quiet: dict[str, Any] = {} if notify else {"webhook_urls": [], "slack_webhook_urls": []}
    code = run_import(options, console, lambda: services(database_url, data_dir, **quiet))
    if code:
        raise typer.Exit(code)

"""`lldmon watch`: follow a growing training log and stream its steps to a service."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from monitor.cli._common import console


def watch(
    path: Annotated[Path, typer.Argument(help="The log file to follow (it may not exist yet).")],
    run: Annotated[str, typer.Option("--run", help="Run name (get-or-create on the service).")],
    url: Annotated[str, typer.Option(envvar="LLDMON_URL", help="Base URL of the service.")] = (
        "http://127.0.0.1:8000"
    ),
    token: Annotated[
        str | None, typer.Option(envvar="LLDMON_TOKEN", help="API token, if auth is on.")
    ] = None,
    project: Annotated[
        str | None, typer.Option(envvar="LLDMON_PROJECT", help="Project (default: the service's).")
    ] = None,
    fmt: Annotated[
        Literal["auto", "verl-jsonl", "verl-console", "trl-log"],
        typer.Option("--format", help="Log format; auto: from the name and the first metrics line."),
    ] = "auto",
    from_start: Annotated[
        bool, typer.Option("--from-start", help="Send the lines already in the file too (first watch only).")
    ] = False,
    until_idle: Annotated[
        float | None,
        typer.Option(min=0.1, help="Exit after this many seconds without a new line (default: never)."),
    ] = None,
    finish: Annotated[
        bool, typer.Option("--finish", help="With --until-idle: mark the run finished when idle.")
    ] = False,
    interval: Annotated[float, typer.Option(min=0.01, help="Seconds between checks of the file.")] = 0.5,
    state_dir: Annotated[
        Path | None,
        typer.Option(help="Where the resume state is kept (default ~/.lldmon/watch)."),
    ] = None,
) -> None:
    """Follow a growing training log and stream each new step to the service as it is written.

    Reads verl's file logger JSONL, verl's console log and TRL's stdout. Restarting resumes where the
    last watch stopped (no step is sent twice or skipped, even after kill -9); a rotated log (renamed,
    then recreated) is finished before the new file is followed, and one truncated or rewritten in place
    is read again from its start. A value the service refuses is reported with its file:line; the
    other values sent with it are stored. Ctrl-C / SIGTERM finish the current
    send and exit 0. The first watch of an existing file starts at its end unless --from-start.
    """
    import signal
    import threading

    from monitor.watch import Service, Watcher, WatchError, state_file

    if finish and until_idle is None:
        console.print(
            "[red]error:[/red] --finish needs --until-idle (when else would the run be over?)", soft_wrap=True
        )
        raise typer.Exit(2)
    if path.is_dir():
        console.print(f"[red]error:[/red] {path} is a directory, not a log file", soft_wrap=True)
        raise typer.Exit(2)
    stop = threading.Event()

    def echo(text: str) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    service = Service(url, run, project, token, stop, echo)
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        state = state_file(
            state_dir or Path.home() / ".lldmon" / "watch", path, service.base_url, project, run
        )
        watcher = Watcher(
            path, service, state, fmt=fmt, from_start=from_start, until_idle=until_idle, interval=interval
        )
        echo(f"watching {path} ({fmt}) into run {run!r} at {service.base_url}; state {state}")
        summary = watcher.run()
        if summary.idle and finish and service.finish():
            echo(f"run {run!r}: finished")
    except WatchError as exc:
        console.print(f"[red]error:[/red] {exc}", markup=True, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        service.close()
    echo(
        f"sent {summary.steps} steps in {summary.batches} batches"
        + (f" ({summary.duplicates} already there)" if summary.duplicates else "")
        + (
            f", {summary.refused} value{'s' if summary.refused != 1 else ''} refused (see the warnings)"
            if summary.refused
            else ""
        )
        + ("; idle" if summary.idle else "; stopped")
    )

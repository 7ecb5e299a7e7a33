"""`lldmon export`: a run's metrics as one wide CSV or Parquet file (from the database or a remote API)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from monitor.cli._common import (
    DatabaseUrl,
    DataDir,
    ProjectOfRun,
    RemoteToken,
    RemoteUrl,
    closing,
    console,
    open_state,
    run_id_of,
)


def export_run(
    run: Annotated[str, typer.Argument(help="Run id or name.")],
    fmt: Annotated[
        str | None,
        typer.Option("--format", "-f", help="csv or parquet (default: from --output's suffix, else csv)."),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="File to write (default: run-<id>-metrics.<format>); '-': CSV to stdout."
        ),
    ] = None,
    metrics: Annotated[
        list[str] | None,
        typer.Option("--metrics", "-m", help="Metric names, comma-separated or repeated (default: all)."),
    ] = None,
    project: ProjectOfRun = None,
    url: RemoteUrl = None,
    token: RemoteToken = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Write a run's metrics as a wide table: a step column and one column per metric.

    NaN and +-inf are kept (CSV: nan, inf, -inf); a step where a metric was not logged is an empty CSV
    cell or a Parquet null. The file is replaced atomically: an error never leaves a partial file. With
    --url the metrics come from a remote service's API; the file is the same.
    """
    from rich.markup import escape

    from monitor.services.export import EXPORT_FORMATS

    if fmt is None:
        fmt = "parquet" if output is not None and output.suffix in (".parquet", ".pq") else "csv"
    if fmt not in EXPORT_FORMATS:
        console.print(f"[red]error:[/red] --format must be csv or parquet, not {escape(repr(fmt))}")
        raise typer.Exit(2)
    names = [n.strip() for item in metrics or [] for n in item.split(",") if n.strip()] or None
    state = open_state(url, token, database_url, data_dir)
    with closing(state, exit_code=1):
        _export(state, run, project, fmt, output, names)


def _export(
    state: Any, run: str, project: str | None, fmt: str, output: Path | None, names: list[str] | None
) -> None:
    from rich.markup import escape

    from monitor.domain import Principal
    from monitor.errors import LLDMonError
    from monitor.services.export import ExportService

    run_id = run_id_of(state, run, project)
    exporter = ExportService(state.query)
    path = output or Path(f"run-{run_id}-metrics.{fmt}")
    try:
        if str(path) == "-":
            if fmt != "csv":
                console.print("[red]error:[/red] only CSV can go to stdout; pass --output FILE for parquet")
                raise typer.Exit(2)
            typer.echo(exporter.csv(Principal(), run_id, names), nl=False)
            return
        result = exporter.write(Principal(), run_id, fmt, path, names)
    except LLDMonError as exc:
        console.print(f"[red]error:[/red] {escape(exc.message)}")
        raise typer.Exit(1) from None
    except OSError as exc:
        console.print(
            f"[red]error:[/red] cannot write {escape(str(path))}: {escape(exc.strerror or str(exc))}"
        )
        raise typer.Exit(1) from None
    console.print(
        f"wrote {escape(str(result.path))}: {result.rows} steps x {len(result.metrics)} metrics ({fmt})"
    )

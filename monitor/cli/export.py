"""`lldmon export`: a run's metrics as one wide CSV or Parquet file, or with --actions its action records
one row each (CSV, Parquet or JSON lines), from the database or a remote API."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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
    shown,
)


def export_run(
    run: Annotated[str, typer.Argument(help="Run id or name.")],
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format",
            "-f",
            help="csv or parquet, with --actions also jsonl (default: from --output's suffix, else csv).",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="File to write (default: run-<id>-metrics.<format> or run-<id>-actions.<format>);"
            " '-': CSV (or JSON lines) to stdout.",
        ),
    ] = None,
    metrics: Annotated[
        list[str] | None,
        typer.Option("--metrics", "-m", help="Metric names, comma-separated or repeated (default: all)."),
    ] = None,
    actions: Annotated[
        bool,
        typer.Option("--actions", help="Export the action records (one row per record) instead of metrics."),
    ] = False,
    step_min: Annotated[
        int | None, typer.Option("--step-min", min=0, help="With --actions: first step (default: the first).")
    ] = None,
    step_max: Annotated[
        int | None, typer.Option("--step-max", min=0, help="With --actions: last step (default: the last).")
    ] = None,
    source: Annotated[
        str | None, typer.Option("--source", help="With --actions: loss or probe (default: both).")
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

    With --actions: one row per action record (step, source, traj_index, action_index, n_tokens,
    delta, old_logp_mean, advantage, reward, is_answer), read in pages (a step may span several);
    NaN and +-inf kept (Parquet: floats; CSV: nan, inf, -inf; JSON lines: "NaN", "Infinity",
    "-Infinity").
    """
    from rich.markup import escape

    from monitor.services.export import EXPORT_FORMATS

    if fmt is None:
        suffix = output.suffix if output is not None else ""
        by_suffix = {".parquet": "parquet", ".pq": "parquet"} | ({".jsonl": "jsonl"} if actions else {})
        fmt = by_suffix.get(suffix, "csv")
    if actions:
        problem = _action_options_problem(fmt, metrics, source, step_min, step_max)
        if problem:
            console.print(f"[red]error:[/red] {escape(problem)}")
            raise typer.Exit(2)
    elif fmt not in EXPORT_FORMATS:
        console.print(f"[red]error:[/red] --format must be csv or parquet, not {escape(repr(fmt))}")
        raise typer.Exit(2)
    elif source is not None or step_min is not None or step_max is not None:
        console.print("[red]error:[/red] --source, --step-min and --step-max need --actions")
        raise typer.Exit(2)
    names = [n.strip() for item in metrics or [] for n in item.split(",") if n.strip()] or None
    state = open_state(url, token, database_url, data_dir)
    with closing(state, exit_code=1):
        if actions:
            _export_actions(state, run, project, fmt, output, step_min, step_max, source)
        else:
            _export(state, run, project, fmt, output, names)


def _action_options_problem(
    fmt: str, metrics: list[str] | None, source: str | None, step_min: int | None, step_max: int | None
) -> str | None:
    from monitor.services.export import ACTION_EXPORT_FORMATS

    if fmt not in ACTION_EXPORT_FORMATS:
        return f"--format must be csv, parquet or jsonl, not {fmt!r}"
    if metrics:
        return "--metrics selects metrics; --actions exports every action column"
    if source is not None and source not in ("loss", "probe"):
        return f"--source must be loss or probe, not {source!r}"
    if step_min is not None and step_max is not None and step_min > step_max:
        return f"--step-min ({step_min}) is after --step-max ({step_max})"
    return None


def _export_actions(
    state: Any,
    run: str,
    project: str | None,
    fmt: str,
    output: Path | None,
    step_min: int | None,
    step_max: int | None,
    source: str | None,
) -> None:
    from rich.markup import escape

    from monitor.cli.remote import RemoteState
    from monitor.domain import Principal
    from monitor.services.export import (
        ActionReader,
        ExportService,
        actions_csv,
        actions_csv_header,
        actions_jsonl,
    )

    run_id = run_id_of(state, run, project)
    exporter = ExportService(state.query)
    read: ActionReader | None = _remote_actions(state, run_id) if isinstance(state, RemoteState) else None
    path = output or Path(f"run-{run_id}-actions.{fmt}")
    with _reported(path):
        if str(path) == "-":
            if fmt == "parquet":
                console.print("[red]error:[/red] only CSV or JSON lines can go to stdout; pass --output FILE")
                raise typer.Exit(2)
            state.runs.get(Principal(), run_id)  # an unknown run is an error, not an empty file
            render = actions_csv if fmt == "csv" else actions_jsonl
            typer.echo(actions_csv_header() if fmt == "csv" else "", nl=False)
            for page in exporter.action_pages(Principal(), run_id, step_min, step_max, source, read):
                typer.echo(render(page), nl=False)
            return
        result = exporter.write_actions(
            Principal(), run_id, fmt, path, step_min=step_min, step_max=step_max, source=source, read=read
        )
    console.print(
        f"wrote {escape(str(result.path))}: {result.records} action records over {result.steps} steps ({fmt})"
    )


@contextlib.contextmanager
def _reported(path: Path) -> Iterator[None]:
    """A service error or a file that cannot be written: one line, exit 1."""
    from rich.markup import escape

    from monitor.errors import LLDMonError

    try:
        yield
    except LLDMonError as exc:
        console.print(f"[red]error:[/red] {shown(exc.message)}")
        raise typer.Exit(1) from None
    except OSError as exc:
        console.print(
            f"[red]error:[/red] cannot write {escape(str(path))}: {escape(exc.strerror or str(exc))}"
        )
        raise typer.Exit(1) from None


def _remote_actions(state: Any, run_id: int) -> Any:
    """`GET /runs/{id}/actions` as an `ActionReader` (the API's columns; floats decoded later)."""
    from monitor.cli.remote import api_object

    def read(step_min: int | None, step_max: int | None, source: str | None, limit: int, after: Any) -> Any:
        params = {"step_min": step_min, "step_max": step_max, "source": source, "limit": limit}
        if after is not None:  # a contracts.action_pages.ActionCursor: read on after that record
            params |= {f"after_{name}": value for name, value in after._asdict().items()}
        query = {k: v for k, v in params.items() if v is not None}
        return state.api.json("GET", f"/runs/{run_id}/actions", params=query, decode=api_object)

    return read


def _export(
    state: Any, run: str, project: str | None, fmt: str, output: Path | None, names: list[str] | None
) -> None:
    from rich.markup import escape

    from monitor.domain import Principal
    from monitor.services.export import ExportService

    run_id = run_id_of(state, run, project)
    exporter = ExportService(state.query)
    path = output or Path(f"run-{run_id}-metrics.{fmt}")
    with _reported(path):
        if str(path) == "-":
            if fmt != "csv":
                console.print("[red]error:[/red] only CSV can go to stdout; pass --output FILE for parquet")
                raise typer.Exit(2)
            typer.echo(exporter.csv(Principal(), run_id, names), nl=False)
            return
        result = exporter.write(Principal(), run_id, fmt, path, names)
    console.print(
        f"wrote {escape(str(result.path))}: {result.rows} steps x {len(result.metrics)} metrics ({fmt})"
    )

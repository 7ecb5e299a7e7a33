"""`lldmon lab`: run, resume and summarise a collapse lab (an `lldmon.commands` entry point)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = ["lab_app"]

lab_app = typer.Typer(
    help="Collapse lab: grids of real GRPO runs (examples/search_r1_grpo.py) streaming to one lldmon.",
    no_args_is_help=True,
)
console = Console()

_LIST = "comma-separated; 'default' = the script's default"


def _opt(text: str | None, kind: type[int] | type[float] | type[str]) -> list[Any] | None:
    from lldmon_lab.lab.grid import parse_list

    return None if text is None else parse_list(text, kind)


@lab_app.command("run")
def lab_run(
    out: Annotated[Path, typer.Option("--out", help="Lab directory: runs, logs, service DB, summary.")],
    preset: Annotated[
        str | None,
        typer.Option(help="Named grid (lldmon_lab/lab/grid.py PRESETS): quick, healthy, late, early."),
    ] = None,
    quick: Annotated[bool, typer.Option(help="Smoke test: the `quick` preset (2 short runs).")] = False,
    grid: Annotated[
        Path | None, typer.Option("--grid", help="TOML or JSON grid file (keys as in PRESETS).")
    ] = None,
    seeds: Annotated[str | None, typer.Option(help="Seeds, e.g. 0,1,2,3,4.")] = None,
    lr: Annotated[str | None, typer.Option(help=f"GRPO learning rates ({_LIST}).")] = None,
    steps_per_generation: Annotated[
        str | None, typer.Option(help="Optimizer steps per rollout batch (comma-separated).")
    ] = None,
    num_generations: Annotated[str | None, typer.Option(help="Group sizes (comma-separated).")] = None,
    num_iterations: Annotated[
        str | None, typer.Option(help="num_iterations (needs the script's --num-iterations).")
    ] = None,
    max_completion_length: Annotated[
        str | None, typer.Option(help="Completion lengths (comma-separated).")
    ] = None,
    reward_design: Annotated[
        str | None,
        typer.Option(
            help="Reward designs (comma-separated): exact (default), composite, penalty, centred, success."
        ),
    ] = None,
    beta: Annotated[
        str | None, typer.Option(help=f"KL coefficients to the reference policy ({_LIST}: 0).")
    ] = None,
    llds: Annotated[
        str | None,
        typer.Option(help="LLDS modes: off, on (static), auto (policy auto), heal (auto + rollback)."),
    ] = None,
    llds_lambda: Annotated[str | None, typer.Option(help=f"LLDS lambdas for on/auto ({_LIST}).")] = None,
    steps: Annotated[int | None, typer.Option(help="GRPO steps per run.")] = None,
    warmup_steps: Annotated[int | None, typer.Option(help="Supervised warm-up steps (tiny: 350).")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Sequences per optimizer step.")] = None,
    model: Annotated[str | None, typer.Option(help="tiny, smollm2, a .gguf, a dir or HF id.")] = None,
    policy: Annotated[
        str | None, typer.Option(help="Override the directive policy of every run (off, alert, auto, heal).")
    ] = None,
    extra: Annotated[
        str | None, typer.Option(help="More script flags, verbatim, e.g. '--temperature 1.2'.")
    ] = None,
    jobs: Annotated[int | None, typer.Option(help="Runs in parallel (default: CPU cores).")] = None,
    threads: Annotated[int, typer.Option(help="Torch threads per run.")] = 1,
    project: Annotated[str, typer.Option(help="lldmon project of the runs.")] = "lab",
    lldmon_url: Annotated[
        str | None, typer.Option(help="Use this running service instead of starting one on OUT/lldmon.")
    ] = None,
    token: Annotated[str | None, typer.Option(envvar="LLDMON_TOKEN", help="Token for --lldmon-url.")] = None,
    host: Annotated[str, typer.Option(help="Host of the lab's own service.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the lab's own service (0: a free one).")] = 0,
    poll_seconds: Annotated[float, typer.Option(help="Seconds between progress polls.")] = 2.0,
    dry_run: Annotated[bool, typer.Option(help="Print the runs and their commands; run nothing.")] = False,
) -> None:
    """Run a grid of seeds x settings (or resume it: finished runs in OUT are skipped)."""
    from lldmon_lab.lab.grid import GridError, expand, load_grid_file, resolve_grid
    from lldmon_lab.lab.runner import LabError, LabOptions, default_jobs, run_lab

    if quick and preset not in (None, "quick"):
        console.print("[red]error:[/red] --quick is the `quick` preset; pass one of them")
        raise typer.Exit(2)
    overrides: dict[str, Any] = {
        "seeds": _opt(seeds, int),
        "lr": _opt(lr, float),
        "steps_per_generation": _opt(steps_per_generation, int),
        "num_generations": _opt(num_generations, int),
        "num_iterations": _opt(num_iterations, int),
        "max_completion_length": _opt(max_completion_length, int),
        "reward_design": _opt(reward_design, str),
        "beta": _opt(beta, float),
        "llds": _opt(llds, str),
        "llds_lambda": _opt(llds_lambda, float),
        "steps": steps,
        "warmup_steps": warmup_steps,
        "batch_size": batch_size,
        "model": model,
        "policy": policy,
        "extra": shlex.split(extra) if extra is not None else None,
    }
    try:
        tables = load_grid_file(grid) if grid is not None else []
        specs = resolve_grid(
            "quick" if quick else preset, tables, {k: v for k, v in overrides.items() if v is not None}
        )
        runs = expand(specs)
    except GridError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    options = LabOptions(
        out=out.expanduser().resolve(),
        runs=runs,
        jobs=jobs if jobs is not None else default_jobs(),
        project=project,
        lldmon_url=lldmon_url,
        token=token,
        host=host,
        port=port,
        threads=threads,
        poll_seconds=poll_seconds,
        command_line=shlex.join(["lldmon", *sys.argv[1:]]),
    )
    if dry_run:
        for run in runs:
            typer.echo(f"{run.key}: {shlex.join([*run.setting.script_args(), '--seed', str(run.seed)])}")
        typer.echo(f"{len(runs)} runs")
        return
    try:
        report = run_lab(options, console)
    except LabError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    _print_groups(options.out / "summary.json")
    console.print(
        f"{len(report.ran)} runs finished, {len(report.skipped)} skipped (already finished), "
        f"{len(report.failed)} failed in {report.seconds:.0f}s; summary: {options.out / 'summary.md'}"
    )
    if report.exit_code:
        raise typer.Exit(report.exit_code)


@lab_app.command("summary")
def lab_summary(
    out: Annotated[Path, typer.Argument(help="A lab directory.")],
) -> None:
    """Rewrite OUT/summary.json and OUT/summary.md from every record in OUT/runs.

    Relabels old runs with the current rule; needs no service.
    """
    from lldmon_lab.lab.results import read_records
    from lldmon_lab.lab.runner import write_summary

    records = read_records(out / "runs")
    if not records:
        console.print(f"[red]error:[/red] no run records in {escape(str(out / 'runs'))}")
        raise typer.Exit(1)
    meta: dict[str, Any] = {}
    previous = out / "summary.json"
    if previous.is_file():
        try:
            old = json.loads(previous.read_text(encoding="utf-8"))
            meta = {k: old[k] for k in ("command", "project", "jobs", "threads") if k in old}
        except (OSError, ValueError):
            meta = {}
    write_summary(out, list(records.values()), meta)
    _print_groups(out / "summary.json")
    console.print(f"{len(records)} runs; summary: {out / 'summary.md'}")


@lab_app.command("presets")
def lab_presets() -> None:
    """Print the named grids (edit lldmon_lab/lab/grid.py PRESETS to change them)."""
    from lldmon_lab.lab.grid import PRESETS

    typer.echo(json.dumps(PRESETS, indent=2))


def _print_groups(path: Path) -> None:
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    table = Table(
        "setting",
        "finished",
        "collapsed",
        "rate [95% CI]",
        "p vs off",
        "median collapse",
        "median lead",
        "best",
        "final",
        "steps wasted",
    )
    for g in payload.get("groups", []):
        ci = g.get("collapse_ci")
        p = g.get("p_vs_off")
        table.add_row(
            escape(g["group"]),
            f"{g['finished']}/{g['runs']}",
            str(g["collapsed"]),
            "-" if ci is None else f"{g['collapse_rate']:.0%} [{ci[0]:.0%}, {ci[1]:.0%}]",
            "-" if p is None else f"{p:.3g}",
            _num(g["median_collapse_step"]),
            _num(g["median_lead_time"]),
            _num(g["median_best_reward"], 3),
            _num(g["median_final_reward"], 3),
            _num(g.get("steps_wasted")),
        )
    console.print(table)
    console.print(
        "[dim]rate: Wilson score 95% interval; p vs off: one-sided Fisher exact test against LLDS off of the "
        "same other settings; reward intervals and the tests between arms: summary.md[/dim]"
    )


def _num(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{float(value):.{digits}f}"

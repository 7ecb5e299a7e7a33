"""`lldmon eval`: score the detector on labelled runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from monitor.cli._common import console

DEFAULT_GATE = "generated,third-party"


def evaluate_detector(
    collapse: Annotated[int, typer.Option(help="Generated collapse runs.")] = 20,
    controls: Annotated[int, typer.Option(help="Generated healthy and noisy-stagnant runs (each).")] = 10,
    seed: Annotated[int, typer.Option()] = 0,
    real_runs: Annotated[
        Path | None,
        typer.Option(
            help="Folder of real logs (shared/datasets/real_runs), scored with their labels (--labels)."
        ),
    ] = None,
    labels: Annotated[
        Path | None,
        typer.Option(
            help="Labels file (TOML) of real runs; its relative paths resolve against --real-runs, else "
            "against its own folder. Default with --real-runs: the packaged eval_labels/real_runs.toml."
        ),
    ] = None,
    lab: Annotated[
        Path | None,
        typer.Option(
            help="Folder of recorded lab runs (*.jsonl.gz; default: tests/fixtures/lab of the checkout)."
        ),
    ] = None,
    no_lab: Annotated[bool, typer.Option("--no-lab", help="Leave out the recorded lab runs.")] = False,
    no_found: Annotated[
        bool,
        typer.Option(
            "--no-found",
            help="Leave out the licensed third-party logs of tests/fixtures/third_party (scored as "
            "third-party by default in a source checkout).",
        ),
    ] = False,
    per_run: Annotated[bool, typer.Option(help="Print one row per run.")] = False,
    check: Annotated[bool, typer.Option(help="Exit 1 if a target of a --gate source is missed.")] = False,
    gate: Annotated[
        str | None,
        typer.Option(
            help="Sources whose targets must be met (comma-separated: generated, lab, third-party); "
            f"exit 1 if one is missed (implies --check). Default with --check: {DEFAULT_GATE}."
        ),
    ] = None,
    scale_free: Annotated[
        bool,
        typer.Option(
            "--scale-free",
            help="Judge every run without its declared reward floor (as a run whose reward design "
            "nobody told the detector): on its own range and noise alone.",
        ),
    ] = False,
    harder: Annotated[
        bool,
        typer.Option(
            "--harder",
            help="Also count critical findings per 10,000 healthy steps on every control as recorded, with "
            "its reward in other units, shuffled in blocks and thinned (slow: 6 replays per control).",
        ),
    ] = False,
) -> None:
    """Run the detector over labelled runs and print the score per source (generated, lab, third-party):
    lead time, detection delay, the targets (critical finding in time, early warning, no critical
    finding on controls) and the runs that miss them."""
    from rich.markup import escape

    from lldmon_lab.evaluation import (
        FOUND_LABELS,
        SOURCES,
        LabelledRun,
        evaluate,
        found_runs,
        labelled_runs,
        render,
    )
    from lldmon_lab.lab.fixtures import FixtureError, default_fixture_dir, load_fixtures
    from lldmon_lab.run_labels import DEFAULT_LABELS, LabelsError
    from lldmon_lab.scenarios import scenario_suite

    gate_text = gate if gate is not None else DEFAULT_GATE
    enforce = check or gate is not None
    gated = [s.strip() for s in gate_text.split(",") if s.strip()]
    unknown = [s for s in gated if s not in SOURCES]
    if unknown:
        console.print(f"[red]error:[/red] unknown source(s) {', '.join(unknown)}; use {', '.join(SOURCES)}")
        raise typer.Exit(2)
    runs = [LabelledRun.from_scenario(s) for s in scenario_suite(collapse, controls, seed)]
    lab_dir = None if no_lab else (lab if lab is not None else default_fixture_dir())
    if lab_dir is not None:
        if not lab_dir.is_dir():
            console.print(f"[red]error:[/red] {lab_dir} is not a directory")
            raise typer.Exit(2)
        try:
            recorded = load_fixtures(lab_dir)
        except FixtureError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
        typer.echo(f"lab: {len(recorded)} recorded runs from {lab_dir}")
        runs += recorded
    elif not no_lab:
        typer.echo("lab: no recorded runs (not a source checkout; pass --lab DIR)")
    if real_runs is not None and not real_runs.is_dir():
        console.print(f"[red]error:[/red] {real_runs} is not a directory")
        raise typer.Exit(2)
    if labels is not None or real_runs is not None:
        labels_file = labels if labels is not None else DEFAULT_LABELS
        try:
            real = labelled_runs(labels_file, real_runs)
        except LabelsError as exc:
            console.print(f"[red]error:[/red] {escape(str(exc))}")
            raise typer.Exit(2) from None
        collapsing = sum(r.collapses for r in real.runs)
        typer.echo(
            f"third-party: {len(real.runs)} labelled runs ({collapsing} collapsing) from {labels_file}"
            + (f", root {real_runs}" if real_runs is not None else "")
        )
        if real.missing:
            typer.echo(
                f"third-party: skipped {len(real.missing)} run(s) whose files are missing: "
                + ", ".join(f"{m.name} ({m.missing_files()[0]})" for m in real.missing)
            )
        runs += real.runs
    if not no_found:
        found = found_runs()
        if found:
            typer.echo(
                f"third-party: {len(found)} labelled runs from tests/fixtures/third_party ({FOUND_LABELS.name})"
            )
        runs += found
    with console.status(f"evaluating {len(runs)} runs"):
        report = evaluate(runs, scale_free=scale_free)
    if scale_free:
        typer.echo("scale-free: every run judged without a declared reward floor")
    typer.echo(render(report, per_run=per_run))
    if harder:
        from lldmon_lab.eval_harder import budgets, judge, render_budgets

        healthy = [r for r in runs if r.control]
        with console.status(f"replaying {len(healthy)} controls 6 ways"):
            judged = [judge(r, scale_free=scale_free) for r in healthy]
        typer.echo("\n" + render_budgets(budgets(healthy, judged)))
    ungated = [t for t in report.missed() if t.source not in gated]
    if ungated:
        typer.echo(
            f"\nmissed, not gated (--gate {gate_text}): "
            + "; ".join(f"[{t.source}] {t.name}: {t.value}" for t in ungated)
        )
    failed = report.missed(gated)
    if failed:
        typer.echo(
            ("\nmissed, gated: " if enforce else f"\nmissed, would fail --check (--gate {gate_text}): ")
            + "; ".join(f"[{t.source}] {t.name}: {t.value}" for t in failed)
        )
    if enforce and failed:
        raise typer.Exit(1)

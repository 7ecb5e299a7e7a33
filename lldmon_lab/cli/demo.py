"""`lldmon demo`: the service, a real GRPO agent on CPU and a replayed collapse, in one command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from monitor.cli._common import console


def demo(
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", help="SQLite, logs and training output (default: a new temp dir)."),
    ] = None,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="0, or taken: a free one is used.")] = 8000,
    steps: Annotated[int | None, typer.Option(help="GRPO steps (default 150; --quick: 6).")] = None,
    quick: Annotated[
        bool, typer.Option(help="Short run (smoke test): 6 GRPO steps after the warm-up.")
    ] = False,
    keep_serving: Annotated[
        bool | None,
        typer.Option(
            "--keep-serving/--no-keep-serving",
            help="Keep the dashboard up after the run, until Ctrl-C "
            "(default: when run in a terminal; closes at once in CI or a pipe).",
            show_default=False,
        ),
    ] = None,
    model: Annotated[
        str, typer.Option(help="tiny (built in code), smollm2, a .gguf, a dir or HF id.")
    ] = "tiny",
    replay_seed: Annotated[int, typer.Option(help="Seed of the replayed collapse scenario.")] = 7,
    train: Annotated[bool, typer.Option(help="--no-train: only the replayed run.")] = True,
) -> None:
    """One-command demo: the service, a real TRL GRPO search agent on CPU and a replayed collapse."""
    from rich.markup import escape

    from lldmon_lab.demo import DemoError, DemoOptions, run_demo

    options = DemoOptions(
        data_dir=data_dir,
        host=host,
        port=port,
        steps=steps,
        quick=quick,
        keep_serving=keep_serving,
        model=model,
        replay_seed=replay_seed,
        train=train,
    )
    try:
        code = run_demo(options, console)
    except DemoError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    if code:
        raise typer.Exit(code)

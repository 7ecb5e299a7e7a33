"""`lldmon supervise`: `trainer_hooks.supervise` as a command of the `lldmon` CLI (joined through the
`lldmon.commands` entry points; only the CLI imports this module, which needs Typer)."""

from __future__ import annotations

from typing import Annotated

import typer

from trainer_hooks.supervise import DEFAULT_MAX_RESTARTS
from trainer_hooks.supervise import supervise as run_supervised


def supervise(
    command: Annotated[list[str], typer.Argument(help="-- then the training command and its arguments.")],
    max_restarts: Annotated[
        int, typer.Option(min=0, help="Restarts at most (the service also bounds rollbacks per run).")
    ] = DEFAULT_MAX_RESTARTS,
    resume_arg: Annotated[
        list[str] | None,
        typer.Option(
            help="Argument added on a restart; {checkpoint} and {step} are replaced (repeatable), e.g. "
            "verl's 'trainer.resume_from_path={checkpoint}'."
        ),
    ] = None,
) -> None:
    """Run a training command; when its lldmon hook asks for a rollback, restart it from the checkpoint
    (LLDMON_RESUME_FROM, LLDMON_ROLLED_BACK_TO, LLDMON_LR_SCALE set). Exits with the command's status."""
    raise typer.Exit(run_supervised(command, max_restarts=max_restarts, resume_args=resume_arg or ()))

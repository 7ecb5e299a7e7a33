"""`lldmon supervise -- <train command>` (also `python -m trainer_hooks.supervise -- ...`): runs a
training command and restarts it from a checkpoint when its lldmon hook asks for a rollback
(`trainer_hooks.rollback` explains the exchange). Standard library only, so it runs in any training
image.

The command runs with `LLDMON_SUPERVISOR_REQUEST` naming a request file. When it exits and the file holds
a request, the supervisor starts the same command again with the resume variables set
(`trainer_hooks.rollback.ENV_*`) and, with `--resume-arg`, extra arguments naming the checkpoint (for
frameworks that resume by argument, e.g. verl's `trainer.resume_mode=resume_path
trainer.resume_from_path={checkpoint}`: `trainer_hooks.verl.rollback.RESUME_ARGS`); `{checkpoint}`,
`{step}`, `{lr_scale}` and `{version}` in them are replaced by the request's values. Otherwise it exits with the command's exit status. At most
`--max-restarts` restarts (the service bounds rollbacks per run too). SIGINT and SIGTERM go to the
command; the supervisor then waits for it and does not restart it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Final

from trainer_hooks.rollback import (
    ENV_LR_SCALE,
    ENV_REQUEST,
    ENV_RESUME_FROM,
    ENV_ROLLBACK_VERSION,
    ENV_ROLLED_BACK_TO,
    RollbackRequest,
    read_request,
)

__all__ = ["DEFAULT_MAX_RESTARTS", "restart_args", "restart_env", "supervise"]

DEFAULT_MAX_RESTARTS: Final = 5


def restart_env(base: dict[str, str], request: RollbackRequest) -> dict[str, str]:
    """The environment of a restart for `request`."""
    return {
        **base,
        ENV_RESUME_FROM: request.checkpoint,
        ENV_ROLLED_BACK_TO: str(request.step),
        ENV_LR_SCALE: repr(request.lr_scale),
        ENV_ROLLBACK_VERSION: str(request.version),
    }


def restart_args(resume_args: Sequence[str], request: RollbackRequest) -> list[str]:
    """`resume_args` with `{checkpoint}`, `{step}`, `{lr_scale}` and `{version}` replaced for `request`."""
    values = {
        "checkpoint": request.checkpoint,
        "step": request.step,
        "lr_scale": repr(request.lr_scale),
        "version": request.version,
    }
    return [a.format(**values) for a in resume_args]


def _log(message: str) -> None:
    print(f"lldmon supervise: {message}", file=sys.stderr, flush=True)


def supervise(
    command: Sequence[str], *, max_restarts: int = DEFAULT_MAX_RESTARTS, resume_args: Sequence[str] = ()
) -> int:
    """Run `command`, restarting it for each rollback it requests (module docstring); its exit status."""
    if not command:
        raise ValueError("no command to supervise: give it after --")
    with tempfile.TemporaryDirectory(prefix="lldmon-supervise-") as tmp:
        request_file = Path(tmp) / "rollback.json"
        env = {**os.environ, ENV_REQUEST: str(request_file)}
        args = list(command)
        restarts = 0
        interrupted: list[int] = []
        while True:
            request_file.unlink(missing_ok=True)
            child = subprocess.Popen(args, env=env)

            def forward(signum: int, frame: FrameType | None, child: subprocess.Popen[bytes] = child) -> None:
                interrupted.append(signum)
                child.send_signal(signum)

            previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                status = child.wait()
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)
            request = read_request(request_file)
            if request is None or interrupted:
                return status
            if restarts >= max_restarts:
                _log(
                    f"rollback requested but {restarts} restarts were made already (--max-restarts); exiting"
                )
                return status if status != 0 else 1
            restarts += 1
            _log(
                f"rollback {restarts}: the job stopped at step {request.from_step}; restarting from "
                f"{request.checkpoint} (step {request.step}), learning rate x{request.lr_scale:g}"
            )
            env = restart_env({**os.environ, ENV_REQUEST: str(request_file)}, request)
            args = [*command, *restart_args(resume_args, request)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lldmon supervise", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-restarts", type=int, default=DEFAULT_MAX_RESTARTS)
    parser.add_argument(
        "--resume-arg",
        action="append",
        default=[],
        help="argument added on a restart; {checkpoint}, {step}, {lr_scale} and {version} are replaced "
        "(repeatable)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the training command")
    ns = parser.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        parser.error("no command to supervise: give it after --")
    if ns.max_restarts < 0:
        parser.error("--max-restarts must be >= 0")
    try:  # a typo in a placeholder fails now, not at the first rollback hours later
        restart_args(ns.resume_arg, RollbackRequest("checkpoint", 0, 1.0, 0))
    except (KeyError, IndexError, ValueError) as exc:
        parser.error(
            f"--resume-arg: bad placeholder {exc}; use {{checkpoint}}, {{step}}, {{lr_scale}}, {{version}}"
        )
    return supervise(command, max_restarts=ns.max_restarts, resume_args=ns.resume_arg)


if __name__ == "__main__":
    sys.exit(main())

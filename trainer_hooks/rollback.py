"""The trainer's side of a rollback, shared by the framework hooks and `trainer_hooks.supervise`
(standard library and `contracts` only).

A rollback restarts the training job: restoring weights, optimizer, scheduler and RNG state inside a
running Trainer loop would rewind the loop's own counters, which no framework exposes, while every
framework resumes from a checkpoint at start-up (TRL/transformers `resume_from_checkpoint`, verl's
resume mode). So:

1. the hook that sees a rollback request (`hand_over`, for every framework) finds the newest checkpoint
   saved at or before the requested step (`find_checkpoint`; transformers' `checkpoint-<step>` folders by default, verl's
   `global_step_<step>` through `trainer_hooks.verl.rollback`), writes a `RollbackRequest` to the file
   the supervisor named in `ENV_REQUEST` (`write_request`) and ends training without saving;
2. `lldmon supervise` (`trainer_hooks.supervise`) sees the request when the job exits and starts the
   same command again with `ENV_RESUME_FROM` (the checkpoint directory), `ENV_ROLLED_BACK_TO` (its
   step), `ENV_LR_SCALE` (the learning-rate factor) and `ENV_ROLLBACK_VERSION` (the directive version
   that asked) set;
3. the restarted job resumes from `ENV_RESUME_FROM` (`resume_checkpoint`), scales its learning rate
   (`scale_learning_rate`) and logs `contracts.directive.ROLLBACK_METRIC` with the first step it trains
   again, which tells the service which steps are being redone. It does not act on the request it was
   restarted for again (`restarted_for`), even when the acknowledgement of the job before it never
   reached the service.

Without a supervisor (no `ENV_REQUEST`) or without a checkpoint at or before the step, the hook cannot
roll back and stops the run instead (saving first), saying why: a collapsed run should not go on.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from contracts.directive import Levers

__all__ = [
    "ENV_LR_SCALE",
    "ENV_REQUEST",
    "ENV_RESUME_FROM",
    "ENV_ROLLBACK_VERSION",
    "ENV_ROLLED_BACK_TO",
    "TRANSFORMERS_CHECKPOINT",
    "CheckpointLayout",
    "Resumed",
    "RollbackRequest",
    "find_checkpoint",
    "hand_over",
    "pending",
    "read_request",
    "requested",
    "restarted_for",
    "resume_checkpoint",
    "resumed",
    "scale_learning_rate",
    "write_request",
]

_logger = logging.getLogger("lldmon")

ENV_REQUEST: Final = "LLDMON_SUPERVISOR_REQUEST"
"""Set by the supervisor: the file a job writes its rollback request to before it exits."""
ENV_RESUME_FROM: Final = "LLDMON_RESUME_FROM"
"""Set by the supervisor on a restart: the checkpoint directory to resume from."""
ENV_ROLLED_BACK_TO: Final = "LLDMON_ROLLED_BACK_TO"
"""Set by the supervisor on a restart: the restored checkpoint's step."""
ENV_LR_SCALE: Final = "LLDMON_LR_SCALE"
"""Set by the supervisor on a restart: the factor on the learning rate the job was started with."""
ENV_ROLLBACK_VERSION: Final = "LLDMON_ROLLBACK_VERSION"
"""Set by the supervisor on a restart: the directive version whose rollback request it carried out."""


@dataclass(frozen=True)
class CheckpointLayout:
    """How a framework names its checkpoint folders (`pattern`: one group, the step) and which file in
    one is written last, so that its presence means the save completed (`complete`)."""

    pattern: re.Pattern[str]
    complete: str


TRANSFORMERS_CHECKPOINT: Final = CheckpointLayout(re.compile(r"^checkpoint-(\d+)$"), "trainer_state.json")
"""transformers' Trainer: `<output_dir>/checkpoint-<step>`, `trainer_state.json` written last."""


@dataclass(frozen=True)
class RollbackRequest:
    """What a job asks its supervisor for: restart from `checkpoint` (saved at `step`), learning rate
    times `lr_scale`; `from_step` is where the job stopped."""

    checkpoint: str
    step: int
    lr_scale: float
    from_step: int
    version: int = 0
    """The directive version whose rollback request this is (0: unknown, from an older hook)."""


@dataclass(frozen=True)
class Resumed:
    """A job the supervisor restarted for a rollback: it resumes from `checkpoint` of `step`, for the
    rollback request of directive `version` (0: unknown)."""

    checkpoint: str
    step: int
    lr_scale: float
    version: int = 0


def find_checkpoint(
    output_dir: str | os.PathLike[str], at_most: int, layout: CheckpointLayout = TRANSFORMERS_CHECKPOINT
) -> tuple[Path, int] | None:
    """The newest checkpoint folder named as `layout` says (default: transformers' `checkpoint-<step>`)
    in `output_dir` with step <= `at_most` that holds a complete save (its `layout.complete` file), and
    its step; None: none."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    found: list[tuple[int, Path]] = []
    for child in root.iterdir():
        match = layout.pattern.match(child.name)
        if match and int(match.group(1)) <= at_most and (child / layout.complete).is_file():
            found.append((int(match.group(1)), child))
    if not found:
        return None
    step, path = max(found)
    return path, step


def write_request(path: str | os.PathLike[str], request: RollbackRequest) -> None:
    """Write `request` for the supervisor, atomically (a crash mid-write leaves no half request)."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(asdict(request)))
    os.replace(tmp, target)


def read_request(path: str | os.PathLike[str]) -> RollbackRequest | None:
    """The request at `path`, None if there is none; a malformed one is an error naming the file."""
    target = Path(path)
    if not target.is_file():
        return None
    try:
        raw = json.loads(target.read_text())
        request = RollbackRequest(
            checkpoint=str(raw["checkpoint"]),
            step=int(raw["step"]),
            lr_scale=float(raw["lr_scale"]),
            from_step=int(raw["from_step"]),
            version=int(raw.get("version", 0)),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed rollback request in {target}: {exc}") from None
    if not (math.isfinite(request.lr_scale) and request.lr_scale > 0):
        raise ValueError(f"malformed rollback request in {target}: lr_scale {request.lr_scale!r}")
    return request


def resumed(environ: os._Environ[str] | dict[str, str] | None = None) -> Resumed | None:
    """The rollback this job was restarted for (the supervisor's environment); None: a normal start."""
    env = os.environ if environ is None else environ
    checkpoint = env.get(ENV_RESUME_FROM)
    step = env.get(ENV_ROLLED_BACK_TO)
    if not checkpoint or step is None:
        return None
    scale = float(env.get(ENV_LR_SCALE) or 1.0)
    version = int(env.get(ENV_ROLLBACK_VERSION) or 0)
    return Resumed(checkpoint, int(step), scale if math.isfinite(scale) and scale > 0 else 1.0, version)


def restarted_for(rollback_id: int, environ: os._Environ[str] | dict[str, str] | None = None) -> bool:
    """Whether this job is the restart for rollback request `rollback_id` (a directive's `rollback`)
    or a later one than it: the request is done, whatever `applied_version` the service reports (the
    acknowledgement of the job before may have been lost with its last batch)."""
    try:
        found = resumed(environ)
    except ValueError:  # a hand-made environment: not a restart this module can vouch for
        return False
    return found is not None and 0 < rollback_id <= found.version


def pending(
    levers: Levers, rollback_id: int, environ: os._Environ[str] | dict[str, str] | None = None
) -> Levers:
    """`levers` without their rollback request when it is not to be acted on: a stop request wins, and
    the request this job was restarted for (`restarted_for`) is done."""
    if levers.rollback and (levers.stop or restarted_for(rollback_id, environ)):
        return Levers(levers.checkpoint, levers.stop, levers.stop_reason, levers.acknowledge)
    return levers


def hand_over(
    levers: Levers,
    *,
    step: int,
    checkpoint_dir: str | os.PathLike[str] | None,
    rollback_id: int,
    layout: CheckpointLayout = TRANSFORMERS_CHECKPOINT,
    environ: os._Environ[str] | dict[str, str] | None = None,
    logger: logging.Logger | None = None,
) -> Levers:
    """Carry out a rollback request (of directive version `rollback_id`) at step `step`, for any
    framework: write the supervisor's request for the newest complete checkpoint (`layout`) at or before
    the requested step in `checkpoint_dir`, and return levers with `rollback` (end the run now, without
    saving; `rollback_to` the checkpoint's step); when that cannot be done, levers with `stop` (save,
    then end) and the reason, logged to `logger`. Levers without a rollback to act on (`pending`) pass
    unchanged."""
    log = logger or _logger
    levers = pending(levers, rollback_id, environ)
    if not levers.rollback:
        return levers
    env = os.environ if environ is None else environ
    to_step = levers.rollback_to if levers.rollback_to is not None else step
    request_file = env.get(ENV_REQUEST)
    found = find_checkpoint(checkpoint_dir, to_step, layout) if checkpoint_dir is not None else None
    if request_file and found is not None:
        path, saved_at = found
        write_request(request_file, RollbackRequest(str(path), saved_at, levers.lr_scale, step, rollback_id))
        log.warning(
            "lldmon: rollback requested at step %d: ending the run; the supervisor restarts it from %s",
            step,
            path,
        )
        return Levers(
            acknowledge=levers.acknowledge, rollback=True, rollback_to=saved_at, lr_scale=levers.lr_scale
        )
    if not request_file:
        why = "the job does not run under `lldmon supervise`"
    elif checkpoint_dir is None:
        why = "no checkpoint folder was given"
    else:
        why = f"no complete checkpoint at or before step {to_step} in {checkpoint_dir}"
    reason = f"a rollback to step {to_step} was requested but {why}"
    log.warning("lldmon: %s: saving and stopping instead", reason)
    return Levers(checkpoint=levers.checkpoint, stop=True, stop_reason=reason, acknowledge=levers.acknowledge)


def scale_learning_rate(optimizer: Any, lr_scheduler: Any, lr: float) -> None:
    """Make `lr` the learning rate of a restored optimizer's first parameter group (the others keep
    their ratio to it): in the scheduler's base rates, which its next step applies, and in the
    optimizer's current ones. Restoring a checkpoint brings back the rates it was saved with, which
    may already be scaled by an earlier rollback; so the caller passes the job's configured rate times
    the rollback's factor. Duck-typed (torch's optimizers and `LRScheduler`s)."""
    bases = list(getattr(lr_scheduler, "base_lrs", None) or [])
    groups = list(getattr(optimizer, "param_groups", None) or [])
    reference = bases[0] if bases else (groups[0]["lr"] if groups else None)
    if not reference:
        return
    factor = lr / reference
    if bases:
        lr_scheduler.base_lrs = [b * factor for b in bases]
    for group in groups:
        group["lr"] *= factor
        if "initial_lr" in group:
            group["initial_lr"] *= factor
    if groups and hasattr(lr_scheduler, "_last_lr"):
        # what `get_last_lr()` (the logged learning rate) reports until the scheduler's next step: the
        # rates the optimizer now trains with, as the scheduler itself sets it after a step
        lr_scheduler._last_lr = [group["lr"] for group in groups]


def resume_checkpoint(environ: os._Environ[str] | dict[str, str] | None = None) -> str | None:
    """The checkpoint a supervised job restarted for a rollback resumes from (None: a normal start):
    pass it as `trainer.train(resume_from_checkpoint=...)` (`MonitoredGRPOTrainer` does so itself)."""
    found = resumed(environ)
    return None if found is None else found.checkpoint


def requested(environ: os._Environ[str] | dict[str, str] | None = None) -> bool:
    """Whether this job handed a rollback to its supervisor (then it should end without finishing its
    lldmon run: `MonitorClient.close(status=None)`; the restarted job goes on with it)."""
    env = os.environ if environ is None else environ
    path = env.get(ENV_REQUEST)
    return path is not None and path != "" and Path(path).is_file()

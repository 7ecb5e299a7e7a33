"""Rollback for verl (0.9.1): the trainer's side of `trainer_hooks.rollback` in verl's terms.

A rollback restarts the job (`trainer_hooks.rollback` says why), so a verl job runs under
`lldmon supervise` with verl's resume arguments added on a restart (`RESUME_ARGS`)::

    lldmon supervise --resume-arg trainer.resume_mode=resume_path \\
        --resume-arg 'trainer.resume_from_path={checkpoint}' -- python -m verl.trainer.main_ppo ...

- In the driver loop (`RayPPOTrainer.fit`, which lldmon does not patch), `DirectiveLevers.take(step=...,
  checkpoint_dir=trainer.default_local_dir)` hands a rollback request to the supervisor (`hand_over`):
  the newest complete `global_step_<N>` folder at or before the requested step (`find_checkpoint`;
  verl writes `data.pt` last), the request file, and `Levers(rollback=True)`, on which the loop logs
  the step and returns without saving. Without a supervisor or such a checkpoint the levers say
  `stop` instead (save, then end), with the reason.
- The restarted job resumes from that folder by the arguments above: Hydra takes the last value of a
  key, so they override any `trainer.resume_mode` of the command. A job launched from Python instead of
  a command line adds `resume_overrides()` to its overrides.
- lldmon's actor (`LLDMonTrainingWorker`, which the lldmon policy loss installs) sets the learning rate
  to the configured one times the rollback's factor after verl restored the checkpoint (which brings
  back the rates it was saved with), on every rank.
- The `Tracking` attachment (`trainer_hooks.verl.tracking.attach`) logs `ROLLBACK_METRIC` with the first
  step the job trains again (the first logged step after the restored one), so the service rolls the
  run's history back; and the restarted client fetches the run's directive before verl's first step
  (`trainer_hooks.client`), so that step trains with the LLDS switch the service holds.

The supervisor's environment (`trainer_hooks.rollback.ENV_*`) reaches verl's Ray processes on one node
(a local `ray.init` passes it on); the request file is a temporary file on the supervisor's node, so
the driver (verl's `TaskRunner`) must run on that node.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Final

from contracts.directive import Levers
from trainer_hooks import rollback
from trainer_hooks.rollback import CheckpointLayout

__all__ = ["RESUME_ARGS", "VERL_CHECKPOINT", "find_checkpoint", "hand_over", "resume_overrides"]

logger = logging.getLogger("lldmon.verl")

VERL_CHECKPOINT: Final = CheckpointLayout(re.compile(r"^global_step_(\d+)$"), "data.pt")
"""verl's `RayPPOTrainer._save_checkpoint`: `<default_local_dir>/global_step_<N>/` holding `actor/`
(and the critic's folder), then `data.pt` (the dataloader's state), written last."""

RESUME_ARGS: Final = ("trainer.resume_mode=resume_path", "trainer.resume_from_path={checkpoint}")
"""The `lldmon supervise --resume-arg`s of a verl job: resume from the rollback's checkpoint folder."""


def find_checkpoint(default_local_dir: str | os.PathLike[str], at_most: int) -> tuple[str, int] | None:
    """The newest complete `global_step_<N>` folder in verl's `trainer.default_local_dir` with N <=
    `at_most`, and N; None: none. A relative folder is taken from the working directory, as verl does."""
    found = rollback.find_checkpoint(os.path.abspath(default_local_dir), at_most, VERL_CHECKPOINT)
    return None if found is None else (str(found[0]), found[1])


def hand_over(
    levers: Levers,
    *,
    step: int,
    checkpoint_dir: str | os.PathLike[str] | None,
    version: int = 0,
    environ: os._Environ[str] | dict[str, str] | None = None,
) -> Levers:
    """`trainer_hooks.rollback.hand_over` for verl's checkpoints (`VERL_CHECKPOINT`; a relative folder
    is taken from the working directory, as verl does): `rollback` set means end the run without
    saving, `stop` that no rollback was possible (the reason says why)."""
    folder = None if checkpoint_dir is None else os.path.abspath(checkpoint_dir)
    return rollback.hand_over(
        levers,
        step=step,
        checkpoint_dir=folder,
        rollback_id=version,
        layout=VERL_CHECKPOINT,
        environ=environ,
        logger=logger,
    )


def resume_overrides(environ: os._Environ[str] | dict[str, str] | None = None) -> list[str]:
    """verl's Hydra overrides that resume a job the supervisor restarted for a rollback (`RESUME_ARGS`
    filled in), for a job that builds its config in Python; [] on a normal start."""
    found = rollback.resumed(environ)
    if found is None:
        return []
    return [arg.format(checkpoint=found.checkpoint) for arg in RESUME_ARGS]

"""A stand-in verl job for the rollback round trip (tests/trainer_hooks/test_verl_rollback.py), run
under `lldmon supervise` in the verl virtualenv: `python -m tests.trainer_hooks.verl_rollback_job OUT
[hydra overrides...]`.

No model and no Ray: the job composes verl's real `ppo_trainer` config with its overrides (the
supervisor's `--resume-arg`s included), resumes and saves with verl's own `RayPPOTrainer._load_checkpoint`
and `_save_checkpoint` on a stand-in trainer (the worker group only makes the `actor/` folder), logs
through a real `verl.utils.tracking.Tracking` attached to a recording sink, and runs the documented
levers loop (`DirectiveLevers.take(step=..., checkpoint_dir=...)`). It saves every 2 steps. In its first
attempt it plays the service: after step `REQUEST_AFTER` it writes a rollback request to step
`ROLLBACK_TO` into the directive file. Each attempt writes what it saw to `OUT/attempt-<n>.json`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trainer_hooks.verl as tv
from contracts.directive import Directive, LLDSDirective
from trainer_hooks import rollback

MAX_STEPS = 6
REQUEST_AFTER = 4
ROLLBACK_TO = 3
LR_SCALE = 0.5
VERSION = 7


class WorkerGroup:
    """verl's actor worker group, as far as checkpoints go."""

    def __init__(self) -> None:
        self.loaded: list[str] = []

    def save_checkpoint(self, local_path: str, *args: Any, **kwargs: Any) -> None:
        os.makedirs(local_path, exist_ok=True)

    def load_checkpoint(self, local_path: str, *args: Any, **kwargs: Any) -> None:
        self.loaded.append(local_path)


class Loader:
    """verl's train dataloader, as far as checkpoints go: its position is the step."""

    def __init__(self) -> None:
        self.position = 0

    def __len__(self) -> int:
        return 100

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


class Sink:
    """What `attach` feeds, recorded; its `directive` is the service's (a client's)."""

    def __init__(self) -> None:
        self.directive = Directive()
        self.calls: list[tuple[int, dict[str, float]]] = []
        self.flushes = 0

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.calls.append((step, dict(metrics)))

    def flush(self, timeout: float) -> bool:
        self.flushes += 1
        return True


def main(out: Path, overrides: list[str]) -> int:
    import verl
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.tracking import Tracking

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    trainer: Any = SimpleNamespace(
        config=config,
        global_steps=0,
        actor_rollout_wg=WorkerGroup(),
        use_critic=False,
        train_dataloader=Loader(),
    )
    RayPPOTrainer._load_checkpoint(trainer)  # verl's own resume (resume_mode, resume_from_path)
    resumed_at = trainer.global_steps
    directive_file = out / "directive.json"
    sink = Sink()
    tracking = Tracking("lldmon-test", "rollback", default_backend=[])
    tv.attach(tracking, sink, on_directive=tv.directive_file_writer(directive_file))
    levers = tv.DirectiveLevers(directive_file)
    ended = "finished"
    for step in range(resumed_at + 1, MAX_STEPS + 1):
        trainer.global_steps = step
        trainer.train_dataloader.position = step
        metrics: dict[str, float] = {"actor/entropy": float(step)}
        todo = levers.take(step=step, checkpoint_dir=config.trainer.default_local_dir)
        metrics.update(todo.metrics())
        if step % 2 == 0 or todo.checkpoint or todo.stop:
            RayPPOTrainer._save_checkpoint(trainer)
        tracking.log(data=metrics, step=step)
        if todo.stop or todo.rollback:
            ended = "stop" if todo.stop else "rollback"
            break
        if step == REQUEST_AFTER and rollback.resumed() is None:  # the person at the dashboard
            request = Directive(
                LLDSDirective(True, 0.3),
                version=VERSION,
                rollback=VERSION,
                rollback_to=ROLLBACK_TO,
                lr_scale=LR_SCALE,
            )
            tv.write_directive(directive_file, request)
    tracking.finish()
    attempt = 1 if rollback.resumed() is None else 2
    found = rollback.resumed()
    record = {
        "resume_mode": config.trainer.resume_mode,
        "resumed_at": resumed_at,
        "loaded": trainer.actor_rollout_wg.loaded,
        "position": trainer.train_dataloader.position,
        "lr_scale": None if found is None else found.lr_scale,
        "calls": sink.calls,
        "flushes": sink.flushes,
        "ended": ended,
    }
    (out / f"attempt-{attempt}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))

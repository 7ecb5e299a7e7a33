"""Rollback for verl against the real verl package (0.9.1); skipped where verl is absent. Run it in the
verl virtualenv: `bash scripts/test-verl.sh tests/trainer_hooks/test_verl_rollback.py`.

A full verl driver run (Ray, rollout engine, FSDP workers) does not fit a CPU test, so the round trip
runs a stand-in job (`verl_rollback_job`) under `lldmon supervise` with verl's real config, its own
checkpoint save and resume code, a real `Tracking` and the documented levers loop: a rollback request
to step 3 at step 5 ends the first attempt without saving, the supervisor restarts it with
`RESUME_ARGS`, verl resumes from `global_step_2`, the restarted job reports the restored step with its
first step, does not roll back again, and finishes. The learning-rate factor is checked on a real
optimizer and one of verl's schedulers, restored from a state dict as verl's checkpoint manager does."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

if os.environ.get("LLDMON_REQUIRE_VERL"):  # scripts/test-verl.sh: a missing verl is an error
    import verl  # noqa: F401
else:
    pytest.importorskip("verl")

import torch
from verl.utils.torch_functional import get_cosine_schedule_with_warmup

from contracts.directive import APPLIED_VERSION_METRIC, ROLLBACK_METRIC
from tests.trainer_hooks.verl_rollback_job import LR_SCALE, MAX_STEPS, REQUEST_AFTER, ROLLBACK_TO, VERSION
from trainer_hooks import rollback
from trainer_hooks._warn import WarnOnce
from trainer_hooks.verl.actor import _base_rate, resume_learning_rate, training_worker_class
from trainer_hooks.verl.rollback import RESUME_ARGS

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]


def test_a_rolled_back_verl_job_resumes_from_its_checkpoint_under_the_supervisor(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    resume_args = [arg for template in RESUME_ARGS for arg in ("--resume-arg", template)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLDMON_")}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "trainer_hooks.supervise", *resume_args, "--"),
            *(sys.executable, "-m", "tests.trainer_hooks.verl_rollback_job", str(tmp_path)),
            *(f"trainer.default_local_dir={ckpt}", "trainer.resume_mode=disable"),
        ],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    first = json.loads((tmp_path / "attempt-1.json").read_text())
    second = json.loads((tmp_path / "attempt-2.json").read_text())

    stopped_at = REQUEST_AFTER + 1  # the loop acts on the request at the next step
    restored = ROLLBACK_TO - ROLLBACK_TO % 2  # the newest checkpoint at or before the step (every 2)
    assert first["ended"] == "rollback" and first["resume_mode"] == "disable"
    assert [step for step, _ in first["calls"]] == list(range(1, stopped_at + 1))
    assert first["calls"][-1][1][APPLIED_VERSION_METRIC] == float(VERSION)  # acknowledged, then ended
    assert not (ckpt / f"global_step_{stopped_at}").exists()  # ended without saving
    assert first["flushes"] >= 1  # the sink was flushed before the job ended

    assert "restarting from" in done.stderr and f"global_step_{restored}" in done.stderr
    assert second["resume_mode"] == "resume_path"  # the supervisor's arguments won over the command's
    assert second["loaded"] == [str(ckpt / f"global_step_{restored}" / "actor")]  # verl's own resume
    assert second["resumed_at"] == restored and second["lr_scale"] == LR_SCALE
    assert second["ended"] == "finished"  # the stale request in the directive file was not redone
    assert [step for step, _ in second["calls"]] == list(range(restored + 1, MAX_STEPS + 1))
    markers = [(step, m[ROLLBACK_METRIC]) for step, m in second["calls"] if ROLLBACK_METRIC in m]
    assert markers == [(restored + 1, float(restored))]


def test_the_learning_rate_after_a_restore_is_the_configured_one_times_the_factor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def engine(lr: float) -> SimpleNamespace:
        params = [torch.nn.Parameter(torch.zeros(2))]
        optimizer = torch.optim.AdamW(params, lr=lr)
        return SimpleNamespace(
            optimizer=optimizer,
            lr_scheduler=get_cosine_schedule_with_warmup(
                optimizer, num_warmup_steps=2, num_training_steps=20
            ),
        )

    # the saved job: configured 1e-3, already halved by an earlier rollback, 6 steps in
    saved = engine(1e-3)
    saved.lr_scheduler.base_lrs = [5e-4]
    for _ in range(6):
        saved.optimizer.step()
        saved.lr_scheduler.step()
    monkeypatch.setenv(rollback.ENV_RESUME_FROM, "/ckpt/global_step_6")
    monkeypatch.setenv(rollback.ENV_ROLLED_BACK_TO, "6")
    monkeypatch.setenv(rollback.ENV_LR_SCALE, "0.25")
    fresh = engine(1e-3)
    configured = _base_rate(fresh)
    fresh.optimizer.load_state_dict(saved.optimizer.state_dict())  # what verl's restore does
    fresh.lr_scheduler.load_state_dict(saved.lr_scheduler.state_dict())
    resume_learning_rate(fresh, configured, WarnOnce(logging.getLogger("test")))
    assert fresh.lr_scheduler.base_lrs == pytest.approx([2.5e-4])  # 1e-3 x 0.25, not 5e-4 x 0.25
    assert fresh.optimizer.param_groups[0]["lr"] == pytest.approx(saved.optimizer.param_groups[0]["lr"] / 2)
    fresh.optimizer.step()
    fresh.lr_scheduler.step()
    saved.optimizer.step()
    saved.lr_scheduler.step()
    assert fresh.lr_scheduler.get_last_lr()[0] == pytest.approx(saved.lr_scheduler.get_last_lr()[0] / 2)


def test_lldmons_actor_restores_like_verl_then_sets_the_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    from verl.single_controller.base.decorator import MAGIC_ATTR
    from verl.workers.engine_workers import TrainingWorker

    cls = training_worker_class()
    own = cls.__dict__["load_checkpoint"]
    # dispatched to every rank, as verl's own is
    assert getattr(own, MAGIC_ATTR) == getattr(TrainingWorker.load_checkpoint, MAGIC_ATTR)
    monkeypatch.setenv(rollback.ENV_RESUME_FROM, "/ckpt/global_step_6")
    monkeypatch.setenv(rollback.ENV_ROLLED_BACK_TO, "6")
    monkeypatch.setenv(rollback.ENV_LR_SCALE, "0.5")
    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = torch.optim.SGD(params, lr=1e-3)
    scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=0, num_training_steps=20)
    restored: list[str] = []

    class Engine:  # verl's FSDP engine as far as a restore goes: it brings back the saved rates
        def __init__(self) -> None:
            self.optimizer, self.lr_scheduler = optimizer, scheduler

        def load_checkpoint(self, local_path: str, hdfs_path: object, del_local_after_load: bool) -> None:
            restored.append(local_path)
            self.lr_scheduler.base_lrs = [2e-3]
            for group in self.optimizer.param_groups:
                group["lr"] = 2e-3

    worker = cls.__new__(cls)  # no process group here: only what load_checkpoint uses
    worker.engine = Engine()
    worker._lldmon_warn = WarnOnce(logging.getLogger("test"))
    own.__wrapped__(worker, "/ckpt/global_step_6/actor") if hasattr(own, "__wrapped__") else own(
        worker, "/ckpt/global_step_6/actor"
    )
    assert restored == ["/ckpt/global_step_6/actor"]
    assert scheduler.base_lrs == pytest.approx([5e-4]) and optimizer.param_groups[0]["lr"] == pytest.approx(
        5e-4
    )

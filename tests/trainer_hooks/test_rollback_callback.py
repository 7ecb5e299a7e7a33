"""`LLDMonitorCallback` and a rollback request, without a Trainer: under a supervisor with a checkpoint
at or before the step it writes the request and ends training without saving; without a supervisor or
such a checkpoint it saves and stops, saying why; either way it acknowledges the version once. A job
restarted for a rollback sets the learning rate (scheduler, optimizer, what the Trainer logs), logs
the restored step with its first step, and does not carry out the request it was restarted for again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import TrainerControl, TrainerState

from contracts.directive import APPLIED_VERSION_METRIC, ROLLBACK_METRIC
from trainer_hooks import rollback
from trainer_hooks.trl.callback import LLDMonitorCallback

DIRECTIVE: dict[str, Any] = {
    "llds": {"enabled": True, "lam": 0.2},
    "version": 3,
    "rollback": 3,
    "rollback_to": 5,
    "lr_scale": 0.5,
}


class Sink:
    def __init__(self) -> None:
        self.directive: Any = DIRECTIVE
        self.logged: list[tuple[int, dict[str, float]]] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.logged.append((step, metrics))

    def log_actions(self, step: int, columns: Any) -> None: ...

    def flush(self, timeout: float | None = None) -> bool:
        return True


def checkpoints(root: Path, *steps: int) -> Path:
    for step in steps:
        (root / f"checkpoint-{step}").mkdir(parents=True)
        (root / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    return root


def test_under_a_supervisor_it_hands_over_the_rollback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = tmp_path / "request.json"
    monkeypatch.setenv(rollback.ENV_REQUEST, str(request))
    sink, control = Sink(), TrainerControl()
    callback = LLDMonitorCallback(sink)  # type: ignore[arg-type]
    callback.apply_directive(9, control, str(checkpoints(tmp_path / "out", 2, 4, 6)))
    assert control.should_training_stop and not control.should_save
    assert rollback.read_request(request) == rollback.RollbackRequest(
        str(tmp_path / "out" / "checkpoint-4"), 4, 0.5, 9, version=3
    )
    assert rollback.requested()
    assert sink.logged == [(9, {APPLIED_VERSION_METRIC: 3.0})]
    request.unlink()
    again = TrainerControl()
    callback.apply_directive(10, again, str(tmp_path / "out"))
    assert not again.should_training_stop and not request.exists()  # once per request


@pytest.mark.parametrize("supervised", [False, True])
def test_when_it_cannot_roll_back_it_saves_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, supervised: bool
) -> None:
    if supervised:
        monkeypatch.setenv(rollback.ENV_REQUEST, str(tmp_path / "request.json"))
        out = checkpoints(tmp_path / "out", 6)  # none at or before step 5
    else:
        monkeypatch.delenv(rollback.ENV_REQUEST, raising=False)
        out = checkpoints(tmp_path / "out", 4)
    control = TrainerControl()
    LLDMonitorCallback(Sink()).apply_directive(9, control, str(out))  # type: ignore[arg-type]
    assert control.should_save and control.should_training_stop
    assert not (tmp_path / "request.json").exists()


def test_a_restarted_job_sets_its_learning_rate_and_reports_the_restored_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(rollback.ENV_RESUME_FROM, "/ckpt/checkpoint-4")
    monkeypatch.setenv(rollback.ENV_ROLLED_BACK_TO, "4")
    monkeypatch.setenv(rollback.ENV_LR_SCALE, "0.25")
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))]
    optimizer = torch.optim.SGD([{"params": params[:1], "lr": 0.1}, {"params": params[1:], "lr": 0.05}])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / 10)
    for _ in range(4):  # the checkpoint's scheduler: a base rate already scaled by an earlier rollback
        optimizer.step()
        scheduler.step()
    scheduler.base_lrs = [0.05, 0.025]
    sink = Sink()
    state = TrainerState()
    state.global_step = 4
    LLDMonitorCallback(sink).resume_rollback(state, optimizer, scheduler, base_lr=0.1)  # type: ignore[arg-type]
    assert scheduler.base_lrs == pytest.approx([0.025, 0.0125])  # 0.1 x 0.25, the ratio kept
    assert scheduler.get_last_lr() == pytest.approx([g["lr"] for g in optimizer.param_groups])
    optimizer.step()
    scheduler.step()
    assert scheduler.get_last_lr() == pytest.approx([0.025 * 0.5, 0.0125 * 0.5])
    assert sink.logged == [(5, {ROLLBACK_METRIC: 4.0})]


def test_a_restarted_job_does_not_roll_back_again_for_the_same_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The job before acknowledged version 3, but that batch never reached the service: the directive
    # still shows the request as pending (applied_version 0). The supervisor's environment says done.
    request = tmp_path / "request.json"
    monkeypatch.setenv(rollback.ENV_REQUEST, str(request))
    monkeypatch.setenv(rollback.ENV_RESUME_FROM, str(tmp_path / "out" / "checkpoint-4"))
    monkeypatch.setenv(rollback.ENV_ROLLED_BACK_TO, "4")
    monkeypatch.setenv(rollback.ENV_ROLLBACK_VERSION, "3")
    sink, control = Sink(), TrainerControl()
    callback = LLDMonitorCallback(sink)  # type: ignore[arg-type]
    callback.apply_directive(5, control, str(checkpoints(tmp_path / "out", 2, 4)))
    assert not control.should_training_stop and not control.should_save and not request.exists()
    assert sink.logged == [(5, {APPLIED_VERSION_METRIC: 3.0})]  # acknowledged now
    # a later rollback request is carried out
    sink.directive = {**DIRECTIVE, "version": 4, "rollback": 4, "rollback_to": 4}
    callback.apply_directive(6, control, str(tmp_path / "out"))
    assert control.should_training_stop and rollback.read_request(request) == rollback.RollbackRequest(
        str(tmp_path / "out" / "checkpoint-4"), 4, 0.5, 6, version=4
    )

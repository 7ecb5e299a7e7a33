"""verl's path for the levers (issue 15), without verl: the driver's `attach` writes every new directive
(not only LLDS changes) to the directive file; `DirectiveLevers` in verl's driver loop returns each
checkpoint/stop request once and the acknowledgement to merge into the metrics verl logs; the workers'
LLDS reader still reads the file. Rollback: the loop hands the request to `lldmon supervise` (or stops
when it cannot), the restarted job's attachment reports the restored step with its first step and does
not roll back again (with real verl: test_verl_rollback.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import trainer_hooks.verl as tv
from contracts.directive import APPLIED_VERSION_METRIC, ROLLBACK_METRIC, Directive, Levers, LLDSDirective
from trainer_hooks import rollback
from trainer_hooks._warn import WarnOnce
from trainer_hooks.verl.directive import DirectiveFile
from trainer_hooks.verl.rollback import RESUME_ARGS, resume_overrides


class FakeTracking:
    """What `attach` needs of `verl.utils.tracking.Tracking`: a `log(data, step)`."""

    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, Any]]] = []

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self.logged.append((step, dict(data)))


class ClientLike:
    """A sink with the client's `directive` (as the service's acknowledgements would set it)."""

    def __init__(self) -> None:
        self.directive = Directive()
        self.calls: list[tuple[int, dict[str, float]]] = []

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.calls.append((step, dict(metrics)))


def test_directive_file_carries_requests_to_the_driver_loop(tmp_path: Path) -> None:
    path = tmp_path / "lldmon" / "directive.json"
    tracking, sink = FakeTracking(), ClientLike()
    tv.attach(tracking, sink, on_directive=tv.directive_file_writer(path))
    levers = tv.DirectiveLevers(path)
    assert levers.take() == Levers()  # no file yet: nothing to do

    llds = LLDSDirective(True, 0.2)
    sink.directive = Directive(llds, version=1, source="detector")
    tracking.log({"actor/entropy": 1.0}, step=1)
    # A checkpoint request changes neither LLDS switch nor lambda: it still reaches the file.
    sink.directive = Directive(llds, version=2, source="manual", checkpoint=2)
    tracking.log({"actor/entropy": 1.0}, step=2)
    assert json.loads(path.read_text())["checkpoint"] == 2
    todo = levers.take()
    assert todo == Levers(checkpoint=True, acknowledge=2)
    assert levers.take() == Levers()  # once per request

    # The documented loop merges the acknowledgement into verl's metrics; it reaches the sink as is.
    metrics = {"actor/entropy": 1.0, **todo.metrics()}
    tracking.log(metrics, step=3)
    assert sink.calls[-1] == (3, {"entropy/mean": 1.0, APPLIED_VERSION_METRIC: 2.0})

    sink.directive = Directive(llds, version=3, source="manual", checkpoint=2, stop=3, stop_reason="budget")
    tracking.log({"actor/entropy": 1.0}, step=4)
    assert levers.take() == Levers(stop=True, stop_reason="budget", acknowledge=3)
    # The workers' LLDS reader reads the same file.
    assert DirectiveFile().read(str(path), WarnOnce(logging.getLogger("test"))) == (True, 0.2)


def test_a_bad_directive_file_means_nothing_to_do(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "directive.json"
    path.write_text('{"llds": {"enabled": true, "lam": 0.2}, "version": 2, "stop": "now"}')
    levers = tv.DirectiveLevers(path)
    with caplog.at_level(logging.WARNING, "lldmon.verl"):
        assert levers.take() == Levers()
        path.write_text("{not json")
        assert levers.take() == Levers()
    assert len([r for r in caplog.records if "directive file" in r.getMessage()]) == 1  # warned once
    assert tv.write_directive(path, {"stop": 1}) is False  # malformed: nothing written
    assert path.read_text() == "{not json"


# rollback (trainer_hooks.verl.rollback): the driver loop hands it to `lldmon supervise`; the restarted
# job's attachment reports the restored step; the request it was restarted for is done


ROLLBACK = Directive(LLDSDirective(True, 0.3), version=5, rollback=5, rollback_to=25, lr_scale=0.5)


def verl_checkpoints(root: Path, *steps: int, incomplete: tuple[int, ...] = ()) -> Path:
    """`global_step_<N>` folders as verl's `_save_checkpoint` leaves them (`data.pt` written last)."""
    for step in (*steps, *incomplete):
        (root / f"global_step_{step}" / "actor").mkdir(parents=True)
        if step not in incomplete:
            (root / f"global_step_{step}" / "data.pt").write_bytes(b"")
    return root


def test_a_rollback_request_is_handed_to_the_supervisor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = tmp_path / "request.json"
    monkeypatch.setenv(rollback.ENV_REQUEST, str(request))
    ckpt = verl_checkpoints(tmp_path / "ckpt", 10, 20, 30, incomplete=(24,))
    path = tmp_path / "directive.json"
    tv.write_directive(path, ROLLBACK)
    levers = tv.DirectiveLevers(path)
    todo = levers.take(step=31, checkpoint_dir=ckpt)
    assert todo == Levers(acknowledge=5, rollback=True, rollback_to=20, lr_scale=0.5)  # end, don't save
    assert todo.metrics() == {APPLIED_VERSION_METRIC: 5.0}
    assert rollback.read_request(request) == rollback.RollbackRequest(
        str(ckpt / "global_step_20"), 20, 0.5, 31, version=5
    )
    request.unlink()
    assert levers.take(step=32, checkpoint_dir=ckpt) == Levers(lr_scale=0.5) and not request.exists()


@pytest.mark.parametrize("why", ["no supervisor", "no checkpoint", "no folder given"])
def test_without_a_possible_rollback_the_loop_saves_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, why: str
) -> None:
    if why == "no supervisor":
        monkeypatch.delenv(rollback.ENV_REQUEST, raising=False)
    else:
        monkeypatch.setenv(rollback.ENV_REQUEST, str(tmp_path / "request.json"))
    ckpt = verl_checkpoints(tmp_path / "ckpt", 30)  # none at or before step 25
    path = tmp_path / "directive.json"
    tv.write_directive(path, ROLLBACK)
    with caplog.at_level(logging.WARNING, "lldmon.verl"):
        todo = tv.DirectiveLevers(path).take(
            step=31, checkpoint_dir=None if why == "no folder given" else ckpt
        )
    assert todo.stop and not todo.rollback and todo.acknowledge == 5
    assert "rollback to step 25" in todo.stop_reason and todo.stop_reason in caplog.text
    assert not (tmp_path / "request.json").exists()


def test_a_stop_request_wins_over_a_rollback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(rollback.ENV_REQUEST, str(tmp_path / "request.json"))
    path = tmp_path / "directive.json"
    tv.write_directive(path, Directive(version=6, rollback=5, rollback_to=25, stop=6, stop_reason="budget"))
    todo = tv.DirectiveLevers(path).take(step=31, checkpoint_dir=verl_checkpoints(tmp_path / "ckpt", 20))
    assert todo == Levers(stop=True, stop_reason="budget", acknowledge=6)
    assert not (tmp_path / "request.json").exists()


def test_the_restarted_job_does_not_roll_back_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The directive file is the one the job before left (its acknowledgement is not in it).
    monkeypatch.setenv(rollback.ENV_REQUEST, str(tmp_path / "request.json"))
    monkeypatch.setenv(rollback.ENV_RESUME_FROM, str(tmp_path / "ckpt" / "global_step_20"))
    monkeypatch.setenv(rollback.ENV_ROLLED_BACK_TO, "20")
    monkeypatch.setenv(rollback.ENV_ROLLBACK_VERSION, "5")
    path = tmp_path / "directive.json"
    tv.write_directive(path, ROLLBACK)
    todo = tv.DirectiveLevers(path).take(step=21, checkpoint_dir=verl_checkpoints(tmp_path / "ckpt", 20))
    assert todo == Levers(acknowledge=5)
    assert not (tmp_path / "request.json").exists()


def test_resume_overrides_name_the_checkpoint_only_on_a_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(rollback.ENV_RESUME_FROM, raising=False)
    assert resume_overrides() == []
    env = {rollback.ENV_RESUME_FROM: "/ckpt/global_step_20", rollback.ENV_ROLLED_BACK_TO: "20"}
    assert resume_overrides(env) == [
        "trainer.resume_mode=resume_path",
        "trainer.resume_from_path=/ckpt/global_step_20",
    ]
    assert [a.format(checkpoint="/ckpt/global_step_20") for a in RESUME_ARGS] == resume_overrides(env)


class FlushingSink(ClientLike):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self, timeout: float) -> bool:
        self.flushes += 1
        return True


class FinishingTracking(FakeTracking):
    def __init__(self) -> None:
        super().__init__()
        self.finished = 0

    def finish(self, exit_code: int = 0) -> None:
        self.finished += 1


def test_the_restarted_jobs_attachment_reports_the_restored_step_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(rollback.ENV_RESUME_FROM, str(tmp_path / "global_step_20"))
    monkeypatch.setenv(rollback.ENV_ROLLED_BACK_TO, "20")
    tracking, sink = FinishingTracking(), FlushingSink()
    sink.directive = ROLLBACK  # what a restarted client fetched at start-up
    path = tmp_path / "directive.json"
    tv.attach(tracking, sink, on_directive=tv.directive_file_writer(path))
    # the workers' first redone step reads the service's directive, not what the job before left
    assert json.loads(path.read_text())["llds"] == {"enabled": True, "lam": 0.3}
    tracking.log({"val-core/acc": 0.5}, step=20)  # verl's validation before training: the restored step
    tracking.log({"actor/entropy": 1.0}, step=21)
    tracking.log({"actor/entropy": 1.0}, step=22)
    assert [(step, metrics.get(ROLLBACK_METRIC)) for step, metrics in sink.calls] == [
        (20, None),
        (21, 20.0),
        (22, None),
    ]
    assert tracking.logged[1] == (21, {"actor/entropy": 1.0})  # verl's own loggers see verl's data
    tracking.finish()  # verl, as `fit` returns: what was logged leaves before the job ends
    assert (tracking.finished, sink.flushes) == (1, 1)
    tv.detach(tracking)
    tracking.finish()
    assert (tracking.finished, sink.flushes) == (2, 1)


def test_a_normal_start_reports_no_rollback_and_waits_for_the_first_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(rollback.ENV_RESUME_FROM, raising=False)
    tracking, sink = FakeTracking(), ClientLike()
    path = tmp_path / "directive.json"
    tv.attach(tracking, sink, on_directive=tv.directive_file_writer(path))
    assert not path.exists()  # the default directive is no news from the service
    tracking.log({"actor/entropy": 1.0}, step=1)
    assert ROLLBACK_METRIC not in sink.calls[0][1] and path.exists()

"""`lldmon supervise` (`trainer_hooks.supervise`) with small Python jobs: no request, the job's exit
status; a request, a restart with the resume environment and the `--resume-arg`s; the restart limit;
a malformed request is an error naming the file, a bad placeholder an error at start; SIGTERM goes to
the job and ends supervision. Checkpoint folders of transformers and verl."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer_hooks import rollback
from trainer_hooks.supervise import main, supervise

JOB = """
import json, os, sys
from pathlib import Path
log = Path(sys.argv[1])
attempts = log.read_text().count("\\n") if log.exists() else 0
with log.open("a") as f:
    f.write(json.dumps({"argv": sys.argv[2:], "resume": os.environ.get("LLDMON_RESUME_FROM"),
                        "step": os.environ.get("LLDMON_ROLLED_BACK_TO"),
                        "lr_scale": os.environ.get("LLDMON_LR_SCALE"),
                        "version": os.environ.get("LLDMON_ROLLBACK_VERSION")}) + "\\n")
rollbacks = int(os.environ.get("ROLLBACKS", "0"))
if attempts < rollbacks:
    Path(os.environ["LLDMON_SUPERVISOR_REQUEST"]).write_text(json.dumps(
        {"checkpoint": f"/ckpt/checkpoint-{10 * (attempts + 1)}", "step": 10 * (attempts + 1),
         "lr_scale": 0.5 ** (attempts + 1), "from_step": 50, "version": 7 + attempts}))
sys.exit(int(os.environ.get("EXIT", "0")))
"""


def job(tmp_path: Path) -> tuple[list[str], Path]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    log = tmp_path / "attempts.jsonl"
    return [sys.executable, str(script), str(log)], log


def attempts(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_without_a_request_the_job_runs_once_and_its_status_is_returned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    command, log = job(tmp_path)
    monkeypatch.setenv("EXIT", "3")
    assert supervise(command) == 3
    assert attempts(log) == [{"argv": [], "resume": None, "step": None, "lr_scale": None, "version": None}]


def test_each_request_restarts_the_job_from_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    command, log = job(tmp_path)
    monkeypatch.setenv("ROLLBACKS", "2")
    resume_args = [
        "--resume-arg",
        "resume_from={checkpoint}@{step}",
        "--resume-arg",
        "lr={lr_scale}/{version}",
    ]
    assert main([*resume_args, "--", *command]) == 0
    assert attempts(log) == [
        {"argv": [], "resume": None, "step": None, "lr_scale": None, "version": None},
        {
            "argv": ["resume_from=/ckpt/checkpoint-10@10", "lr=0.5/7"],
            "resume": "/ckpt/checkpoint-10",
            "step": "10",
            "lr_scale": "0.5",
            "version": "7",
        },
        {
            "argv": ["resume_from=/ckpt/checkpoint-20@20", "lr=0.25/8"],
            "resume": "/ckpt/checkpoint-20",
            "step": "20",
            "lr_scale": "0.25",
            "version": "8",
        },
    ]
    assert rollback.resumed({"LLDMON_RESUME_FROM": "/c", "LLDMON_ROLLED_BACK_TO": "10"}) == rollback.Resumed(
        "/c", 10, 1.0, 0
    )  # a supervisor from before the version: the version is unknown (0)


def test_a_bad_resume_arg_placeholder_fails_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command, log = job(tmp_path)
    with pytest.raises(SystemExit):
        main(["--resume-arg", "trainer.resume_from_path={checkpiont}", "--", *command])
    assert "checkpiont" in capsys.readouterr().err and not log.exists()


def test_the_restart_limit_ends_supervision_with_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    command, log = job(tmp_path)
    monkeypatch.setenv("ROLLBACKS", "5")
    assert supervise(command, max_restarts=1) == 1
    assert len(attempts(log)) == 2


def test_a_malformed_request_names_its_file(tmp_path: Path) -> None:
    bad = tmp_path / "request.json"
    bad.write_text('{"checkpoint": "x", "step": "ten"}')
    with pytest.raises(ValueError, match=r"malformed rollback request in .*request\.json"):
        rollback.read_request(bad)
    bad.write_text(json.dumps({"checkpoint": "x", "step": 3, "lr_scale": 0, "from_step": 9}))
    with pytest.raises(ValueError, match="lr_scale"):
        rollback.read_request(bad)


def test_find_checkpoint_takes_the_newest_complete_one_at_or_before_the_step(tmp_path: Path) -> None:
    for step, complete in ((2, True), (4, True), (6, False), (8, True)):
        d = tmp_path / f"checkpoint-{step}"
        d.mkdir()
        if complete:
            (d / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-x").mkdir()
    assert rollback.find_checkpoint(tmp_path, 7) == (tmp_path / "checkpoint-4", 4)
    assert rollback.find_checkpoint(tmp_path, 8) == (tmp_path / "checkpoint-8", 8)
    assert rollback.find_checkpoint(tmp_path, 1) is None
    assert rollback.find_checkpoint(tmp_path / "missing", 9) is None


def test_find_checkpoint_reads_verls_global_step_folders(tmp_path: Path) -> None:
    from trainer_hooks.verl.rollback import VERL_CHECKPOINT
    from trainer_hooks.verl.rollback import find_checkpoint as find_verl_checkpoint

    for step, complete in ((10, True), (20, True), (30, False)):
        d = tmp_path / f"global_step_{step}"
        (d / "actor").mkdir(parents=True)
        if complete:
            (d / "data.pt").write_bytes(b"")
    (tmp_path / "checkpoint-25").mkdir()  # transformers' name: not verl's
    (tmp_path / "checkpoint-25" / "trainer_state.json").write_text("{}")
    assert rollback.find_checkpoint(tmp_path, 35, VERL_CHECKPOINT) == (tmp_path / "global_step_20", 20)
    assert rollback.find_checkpoint(tmp_path, 35) == (tmp_path / "checkpoint-25", 25)
    assert find_verl_checkpoint(tmp_path, 19) == (str(tmp_path / "global_step_10"), 10)
    assert find_verl_checkpoint(tmp_path, 9) is None


def test_sigterm_goes_to_the_job_and_is_not_followed_by_a_restart(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    script = tmp_path / "wait.py"
    script.write_text(
        "import json, os, signal, sys, time\n"
        "from pathlib import Path\n"
        "Path(os.environ['LLDMON_SUPERVISOR_REQUEST']).write_text(json.dumps("
        "{'checkpoint': 'c', 'step': 1, 'lr_scale': 1.0, 'from_step': 2}))\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
        f"Path({str(ready)!r}).write_text('x')\n"
        "while True: time.sleep(0.05)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer_hooks.supervise", "--", sys.executable, str(script)],
        # the default disposition, whatever the test runner's is
        preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL),
        env={**os.environ},
    )
    try:
        while not ready.exists():
            assert proc.poll() is None, "the supervised job ended before it was ready"
            time.sleep(0.01)  # polling a condition, not waiting out a guess
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        if proc.poll() is None:
            proc.kill()

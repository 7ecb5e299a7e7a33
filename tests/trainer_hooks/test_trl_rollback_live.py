"""The rollback lever end to end (issue 28): a real TRL GRPO run (tiny model, CPU) under
`lldmon supervise`, streaming to a live `lldmon serve` (PostgreSQL where the session has it:
`trainer_backend`). A rollback request to step 4 (with LLDS on, as policy `heal` asks) after step 5
ends the first attempt at step 6 without finishing the run; the supervisor restarts the job from
`checkpoint-4` with the learning rate halved; the second attempt trains steps 5-8 and finishes. The
service records the rollback (6 -> 4, 2 steps redone), keeps one point per step, the redone steps ran
at half the learning rate, and all of them, the first included, with LLDS on (the restarted client
fetches the run's directive at start-up)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contracts import metrics as M
from contracts.directive import ROLLBACK_METRIC
from tests.conftest import live_server_on
from tests.trainer_hooks.rollback_job import LLDS_LAMBDA, MAX_STEPS, REQUEST_AFTER, ROLLBACK_TO

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_rolled_back_trl_run_continues_from_its_checkpoint(trainer_backend: str, tmp_path: Path) -> None:
    out = tmp_path / "job"
    out.mkdir()
    with live_server_on(trainer_backend, tmp_path / "server") as server:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "trainer_hooks.supervise",
                "--",
                sys.executable,
                "-m",
                "tests.trainer_hooks.rollback_job",
                server.url,
                str(out),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=540,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        [run] = [r for r in server.get("/runs") if r["name"] == "rollback"]
        rollbacks = server.get(f"/runs/{run['id']}/rollbacks")
        directive = server.get(f"/runs/{run['id']}/directive")
        grad = server.get(f"/runs/{run['id']}/metrics?names=grad/norm")["series"]["grad/norm"]
        marker = server.get(f"/runs/{run['id']}/metrics?names={ROLLBACK_METRIC}")["series"][ROLLBACK_METRIC]
        llds = server.get(f"/runs/{run['id']}/metrics", names=[M.LLDS_ACTIVE, M.LLDS_LAMBDA])["series"]

    stopped_at = REQUEST_AFTER + 1  # the trainer acts on the request at the next step's end
    assert "restarting from" in done.stderr and f"checkpoint-{ROLLBACK_TO}" in done.stderr
    assert [(r["from_step"], r["to_step"], r["steps_redone"]) for r in rollbacks] == [
        (stopped_at, ROLLBACK_TO, stopped_at - ROLLBACK_TO)
    ]
    assert (
        rollbacks[0]["version"] == directive["rollback"]
        and directive["applied_version"] >= directive["rollback"]
    )
    assert run["status"] == "finished" and run["last_step"] == MAX_STEPS
    assert grad["steps"] == list(range(1, MAX_STEPS + 1))  # one point per step, the redone ones replaced
    assert (marker["steps"], marker["values"]) == ([ROLLBACK_TO + 1], [float(ROLLBACK_TO)])
    # LLDS: off before the request; on in every redone step, the first one too (not only from the
    # first acknowledgement of the restarted job on)
    active = dict(zip(llds[M.LLDS_ACTIVE]["steps"], llds[M.LLDS_ACTIVE]["values"], strict=True))
    lam = dict(zip(llds[M.LLDS_LAMBDA]["steps"], llds[M.LLDS_LAMBDA]["values"], strict=True))
    assert active == {s: 0.0 if s <= ROLLBACK_TO else 1.0 for s in range(1, MAX_STEPS + 1)}, active
    assert all(lam[s] == LLDS_LAMBDA for s in range(ROLLBACK_TO + 1, MAX_STEPS + 1)), lam
    first = {int(k): v for k, v in json.loads((out / "lr-1.json").read_text()).items()}
    second = {int(k): v for k, v in json.loads((out / "lr-2.json").read_text()).items()}
    assert sorted(first) == list(range(1, stopped_at + 1))
    assert sorted(second) == list(range(1, MAX_STEPS + 1))  # the checkpoint's history, then its own
    for step in range(1, ROLLBACK_TO + 1):
        assert second[step] == first[step], step
    for step in range(ROLLBACK_TO + 1, stopped_at + 1):
        assert second[step] == pytest.approx(0.5 * first[step]), step

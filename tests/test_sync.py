"""`lldmon sync DIR`: upload what a training job spooled while the service was down, exactly once."""

from __future__ import annotations

import contextlib
import math
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from contracts import spool
from contracts.spool import RunIdentity, SpoolEntry
from monitor.cli import app
from tests.conftest import live_server_on
from tests.live_server import LiveServer, free_port
from trainer_hooks.client import MonitorClient, RetryPolicy

pytestmark = pytest.mark.timeout(60)  # bounded even if a server or thread hangs

runner = CliRunner()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("server")).start() as live:
        yield live


def spool_offline(root: Path, project: str, run: str, steps: range) -> None:
    """A training job whose service was unreachable the whole time."""
    client = MonitorClient(
        f"http://127.0.0.1:{free_port()}",
        run,
        project=project,
        tags=["offline"],
        spool_dir=root / project / run,
        flush_interval=0.02,
        max_batch_rows=25,
        enabled=True,
        retry=RetryPolicy(attempts=1, backoff_base=0.01, backoff_max=10.0),
    )
    for step in steps:
        client.log(step, {"loss": 1.0 / (step + 1), "grad/norm": math.inf if step == 3 else 1.0})
    client.close(timeout=5)
    assert client.stats.sent == 0 and client.stats.spooled > 0


def sync(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["sync", *args], env={"COLUMNS": "200"})
    return result.exit_code, result.output


def test_sync_uploads_every_batch_once_and_is_idempotent(server: LiveServer, tmp_path: Path) -> None:
    root = tmp_path / "spool"
    spool_offline(root, "nq", "run-a", range(60))
    spool_offline(root, "nq", "run-b", range(30))
    n_files = sum(spool.spool_size(d)[0] for d in spool.find_spool_dirs(root))
    backup = tmp_path / "backup"
    shutil.copytree(root, backup)

    code, out = sync(str(root), "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "2")
    assert code == 1, out  # service unreachable: nothing lost, everything still there
    assert f"sent 0, duplicates 0, rejected 0, remaining {n_files}" in out and "ConnectError" in out

    code, out = sync(str(root), "--url", server.url)
    assert code == 0, out
    assert f"sent {n_files}, duplicates 0, rejected 0, remaining 0" in out
    for name, n in (("run-a", 60), ("run-b", 30)):
        run_id = server.run_id(name, project="nq")
        series = server.series(run_id)
        assert series["loss"]["steps"] == list(range(n))
        assert series["grad/norm"]["values"][3] == "Infinity"
        assert server.ledger(run_id)["metrics"][1] == 2 * n
        assert server.get(f"/runs/{run_id}")["tags"] == ["offline"]
    run_a = server.run_id("run-a", project="nq")
    assert server.get(f"/runs/{run_a}/metrics", names="loss")["series"]["loss"]["values"][0] == 1.0

    code, out = sync(str(root), "--url", server.url)
    assert code == 0 and "sent 0, duplicates 0, rejected 0, remaining 0" in out, out

    import httpx

    assert httpx.post(f"{server.api}/runs/{run_a}/finish", json={"status": "finished"}).status_code == 200
    shutil.rmtree(root)
    shutil.copytree(backup, root)  # the same batches once more: acknowledged as duplicates
    code, out = sync(str(root / "nq" / "run-a"), "--url", server.url)
    n_a = spool.spool_size(backup / "nq" / "run-a")[0]
    assert code == 0 and f"sent 0, duplicates {n_a}, rejected 0, remaining 0" in out, out
    assert server.ledger(run_a)["metrics"][1] == 120  # nothing stored twice
    assert server.get(f"/runs/{run_a}")["status"] == "finished"  # looked up, not re-registered


def test_sync_keeps_rejected_batches_and_goes_on(server: LiveServer, tmp_path: Path) -> None:
    run = RunIdentity(run_name="run-r", project="nq")
    good = {"batch_id": "good-1", "steps": [1], "metrics": {"loss": [0.5]}}
    bad = {"batch_id": "bad-1", "steps": [2], "metrics": {"loss": ["not a number"]}}
    later = {"batch_id": "good-2", "steps": [3], "metrics": {"loss": [0.25]}}
    for body in (good, bad, later):
        spool.write_entry(tmp_path, SpoolEntry(run=run, kind="metrics", body=body))

    code, out = sync(str(tmp_path), "--url", server.url)
    assert code == 0, out
    assert "sent 2, duplicates 0, rejected 1, remaining 0" in out
    assert [e.batch_id for e in spool.iter_entries(tmp_path / spool.REJECTED_DIR)] == ["bad-1"]
    run_id = server.run_id("run-r", project="nq")
    assert server.series(run_id)["loss"]["steps"] == [1, 3]


def test_sync_sends_the_token(server: LiveServer, tmp_path: Path) -> None:
    created = runner.invoke(app, ["token", "create", "--project", "nq", "--data-dir", str(server.data_dir)])
    assert created.exit_code == 0, created.output
    token = created.output.strip().splitlines()[-1]
    try:  # auth is on while the token exists
        run = RunIdentity(run_name="run-t", project="nq")
        body = {"batch_id": "t-1", "steps": [1], "metrics": {"loss": [0.5]}}
        spool.write_entry(tmp_path, SpoolEntry(run=run, kind="metrics", body=body))
        code, out = sync(str(tmp_path), "--url", server.url)
        assert code == 1 and "remaining 1" in out and "401" in out, out
        code, out = sync(str(tmp_path), "--url", server.url, "--token", token)
        assert code == 0 and "sent 1, duplicates 0, rejected 0, remaining 0" in out, out
    finally:
        token_id = re.search(r"token (\d+) for project", created.output)
        assert token_id is not None
        revoked = runner.invoke(
            app, ["token", "revoke", token_id.group(1), "--data-dir", str(server.data_dir)]
        )
        assert revoked.exit_code == 0, revoked.output


def test_sync_of_a_missing_directory_fails_cleanly(tmp_path: Path) -> None:
    code, out = sync(str(tmp_path / "nope"), "--url", "http://127.0.0.1:9")
    assert code == 2 and "not a directory" in out


# ------------------------------------------------------------------ issue 16: #2 and #12 (both databases)

LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def small_server(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """`lldmon serve` with a 64 KiB body limit, on SQLite and (when configured) PostgreSQL."""
    tmp = tmp_path_factory.mktemp(f"small-{backend}")
    with live_server_on(backend, tmp, {"LLDMON_MAX_BODY_BYTES": str(LIMIT)}) as live:
        yield live


def wide_body(batch_id: str, steps: range, width: int = 60) -> dict[str, Any]:
    """A metrics body of ~19 bytes per value: 200 steps x 60 metrics is ~3.5 times the 64 KiB limit."""
    return {
        "batch_id": batch_id,
        "steps": list(steps),
        "metrics": {
            f"m/{i:03d}": ["Infinity" if s % 7 == 0 and i == 0 else s + i / 7 for s in steps]
            for i in range(width)
        },
    }


def test_sync_splits_oversized_batches_and_replays_rejected_ones(
    small_server: LiveServer, tmp_path: Path
) -> None:
    """A batch the old client filed in rejected/ after a 413 (and one over the limit still in the spool)
    is delivered in parts; a batch that is really invalid stays in rejected/ and is listed."""
    run = RunIdentity(run_name="wide-sync", project="nq")
    rejected = tmp_path / spool.REJECTED_DIR
    spool.write_entry(
        rejected, SpoolEntry(run=run, kind="metrics", body=wide_body("too-big-1", range(0, 200)))
    )
    bad = {"batch_id": "bad-1", "steps": [900], "metrics": {"loss": ["not a number"]}}
    spool.write_entry(rejected, SpoolEntry(run=run, kind="metrics", body=bad))
    spool.write_entry(
        tmp_path, SpoolEntry(run=run, kind="metrics", body=wide_body("too-big-2", range(200, 400)))
    )
    spool.write_entry(tmp_path, SpoolEntry(run=run, kind="metrics", body=wide_body("small", range(400, 401))))
    assert len(next(spool.iter_entries(rejected)).body_bytes()) > 2 * LIMIT

    code, out = sync(str(tmp_path), "--url", small_server.url)
    assert code == 0, out
    assert "1 earlier rejected batches delivered, 1 refused again and kept" in out and "batch bad-1" in out
    assert "remaining 0" in out and "rejected 0" in out
    assert [e.batch_id for e in spool.iter_entries(rejected)] == ["bad-1"]
    run_id = small_server.run_id("wide-sync", project="nq")
    series = small_server.series(run_id)
    assert len(series) == 60 and "loss" not in series
    assert series["m/000"]["steps"] == list(range(401))
    assert series["m/000"]["values"] == ["Infinity" if s % 7 == 0 else float(s) for s in range(401)]
    assert series["m/059"]["values"] == [s + 59 / 7 for s in range(401)]

    code, out = sync(str(tmp_path), "--url", small_server.url)  # again: only the invalid one is offered
    assert code == 0 and "0 earlier rejected batches delivered, 1 refused again" in out, out


def spool_closed(root: Path, run: str, status: str) -> Path:
    """A job that never reached its service and closed its client with `status`."""
    client = MonitorClient(
        f"http://127.0.0.1:{free_port()}",
        run,
        project="nq",
        spool_dir=root / run,
        flush_interval=0.02,
        enabled=True,
        retry=RetryPolicy(attempts=1, backoff_base=0.01, backoff_max=10.0),
    )
    for step in range(20):
        client.log(step, {"loss": 1.0 / (step + 1)})
    client.close(timeout=5, status=status)  # type: ignore[arg-type]
    return root / run


def test_sync_gives_runs_the_final_status_their_job_recorded(
    small_server: LiveServer, tmp_path: Path
) -> None:
    spool_closed(tmp_path, "ends-finished", "finished")
    spool_closed(tmp_path, "ends-failed", "failed")
    with (
        contextlib.suppress(RuntimeError),
        MonitorClient(  # the context manager closes with "failed" on an exception
            f"http://127.0.0.1:{free_port()}",
            "ends-raising",
            project="nq",
            spool_dir=tmp_path / "ends-raising",
            flush_interval=0.02,
            enabled=True,
            retry=RetryPolicy(attempts=1, backoff_base=0.01, backoff_max=10.0),
        ) as client,
    ):
        client.log(0, {"loss": 1.0})
        raise RuntimeError("training died")
    killed = RunIdentity(run_name="ends-killed", project="nq")  # kill -9: batches but no final status
    body = {"batch_id": "k-1", "steps": [0], "metrics": {"loss": [1.0]}}
    spool.write_entry(tmp_path / "ends-killed", SpoolEntry(run=killed, kind="metrics", body=body))

    code, out = sync(str(tmp_path), "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "2")
    assert code == 1, out  # unreachable: the markers stay for the next try
    assert len(list(tmp_path.glob("*/finish-*.json"))) == 3

    code, out = sync(str(tmp_path), "--url", small_server.url + "/api/v1/")  # the API's URL works too
    assert code == 0, out
    status = {
        name: small_server.get(f"/runs/{small_server.run_id(name, project='nq')}")["status"]
        for name in ("ends-finished", "ends-failed", "ends-raising", "ends-killed")
    }
    assert status == {
        "ends-finished": "finished",
        "ends-failed": "failed",
        "ends-raising": "failed",
        "ends-killed": "running",
    }
    assert "run 'ends-killed': the spool holds no final status" in out
    assert not list(tmp_path.glob("*/finish-*.json"))
    run_id = small_server.run_id("ends-failed", project="nq")
    assert small_server.series(run_id)["loss"]["steps"] == list(range(20))


def test_a_resumed_client_clears_its_runs_old_final_status(tmp_path: Path) -> None:
    """The next process of the same run is running it again: the spooled "finished" must not win."""
    directory = spool_closed(tmp_path, "resumed", "finished")
    assert len(list(directory.glob("finish-*.json"))) == 1
    client = MonitorClient(
        f"http://127.0.0.1:{free_port()}",
        "resumed",
        project="nq",
        spool_dir=directory,
        enabled=True,
        retry=RetryPolicy(attempts=1, backoff_base=0.01, backoff_max=10.0),
    )
    assert client.flush(timeout=5)
    assert not list(directory.glob("finish-*.json"))
    client.close(timeout=5, status="failed")
    assert [s for _, _, s in spool.read_finishes(directory)] == ["failed"]

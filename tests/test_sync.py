"""`lldmon sync DIR`: upload what a training job spooled while the service was down, exactly once."""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contracts import spool
from contracts.spool import RunIdentity, SpoolEntry
from monitor.cli import app
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

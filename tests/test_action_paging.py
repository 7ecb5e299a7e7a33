"""Every action record the service accepts reads back, on SQLite and PostgreSQL: a step that holds more
records than one read may return (two accepted batches of 100,000 records for one step, against the
200,000 cap of a read) comes back whole through `lldmon export --actions` (local and `--url`) and
`fetch_actions`, read in pages that go on inside the step (`GET /actions`' `after_*` cursor)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from contracts.action_pages import MAX_ACTION_READ
from contracts.wire import API_PREFIX
from monitor.cli import app
from tests.conftest import live_server_on
from tests.live_server import LiveServer
from trainer_hooks.history import fetch_actions

pytestmark = pytest.mark.timeout(600)
runner = CliRunner()
BIG_STEP = 5
HALF = MAX_ACTION_READ // 2
COLUMNS = ["step", "source", "traj_index", "action_index", "n_tokens", "delta", "old_logp_mean"]
COLUMNS += ["advantage", "reward", "is_answer"]


def records(step: int, source: str, lo: int, hi: int) -> dict[str, np.ndarray]:
    """Records lo..hi-1 of one (step, source): 8 actions per trajectory, values from the index."""
    i = np.arange(lo, hi, dtype=np.int64)
    return {
        "step": np.full(i.size, step, dtype=np.int64),
        "source": np.full(i.size, source, dtype=object),
        "traj_index": i // 8,
        "action_index": i % 8,
        "n_tokens": i % 50 + 1,
        "delta": ((i % 1000) / 1024 - 0.5).astype(np.float64),
        "old_logp_mean": -((i % 7) / 8).astype(np.float64),
        "advantage": np.where(i % 2 == 0, 1.0, -1.0),
        "reward": (i % 3).astype(np.float64),
        "is_answer": i % 8 == 7,
    }


def body(columns: dict[str, np.ndarray]) -> dict[str, Any]:
    return {"batch_id": uuid.uuid4().hex, **{name: columns[name].tolist() for name in COLUMNS}}


SMALL = [records(4, "loss", 0, 3), records(BIG_STEP, "probe", 0, 2), records(6, "loss", 0, 3)]
BIG = [records(BIG_STEP, "loss", 0, HALF), records(BIG_STEP, "loss", HALF, 2 * HALF)]


def expected() -> pd.DataFrame:
    parts = [SMALL[0], *BIG, SMALL[1], SMALL[2]]  # key order: step, then source, then trajectory
    return pd.DataFrame({name: np.concatenate([p[name] for p in parts]) for name in COLUMNS})


def assert_same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert len(got) == len(want)
    for name in COLUMNS:
        g, w = got[name].to_numpy(), want[name].to_numpy()
        if name in ("delta", "old_logp_mean", "advantage", "reward"):
            assert np.array_equal(g.astype(np.float64), w.astype(np.float64)), name
        else:
            assert g.tolist() == w.tolist(), name


@pytest.fixture(scope="module")
def served(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, int]]:
    with live_server_on(backend, tmp_path_factory.mktemp(f"paging-{backend}")) as live:
        run = httpx.post(f"{live.api}/runs", json={"name": "big-step", "project": "nq"}, timeout=10).json()
        for columns in [*SMALL, *BIG]:  # both halves of the big step are accepted
            reply = httpx.post(f"{live.api}/runs/{run['id']}/actions", json=body(columns), timeout=120)
            assert reply.status_code == 200, reply.text
        yield live, int(run["id"])


def test_a_step_over_the_read_cap_exports_whole_locally_and_over_the_api(
    served: tuple[LiveServer, int], tmp_path: Path
) -> None:
    live, run_id = served
    local = ["--database-url", live.database_url] if live.database_url else ["--data-dir", str(live.data_dir)]
    outputs = {}
    for mode, where in (("local", local), ("url", ["--url", live.url])):
        path = tmp_path / f"{mode}.csv"
        result = runner.invoke(app, ["export", str(run_id), "--actions", "-o", str(path), *where])
        assert result.exit_code == 0, result.output
        assert f"{2 * HALF + 8} action records over 3 steps" in result.output
        assert_same(pd.read_csv(path), expected())
        outputs[mode] = path.read_bytes()
    assert outputs["local"] == outputs["url"]


def test_a_step_over_the_read_cap_fetches_whole(served: tuple[LiveServer, int]) -> None:
    live, run_id = served
    assert_same(fetch_actions(live.url, run_id, timeout=120), expected())
    window = fetch_actions(
        live.url, run_id, step_min=BIG_STEP, step_max=BIG_STEP, source="loss", page_records=70_001
    )
    assert_same(window, pd.DataFrame({n: np.concatenate([b[n] for b in BIG]) for n in COLUMNS}))


def test_the_cursor_reads_on_inside_a_step(client: TestClient) -> None:
    """GET /actions with `after_*`: the records after that key, from inside a block, from its last
    record, from a key between records, with other filters; the four parameters go together."""
    run_id = client.post(f"{API_PREFIX}/runs", json={"name": "cursor"}).json()["id"]
    for columns in (records(1, "loss", 0, 20), records(1, "probe", 0, 4), records(2, "loss", 0, 5)):
        assert client.post(f"{API_PREFIX}/runs/{run_id}/actions", json=body(columns)).status_code == 200

    def keys(**params: Any) -> list[tuple[int, str, int, int]]:
        reply = client.get(f"{API_PREFIX}/runs/{run_id}/actions", params=params)
        assert reply.status_code == 200, reply.text
        data = reply.json()
        return list(zip(data["step"], data["source"], data["traj_index"], data["action_index"], strict=True))

    every = keys(limit=1000)
    assert len(every) == 29 and every == sorted(every)

    def after(key: tuple[int, str, int, int], **params: Any) -> list[tuple[int, str, int, int]]:
        cursor = dict(
            zip(("after_step", "after_source", "after_traj_index", "after_action_index"), key, strict=True)
        )
        return keys(**cursor, **params)

    for i in (0, 7, 19, 20, 23, 28):  # inside the first block, its last record, the next source, the end
        assert after(every[i], limit=1000) == every[i + 1 :], i
        assert after(every[i], limit=3) == every[i + 1 : i + 4], i
    between = [(1, "loss", 1, 4), (1, "loss", 1, 5)]
    assert after((1, "loss", 1, 3), limit=2) == between  # a key between records
    assert after((1, "loss", 99, 0), limit=2) == every[20:22]  # past the block's last key
    assert after((0, "probe", 0, 0), limit=2) == every[:2]  # before the run's first step
    assert after((1, "loss", 0, 3), source="probe") == every[20:24]
    assert after((1, "loss", 0, 3), step_max=1, limit=1000) == every[4:24]
    assert after((1, "probe", 0, 1), step_min=2) == every[24:]

    partial = client.get(
        f"{API_PREFIX}/runs/{run_id}/actions", params={"after_step": 1, "after_source": "loss"}
    )
    assert partial.status_code == 422 and "go together" in partial.text
    for name, value in (("after_traj_index", 2**63), ("after_source", "both"), ("after_step", -1)):
        bad = {
            "after_step": 1,
            "after_source": "loss",
            "after_traj_index": 0,
            "after_action_index": 0,
            name: value,
        }
        assert client.get(f"{API_PREFIX}/runs/{run_id}/actions", params=bad).status_code == 422, name

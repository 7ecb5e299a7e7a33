"""trainer_hooks.history: metric history as a DataFrame over HTTP, against a live `lldmon serve`
(auth off and on) and the in-process app on SQLite and PostgreSQL (paging a 12,000-step run)."""

from __future__ import annotations

import math
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from contracts.wire import API_PREFIX
from tests.live_server import LiveServer
from trainer_hooks.history import AccessDenied, HistoryError, RunNotFound, fetch_metrics, fetch_runs

ROOT = Path(__file__).resolve().parents[2]
NAN, INF = math.nan, math.inf

# step -> value per metric; absent = not logged
A = {0: 0.5, 1: 0.25, 2: NAN, 3: INF, 4: -INF, 5: 1e-300, 6: -2.0}
B = {0: 10.0, 2: 12.5, 6: NAN}


def expected(columns: dict[str, dict[int, float]]) -> pd.DataFrame:
    """The reference frame, built the obvious way."""
    steps = sorted(set().union(*columns.values()))
    frame = pd.DataFrame(
        {name: [float(points.get(s, NAN)) for s in steps] for name, points in columns.items()},
        index=pd.Index(steps, dtype="int64", name="step"),
    )
    return frame


def post_metrics(base: str, run_id: int, columns: dict[str, dict[int, float]], **kw: Any) -> None:
    steps = sorted(set().union(*columns.values()))
    body = {
        "batch_id": uuid.uuid4().hex,
        "steps": steps,
        "metrics": {name: [_wire(points.get(s)) for s in steps] for name, points in columns.items()},
    }
    response = httpx.post(f"{base}/runs/{run_id}/metrics", json=body, timeout=30, **kw)
    assert response.status_code == 200, response.text


def _wire(v: float | None) -> float | str | None:
    if v is None or math.isfinite(v):
        return v
    return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("history")).start() as live:
        for project in ("nq", "hotpot"):
            run = httpx.post(f"{live.api}/runs", json={"name": "nb", "project": project}).json()
            post_metrics(live.api, run["id"], {"m/a": A, "m/b": B} if project == "nq" else {"m/a": {0: 1.0}})
        yield live


def test_fetch_metrics_from_a_live_server(server: LiveServer) -> None:
    frame = fetch_metrics(server.url, "nb", project="nq")
    pd.testing.assert_frame_equal(frame, expected({"m/a": A, "m/b": B}))
    assert np.isposinf(frame.loc[3, "m/a"]) and np.isneginf(frame.loc[4, "m/a"])
    run_id = server.run_id("nb", "nq")
    assert frame.attrs["run_id"] == run_id
    by_id = fetch_metrics(server.url + "/", run_id, metrics=["m/b", "m/a"], step_min=2, step_max=5)
    pd.testing.assert_frame_equal(by_id, expected({"m/b": B, "m/a": A}).loc[2:5])
    with pytest.raises(HistoryError, match=r"2 runs are named 'nb' \(projects: hotpot, nq\); pass project="):
        fetch_metrics(server.url, "nb")
    with pytest.raises(RunNotFound, match="no run named 'absent'"):
        fetch_metrics(server.url, "absent")
    with pytest.raises(RunNotFound, match="run 999 does not exist"):
        fetch_metrics(server.url, 999)
    with pytest.raises(ValueError, match=r"has no metric 'm/zz'; it has: m/a, m/b"):
        fetch_metrics(server.url, run_id, metrics=["m/a", "m/zz"])
    runs = fetch_runs(server.url)
    assert sorted(zip(runs["project"], runs["name"], runs["last_step"], strict=True)) == [
        ("hotpot", "nb", 0),
        ("nq", "nb", 6),
    ]
    assert str(runs["created_at"].dtype).startswith("datetime64") and runs.index.name == "id"


def test_fetch_metrics_with_auth_on(server: LiveServer) -> None:
    from monitor.api.app import build_state
    from monitor.config import Settings

    state = build_state(Settings(data_dir=server.data_dir))
    nq_token, nq_id = state.auth.create_token("nq")
    hotpot_token, hotpot_id = state.auth.create_token("hotpot")
    try:
        with pytest.raises(AccessDenied, match=r"requires 'Authorization: Bearer <token>'.*pass token="):
            fetch_metrics(server.url, "nb", project="nq")
        with pytest.raises(AccessDenied, match="unknown or revoked token"):
            fetch_metrics(server.url, "nb", token="lldm_forged")
        frame = fetch_metrics(server.url, "nb", token=nq_token)  # the token sees one run named nb
        pd.testing.assert_frame_equal(frame, expected({"m/a": A, "m/b": B}))
        with pytest.raises(RunNotFound, match=f"run {frame.attrs['run_id']} does not exist"):
            fetch_metrics(server.url, frame.attrs["run_id"], token=hotpot_token)
        with pytest.raises(RunNotFound, match="no run named 'nb' in project 'nq'"):
            fetch_metrics(server.url, "nb", project="nq", token=hotpot_token)
        assert fetch_runs(server.url, token=hotpot_token)["project"].tolist() == ["hotpot"]
    finally:  # auth off again for the other tests
        state.auth.revoke(nq_id)
        state.auth.revoke(hotpot_id)
        state.auth.turn_off()  # revoking alone keeps auth on
        state.db.dispose()


def test_history_needs_neither_the_server_stack_nor_torch(server: LiveServer) -> None:
    code = (
        "import sys\n"
        "import trainer_hooks.history as h\n"
        "assert 'pandas' not in sys.modules, 'pandas is imported lazily'\n"
        f"frame = h.fetch_metrics({server.url!r}, 'nb', project='nq')\n"
        "assert frame.shape == (7, 2), frame.shape\n"
        "bad = {'fastapi', 'sqlalchemy', 'dash', 'monitor', 'torch', 'starlette'} & set(sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_clear_error_without_pandas() -> None:
    code = (
        "import sys\n"
        "sys.modules['pandas'] = None  # as if not installed\n"
        "from trainer_hooks.history import fetch_metrics\n"
        "try:\n"
        "    fetch_metrics('http://127.0.0.1:9', 1)\n"
        "except ImportError as exc:\n"
        "    assert 'needs pandas: pip install pandas' in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('no ImportError')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_long_history_is_read_in_disjoint_pages(client: TestClient) -> None:
    """12,000 steps, three metrics of different density; pages of ~5,000 values must add up exactly."""
    n = 12_000
    rng = np.random.default_rng(0)
    dense = rng.normal(size=n)
    dense[rng.choice(n, 40, replace=False)] = NAN
    dense[[0, 1999, 2000, 5999, 11_999]] = [INF, -INF, NAN, INF, -INF]  # on and next to page edges
    columns = {
        "x/dense": dict(enumerate(dense.tolist())),
        "x/even": {s: float(s) for s in range(0, n, 2)},
        "x/late": {s: -float(s) for s in range(9_000, n, 7)},
    }
    run_id = client.post(f"{API_PREFIX}/runs", json={"name": "long"}).json()["id"]
    for lo in range(0, n, 3_000):  # bodies under the test server's 1 MiB limit
        chunk = {
            name: {s: v for s, v in pts.items() if lo <= s < lo + 3_000} for name, pts in columns.items()
        }
        body = {
            "batch_id": uuid.uuid4().hex,
            "steps": list(range(lo, lo + 3_000)),
            "metrics": {
                name: [_wire(pts.get(s)) for s in range(lo, lo + 3_000)] for name, pts in chunk.items()
            },
        }
        assert client.post(f"{API_PREFIX}/runs/{run_id}/metrics", json=body).status_code == 200

    pages: list[httpx.QueryParams] = []

    def forward(request: httpx.Request) -> httpx.Response:
        """Through the in-process app; the reply is rebuilt because this starlette's TestClient is
        built on httpx2, whose Response the httpx client cannot take back."""
        if request.url.path.endswith("/metrics"):
            pages.append(request.url.params)
        reply = client.request(request.method, str(request.url), headers=dict(request.headers))
        return httpx.Response(
            reply.status_code, content=reply.content, headers={"content-type": "application/json"}
        )

    via_app = httpx.MockTransport(forward)
    frame = fetch_metrics("http://testserver", run_id, page_points=5_000, transport=via_app)
    pd.testing.assert_frame_equal(frame, expected(columns))
    # 12,000 + 6,000 + 429 points over 12,000 steps: windows of 3,255 steps, disjoint and adjacent
    assert [(int(p["step_min"]), int(p["step_max"])) for p in pages] == [
        (0, 3254),
        (3255, 6509),
        (6510, 9764),
        (9765, 11_999),
    ]
    pages.clear()
    whole = fetch_metrics("http://testserver", run_id, metrics=["x/late"], transport=via_app)
    pd.testing.assert_frame_equal(whole, expected({"x/late": columns["x/late"]}))
    assert len(pages) == 1 and pages[0].get_list("names") == ["x/late"]

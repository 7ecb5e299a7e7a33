"""trainer_hooks.history.fetch_actions / fetch_action_summaries: action records and their per-step
quantiles as DataFrames over HTTP (the in-process app on SQLite and PostgreSQL), paged by steps
without skipping or repeating a record."""

from __future__ import annotations

import math
import uuid
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from contracts.wire import API_PREFIX
from trainer_hooks.history import RunNotFound, fetch_action_summaries, fetch_actions

NAN, INF = math.nan, math.inf
COLUMNS = [
    "step",
    "source",
    "traj_index",
    "action_index",
    "n_tokens",
    "delta",
    "old_logp_mean",
    "advantage",
    "reward",
    "is_answer",
]
FLOATS = ["delta", "old_logp_mean", "advantage", "reward"]


def _wire(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    return v


def step_records(step: int, n: int, source: str) -> pd.DataFrame:
    """`n` records of one step: float32-valued deltas with NaN/inf sprinkled in, advantage +-1."""
    rng = np.random.default_rng(step * 7 + len(source))
    delta = rng.normal(-0.01 * step, 0.2, n).astype(np.float32).astype(np.float64)
    delta[::17] = NAN
    delta[5::29] = INF
    delta[9::31] = -INF
    return pd.DataFrame(
        {
            "step": np.full(n, step, dtype=np.int64),
            "source": [source] * n,
            "traj_index": np.arange(n, dtype=np.int64) // 4,
            "action_index": np.arange(n, dtype=np.int64) % 4,
            "n_tokens": rng.integers(1, 200, n),
            "delta": delta,
            "old_logp_mean": rng.normal(-0.5, 0.1, n).astype(np.float32).astype(np.float64),
            "advantage": np.repeat(rng.choice([-1.0, 1.0], (n + 3) // 4), 4)[:n],
            "reward": np.where(np.arange(n) % 11 == 0, -INF, 1.0),
            "is_answer": np.arange(n) % 4 == 3,
        }
    )


def post(client: TestClient, run_id: int, frame: pd.DataFrame) -> None:
    body: dict[str, Any] = {"batch_id": uuid.uuid4().hex}
    for name in COLUMNS:
        values = frame[name].tolist()
        body[name] = [_wire(v) for v in values] if name in FLOATS else values
    reply = client.post(f"{API_PREFIX}/runs/{run_id}/actions", json=body)
    assert reply.status_code == 200, reply.text


def via(client: TestClient, calls: list[httpx.QueryParams] | None = None) -> httpx.MockTransport:
    """The in-process app as an httpx transport (the reply is rebuilt: this starlette's TestClient
    answers with another httpx's Response)."""

    def forward(request: httpx.Request) -> httpx.Response:
        if calls is not None and request.url.path.endswith("/actions"):
            calls.append(request.url.params)
        reply = client.request(request.method, str(request.url), headers=dict(request.headers))
        return httpx.Response(
            reply.status_code, content=reply.content, headers={"content-type": "application/json"}
        )

    return httpx.MockTransport(forward)


@pytest.fixture
def seeded(client: TestClient) -> tuple[int, pd.DataFrame]:
    """Steps 0-29 with 0-90 loss records each (none at 0, 4 and 5), probe records at some steps, steps
    split over batches of 400 records, and part of a step re-sent with other values."""
    run_id = client.post(f"{API_PREFIX}/runs", json={"name": "acts", "project": "nq"}).json()["id"]
    parts = [step_records(s, (s * 37) % 91, "loss") for s in range(30) if s not in (4, 5)]
    parts += [step_records(s, 13, "probe") for s in (3, 10, 29)]
    frame = pd.concat(parts, ignore_index=True)
    for lo in range(0, len(frame), 400):
        post(client, run_id, frame.iloc[lo : lo + 400])
    resent = step_records(12, 30, "loss").assign(delta=7.25)  # step 12 had 80 records: 30 re-sent
    post(client, run_id, resent)
    keys = ["step", "source", "traj_index", "action_index"]
    frame = pd.concat([frame, resent]).drop_duplicates(keys, keep="last")  # the later batch wins
    frame = frame.sort_values(keys, kind="stable").reset_index(drop=True)[COLUMNS]
    return run_id, frame.astype({"n_tokens": "int64", "is_answer": "bool"})


def assert_records(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert list(got.columns) == COLUMNS
    pd.testing.assert_frame_equal(
        got.reset_index(drop=True), want.reset_index(drop=True), check_dtype=False, check_exact=True
    )
    assert [str(t) for t in got.dtypes] == [
        "int64", "object", "int64", "int64", "int64", "float64", "float64", "float64", "float64", "bool",
    ]  # fmt: skip


def test_fetch_actions_pages_by_steps_without_gaps_or_repeats(
    client: TestClient, seeded: tuple[int, pd.DataFrame]
) -> None:
    run_id, want = seeded
    assert np.isposinf(want["delta"]).any() and np.isneginf(want["reward"]).any()
    # one record per page (a request per record): cursors inside a step and across sources, on a window
    ones = fetch_actions("http://testserver", "acts", project="nq", step_min=9, step_max=12, page_records=1,
                         transport=via(client))  # fmt: skip
    assert_records(ones, want[want["step"].between(9, 12)])
    assert ones["source"].nunique() == 2 and ones["step"].nunique() == 4
    for page_records in (37, 90, 91, 500, 200_000):
        calls: list[httpx.QueryParams] = []
        got = fetch_actions("http://testserver", "acts", project="nq", page_records=page_records,
                            transport=via(client, calls))  # fmt: skip
        assert_records(got, want)
        assert got.attrs["run_id"] == run_id
        assert all(int(c["limit"]) <= 200_000 for c in calls)
        if page_records == 500:  # pages start where the last whole step ended
            starts = [int(c.get("step_min", 0)) for c in calls]
            assert starts == sorted(starts) and len(calls) >= math.ceil(len(want) / 500)
    window = fetch_actions("http://testserver", run_id, step_min=3, step_max=10, source="loss",
                           page_records=40, transport=via(client))  # fmt: skip
    assert_records(window, want[want["step"].between(3, 10) & (want["source"] == "loss")])
    probe = fetch_actions("http://testserver", run_id, source="probe", page_records=5, transport=via(client))
    assert_records(probe, want[want["source"] == "probe"])
    empty = fetch_actions("http://testserver", run_id, step_min=4, step_max=5, transport=via(client))
    assert len(empty) == 0 and list(empty.columns) == COLUMNS and str(empty["delta"].dtype) == "float64"


def test_fetch_actions_errors(client: TestClient, seeded: tuple[int, pd.DataFrame]) -> None:
    with pytest.raises(RunNotFound, match="run 999 does not exist"):
        fetch_actions("http://testserver", 999, transport=via(client))
    with pytest.raises(RunNotFound, match="no run named 'absent'"):
        fetch_action_summaries("http://testserver", "absent", transport=via(client))
    with pytest.raises(ValueError, match="page_records"):
        fetch_actions("http://testserver", "acts", page_records=200_001, transport=via(client))
    with pytest.raises(ValueError, match="source"):
        fetch_actions("http://testserver", "acts", source="both", transport=via(client))


def test_fetch_action_summaries_match_the_records(
    client: TestClient, seeded: tuple[int, pd.DataFrame]
) -> None:
    run_id, want = seeded
    summary = fetch_action_summaries("http://testserver", "acts", project="nq", transport=via(client))
    assert summary.attrs["run_id"] == run_id
    levels = summary.attrs["levels"]
    names = [f"p{level * 100:g}" for level in levels]
    assert names == ["p10", "p25", "p50", "p75", "p90"]
    assert list(summary.columns) == [
        "step", "source", "pruned", "n_all", *(f"all_{n}" for n in names), "n_pos", *(f"pos_{n}" for n in names),
    ]  # fmt: skip
    blocks = want.groupby(["step", "source"], sort=True)
    assert list(zip(summary["step"], summary["source"], strict=True)) == list(blocks.groups)
    assert not summary["pruned"].any()
    for (step, source), records in blocks:
        row = summary[(summary["step"] == step) & (summary["source"] == source)].iloc[0]
        finite = records["delta"][np.isfinite(records["delta"])].to_numpy()
        pos = records["delta"][np.isfinite(records["delta"]) & (records["advantage"] > 0)].to_numpy()
        for group, values in (("all", finite), ("pos", pos)):
            assert row[f"n_{group}"] == values.size
            q = row[[f"{group}_{n}" for n in names]].to_numpy(np.float64)
            if values.size:
                np.testing.assert_allclose(q, np.quantile(values, levels), rtol=1e-12)
            else:
                assert np.isnan(q).all()
    loss = fetch_action_summaries("http://testserver", run_id, step_min=10, step_max=29, source="loss",
                                  transport=via(client))  # fmt: skip
    assert set(loss["source"]) == {"loss"} and loss["step"].min() >= 10 and loss["step"].max() <= 29

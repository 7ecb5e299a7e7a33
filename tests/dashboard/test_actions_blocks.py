"""The action-delta panel on per-step action blocks: the quantile bands come from the stored per-step
summaries (a 500-step window is never cut by a row budget and reads no raw record), steps pruned by
retention stay in the bands, and the histogram at a pruned step says why it is empty."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import plotly.graph_objects as go
import pytest
from fastapi.testclient import TestClient

from dashboard.callbacks.actions import action_figures
from dashboard.figures import PRUNED_TEXT, QUANTILES, delta_quantiles, summary_quantiles
from monitor.api.state import AppState
from monitor.domain import ActionColumns, ActionSummaries, Principal
from monitor.store.retention import prune_actions
from tests.monitor.api.helpers import new_run

OPEN = Principal()


def ingest(
    state: AppState, run_id: int, steps: range, per_step: int, source: str = "loss", shift: float = 0.0
) -> dict[str, Any]:
    """`per_step` records at each step (float32-valued deltas drifting down, advantage +-1); returns the
    columns sent."""
    rng = np.random.default_rng(steps.start * 31 + len(source))
    n = len(steps) * per_step
    step = np.repeat(np.asarray(steps, dtype=np.int64), per_step)
    delta = (rng.normal(-0.002 * step + shift, 0.3, n)).astype(np.float32).astype(np.float64)
    delta[::50] = np.nan
    columns = {
        "step": step.tolist(),
        "traj_index": (np.arange(n) % per_step // 4).tolist(),
        "action_index": (np.arange(n) % 4).tolist(),
        "n_tokens": rng.integers(1, 50, n).tolist(),
        "delta": [None if np.isnan(d) else d for d in delta.tolist()],
        "old_logp_mean": rng.normal(-0.5, 0.1, n).tolist(),
        "advantage": rng.choice([-1.0, 1.0], n).tolist(),
        "reward": [1.0] * n,
        "is_answer": (np.arange(n) % 4 == 3).tolist(),
        "source": [source] * n,
    }
    for lo in range(0, n, 20_000):
        part = {k: v[lo : lo + 20_000] for k, v in columns.items()}
        state.ingest.ingest_actions(OPEN, run_id, uuid.uuid4().hex, ActionColumns(**part))
    return columns


def positive_quantiles(columns: dict[str, Any], steps: list[int]) -> np.ndarray:
    """The A>0 delta quantiles per step, computed the obvious way from the records sent."""
    step = np.asarray(columns["step"])
    delta = np.asarray([np.nan if d is None else d for d in columns["delta"]], dtype=np.float64)
    keep = (np.asarray(columns["advantage"]) > 0) & np.isfinite(delta)
    return np.array([np.quantile(delta[keep & (step == s)], QUANTILES) for s in steps])


def bands(fig: dict[str, Any]) -> dict[str, list[Any]]:
    """Median, p10 and p90 traces of a quantile figure (validated by plotly)."""
    figure = go.Figure(fig)
    median = next(t for t in figure.data if t.name == "median")
    lows = {t.name: t for t in figure.data if t.name in ("p10-p90", "p25-p75")}
    highs = [t for t in figure.data if t.showlegend is False]
    return {
        "x": list(median.x),
        "p50": list(median.y),
        "p10": list(lows["p10-p90"].y),
        "p90": list(highs[0].y),
    }


def test_a_500_step_window_is_whole_and_reads_one_step_of_records(
    client: TestClient, state: AppState, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = new_run(client, "wide")
    sent = ingest(state, run_id, range(100, 600), 128)  # 64,000 records: the old row budget was 25,000
    reads: list[tuple[Any, ...]] = []
    actions = state.query.actions

    def counted(*args: Any) -> dict[str, list[Any]]:
        reads.append(args)
        return actions(*args)

    monkeypatch.setattr(state.query, "actions", counted)
    hist, quantiles = action_figures(state, OPEN, run_id, 599, 500, "all")
    got = bands(quantiles)
    assert got["x"] == list(range(100, 600))
    assert "row budget" not in quantiles["layout"]["meta"]["title"]
    want = positive_quantiles(sent, got["x"])
    np.testing.assert_allclose(got["p50"], want[:, 2], rtol=1e-12)
    np.testing.assert_allclose(got["p10"], want[:, 0], rtol=1e-12)
    np.testing.assert_allclose(got["p90"], want[:, 4], rtol=1e-12)
    assert [r[2:4] for r in reads] == [(599, 599)]  # only the histogram's step is decoded
    assert "step 599 (128 actions)" in go.Figure(hist).layout.meta["title"]
    # A smaller window ends at the chosen step; a step without records shows the last one before it.
    _, short = action_figures(state, OPEN, run_id, 650, 100, "loss")
    assert bands(short)["x"] == list(range(551, 600))
    hist, _ = action_figures(state, OPEN, run_id, 650, 100, "loss")
    assert "step 599" in hist["layout"]["meta"]["title"]


def test_pruned_steps_keep_their_bands_and_say_so_in_the_histogram(
    client: TestClient, state: AppState
) -> None:
    run_id = new_run(client, "pruned")
    old = ingest(state, run_id, range(0, 20), 40)
    with state.db.write() as conn:
        pruned = prune_actions(conn, datetime.now(timezone.utc) + timedelta(days=1), run_id)
    assert pruned.blocks == 20 and pruned.records == 800
    new = ingest(state, run_id, range(20, 30), 40)
    hist, quantiles = action_figures(state, OPEN, run_id, 29, 100, "all")
    got = bands(quantiles)
    assert got["x"] == list(range(30))  # pruned steps 0-19 included
    sent = {k: old[k] + new[k] for k in old}
    np.testing.assert_allclose(got["p50"], positive_quantiles(sent, got["x"])[:, 2], rtol=1e-12)
    assert "step 29 (40 actions)" in go.Figure(hist).layout.meta["title"]
    for step in (19, 5):  # pruned: the reason, not an empty plot or an earlier step
        hist, _ = action_figures(state, OPEN, run_id, step, 100, "all")
        figure = go.Figure(hist)
        assert figure.layout.annotations[0].text == PRUNED_TEXT
        assert f"at step {step}" in figure.layout.meta["title"]
    # A pruned step written again holds the new records only.
    again = ingest(state, run_id, range(19, 20), 12)
    hist, _ = action_figures(state, OPEN, run_id, 19, 100, "loss")
    assert "step 19 (12 actions)" in hist["layout"]["meta"]["title"]
    assert len(again["step"]) == 12


def test_source_all_shows_each_source_exactly(client: TestClient, state: AppState) -> None:
    run_id = new_run(client, "two-sources")
    loss = ingest(state, run_id, range(0, 10), 400, "loss")
    probe = ingest(state, run_id, range(5, 10), 100, "probe", shift=0.4)
    _, all_sources = action_figures(state, OPEN, run_id, 9, 100, "all")
    _, only_loss = action_figures(state, OPEN, run_id, 9, 100, "loss")
    _, only_probe = action_figures(state, OPEN, run_id, 9, 100, "probe")
    exact_loss, exact_probe = bands(only_loss), bands(only_probe)
    assert exact_loss["x"] == list(range(10)) and exact_probe["x"] == list(range(5, 10))
    np.testing.assert_allclose(exact_loss["p50"], positive_quantiles(loss, list(range(10)))[:, 2], rtol=1e-12)
    np.testing.assert_allclose(
        exact_probe["p50"], positive_quantiles(probe, list(range(5, 10)))[:, 2], rtol=1e-12
    )
    medians = {t.name: list(t.y) for t in go.Figure(all_sources).data if t.name and t.name.endswith("median")}
    assert medians == {"loss median": exact_loss["p50"], "probe median": exact_probe["p50"]}


def summaries(
    rows: list[tuple[int, str, int, list[float]]], pruned: list[bool] | None = None
) -> ActionSummaries:
    return ActionSummaries(
        steps=[r[0] for r in rows],
        sources=[r[1] for r in rows],
        levels=QUANTILES,
        n_all=[r[2] for r in rows],
        q_all=[r[3] for r in rows],
        n_pos=[r[2] for r in rows],
        q_pos=[r[3] for r in rows],
        pruned=pruned or [False] * len(rows),
    )


def test_summary_quantiles_match_the_raw_record_figure() -> None:
    rng = np.random.default_rng(3)
    columns = {"step": np.repeat([2, 5, 9], 200).tolist(), "delta": rng.normal(0, 1, 600).tolist()}
    columns["advantage"] = [1.0] * 600
    raw = bands(delta_quantiles(columns))
    per_step = [
        np.quantile(np.asarray(columns["delta"][i * 200 : (i + 1) * 200]), QUANTILES) for i in range(3)
    ]
    stored = summaries([(s, "loss", 200, q.tolist()) for s, q in zip([2, 5, 9], per_step, strict=True)])
    got = bands(summary_quantiles(stored))
    assert got["x"] == raw["x"] == [2, 5, 9]
    for name in ("p10", "p50", "p90"):
        np.testing.assert_allclose(got[name], raw[name], rtol=1e-12)
    nan = [float("nan")] * len(QUANTILES)
    empty = summaries([(3, "loss", 0, nan)])
    assert go.Figure(summary_quantiles(empty)).layout.annotations[0].name == "empty-state"
    gap = summaries([(3, "loss", 0, nan), (4, "probe", 5, [1.0, 2, 3, 4, 5])])
    assert bands(summary_quantiles(gap))["x"] == [4]
    # all records (not only A>0)
    assert bands(summary_quantiles(gap, positive_only=False))["x"] == [4]


def test_both_sources_get_their_own_bands() -> None:
    """Source "all": the probe's exact deltas and the loss's proxy are different quantities; each keeps
    its own stored quantiles instead of an invented pooled distribution."""
    stored = summaries([(2, "loss", 10, [-2.0, -1, 0, 1, 2]), (2, "probe", 4, [8.0, 9, 10, 11, 12])])
    figure = go.Figure(summary_quantiles(stored))
    medians = {t.name: list(t.y) for t in figure.data if t.name and t.name.endswith("median")}
    assert medians == {"loss median": [0.0], "probe median": [10.0]}
    lows = {t.name: list(t.y) for t in figure.data if t.name and t.name.endswith("p10-p90")}
    assert lows == {"loss p10-p90": [-2.0], "probe p10-p90": [8.0]}

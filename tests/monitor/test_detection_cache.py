"""The detector's window cache (`monitor.services.detection_cache`) changes no result: a run judged
batch by batch by a worker that keeps its windows gets exactly the phase events, alerts, directives
and saved detector state of the same run judged with no cache, also when a second worker on the same
database judges some of its batches in between (the first one's window is then stale and must not be
used), its overrides change, or a batch rewrites steps already judged. The pieces the cache joins
equal one read of the whole range. SQLite and PostgreSQL (the `settings` fixture)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
from sqlalchemy import insert, select

from contracts import metrics as M
from contracts.wire import encode_float
from lldmon_lab.scenarios import Scenario, collapse_scenario, healthy_scenario
from monitor.api.wire import decode_metrics
from monitor.bootstrap import Services, build_services
from monitor.db.engine import make_engine
from monitor.db.models import Project, Run, StepMetric
from monitor.detector import SeriesWindow
from monitor.domain import Principal
from monitor.services.detection_cache import CachedWindow, WindowCache, extend, from_step
from monitor.store import detection as detection_store

P = Principal()
CHUNK_POINTS = 16
"""Small chunks, so one batch is judged in several passes, each on the window the last one cached."""


class Recorder:
    """Counts a worker's cache look-ups: `hits`, and `stale` (an entry was there but no longer valid)."""

    def __init__(self, cache: WindowCache) -> None:
        self.hits = 0
        self.stale = 0
        valid = cache.valid

        def recording(
            run_id: int, state: dict[str, Any] | None, overrides: dict[str, Any], history_rev: int
        ) -> CachedWindow | None:
            had = run_id in cache
            entry = valid(run_id, state, overrides, history_rev)
            self.hits += entry is not None
            self.stale += had and entry is None
            return entry

        cache.valid = recording  # type: ignore[method-assign]


@pytest.fixture
def workers(settings: Any) -> Iterator[tuple[Services, Services, Services]]:
    """Two caching workers on one database, and a reference that never caches."""
    states = tuple(build_services(settings) for _ in range(3))
    states[2].detection.windows = WindowCache(capacity=0)
    for state in states:
        state.detection.chunk_points = CHUNK_POINTS
    yield states  # type: ignore[misc]
    for state in states:
        state.dispatcher.close()
        state.db.dispose()


def scenario(kind: str) -> Scenario:
    """A run whose metrics come and go: one logged every 7th step, one only in its first 30 steps (it
    leaves the window), NaN values logged in the reward; the collapse run longer than its window."""
    base = collapse_scenario(4) if kind == "collapse" else healthy_scenario(3, n_steps=330)
    n = base.steps.size
    values, present = dict(base.values), dict(base.present)
    steps = np.arange(n)
    values[M.KL_REF] = np.where(steps % 7 == 0, 0.01, np.nan)
    present[M.KL_REF] = steps % 7 == 0
    values[M.TURNS_MEAN] = np.full(n, 2.0)
    present[M.TURNS_MEAN] = steps < 30
    reward = values[M.REWARD_MEAN].copy()
    reward[[40, 41, 90]] = np.nan
    values[M.REWARD_MEAN] = reward
    return dataclasses.replace(base, values=values, present=present)


def batch_body(sc: Scenario, lo: int, hi: int, scale: float = 1.0) -> bytes:
    """Steps `lo` to `hi` (exclusive) of `sc` as a metrics batch on the wire, values times `scale`."""
    rows = range(lo, min(hi, sc.steps.size))
    metrics = {
        name: [encode_float(float(values[i]) * scale) if sc.present[name][i] else None for i in rows]
        for name, values in sc.values.items()
    }
    steps = [int(sc.steps[i]) for i in rows]
    return orjson.dumps({"batch_id": uuid.uuid4().hex, "steps": steps, "metrics": metrics})


def send(state: Services, run_id: int, body: bytes) -> None:
    batch_id, batch = decode_metrics(body)
    state.ingest.ingest_metrics(P, run_id, batch_id, batch)


def new_run(state: Services, name: str, overrides: dict[str, Any]) -> int:
    run, _ = state.runs.register(P, name, "cache", {}, [])
    state.runs.set_policy(P, run.id, "auto")
    state.detection.set_overrides(P, run.id, overrides)
    return run.id


def bounds(n: int, seed: int) -> list[tuple[int, int]]:
    """Batch boundaries over n steps: mostly 1-12 steps, one batch of 120 (several chunks)."""
    rng = np.random.default_rng(seed)
    out: list[tuple[int, int]] = []
    lo = 0
    while lo < n:
        size = 120 if len(out) == 5 else int(rng.integers(1, 13))
        out.append((lo, lo + size))
        lo += size
    return out


def outcome(state: Services, run_id: int) -> dict[str, Any]:
    """Everything detection leaves behind, without ids and clock times."""
    skip = {"id", "run_id", "created_at", "updated_at", "acknowledged_at", "resolved_at", "deliveries"}

    def plain(obj: Any) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(obj).items() if k not in skip}

    with state.db.read() as conn:
        stored = conn.execute(select(Run.detector_state, Run.phase).where(Run.id == run_id)).one()
    return {
        "phases": [plain(e) for e in state.query.phase_events(P, run_id)],
        "alerts": sorted(
            (plain(a) for a in state.alerts.list(P, run_id)), key=lambda a: (a["first_step"], a["kind"])
        ),
        "directives": [plain(d) for d in state.directives.history(P, run_id)],
        "state": stored.detector_state,
        "phase": stored.phase,
    }


@pytest.mark.parametrize(
    ("kind", "overrides"),
    [("collapse", {"history_steps": 90}), ("collapse", {}), ("healthy", {})],
    ids=["collapse-window-90", "collapse", "healthy-330-steps"],
)
def test_cached_windows_judge_exactly_as_full_reads(
    workers: tuple[Services, Services, Services], kind: str, overrides: dict[str, Any]
) -> None:
    worker, _, reference = workers
    recorder = Recorder(worker.detection.windows)
    sc = scenario(kind)
    cached_run = new_run(worker, "cached", overrides)
    reference_run = new_run(reference, "reference", overrides)
    for lo, hi in bounds(sc.steps.size, seed=len(kind)):
        body = batch_body(sc, lo, hi)
        send(worker, cached_run, body)
        send(reference, reference_run, body)
    expected = outcome(reference, reference_run)
    assert [e["phase"] for e in expected["phases"]]  # the run does change phase
    assert outcome(worker, cached_run) == expected
    assert recorder.hits >= sc.steps.size // 12 and recorder.stale == 0


def test_a_window_another_worker_made_stale_is_not_used(workers: tuple[Services, Services, Services]) -> None:
    """Workers a and b judge one run's batches in turns, b also changes its overrides: each time a
    comes back, its window is for a state b has since replaced, and a reads the whole window again."""
    a, b, reference = workers
    recorder = Recorder(a.detection.windows)
    sc = scenario("collapse")
    run_id = new_run(a, "shared", {"history_steps": 90})
    reference_run = new_run(reference, "reference", {"history_steps": 90})
    rng = np.random.default_rng(7)
    for i, (lo, hi) in enumerate(bounds(sc.steps.size, seed=3)):
        if i == 20:
            for state, run in ((b, run_id), (reference, reference_run)):
                state.detection.set_overrides(P, run, {"history_steps": 100})
        body = batch_body(sc, lo, hi)
        send(a if rng.random() < 0.6 else b, run_id, body)
        send(reference, reference_run, body)
    assert outcome(a, run_id) == outcome(reference, reference_run)
    assert recorder.stale >= 3 and recorder.hits >= 5


@pytest.mark.parametrize("rewriter", ["same", "next", "elsewhere"])
def test_a_batch_rewriting_judged_steps_is_read_again(
    workers: tuple[Services, Services, Services], rewriter: str
) -> None:
    """A resumed run re-logs judged steps with other values: the steps judged after it are judged on
    the new values, as a full read has them. The rewrite goes through the caching worker itself, or
    through the other worker, which then goes on judging the run ("next") or leaves the next steps to
    the caching worker ("elsewhere": its pass judged nothing new, so the stored state did not change and
    only the run's history count tells the caching worker that its window is stale)."""
    a, b, reference = workers
    second = a if rewriter == "same" else b
    then = a if rewriter == "elsewhere" else second
    sc = scenario("collapse")
    run_id = new_run(a, "resumed", {})
    reference_run = new_run(reference, "reference", {})
    plan = [(a, 0, 100, 1.0), (a, 100, 150, 1.0), (second, 120, 150, 0.5), (then, 150, 160, 1.0)]
    plan += [(a, lo, lo + 5, 1.0) for lo in range(160, sc.steps.size, 5)]
    for worker, lo, hi, scale in plan:
        body = batch_body(sc, lo, hi, scale)
        send(worker, run_id, body)
        send(reference, reference_run, body)
    assert outcome(a, run_id) == outcome(reference, reference_run)


def test_the_cache_keeps_the_most_recently_judged_runs() -> None:
    cache = WindowCache(capacity=2)
    window = SeriesWindow.from_columns([5, 6], {"loss": [1.0, 2.0]})
    for run_id in (1, 2):
        cache.put(run_id, CachedWindow(window, {"last_step": 6}, {}, 0))
    assert cache.valid(1, {"last_step": 6}, {}, 0) is not None  # 1 is now the most recently used
    cache.put(3, CachedWindow(window, {"last_step": 6}, {}, 0))
    assert (1 in cache, 2 in cache, 3 in cache) == (True, False, True)
    assert cache.valid(1, {"last_step": 6}, {"history_steps": 90}, 0) is None and 1 not in cache
    assert cache.valid(3, {"last_step": 6}, {}, 1) is None and 3 not in cache  # history rewritten
    off = WindowCache(capacity=0)
    off.put(1, CachedWindow(window, {}, {}, 0))
    assert len(off) == 0


def test_joined_pieces_equal_one_read_of_the_range(db_url: str) -> None:
    """`extend` of two adjacent reads, cut by `from_step`, is what one read gives: the same steps,
    metrics (one with no row left in the range is absent), values and presence masks."""
    engine = make_engine(db_url)
    rng = np.random.default_rng(11)
    rows = []
    for name, every, until in (("a", 1, 200), ("b", 3, 200), ("c", 7, 60), ("d", 1, 200), ("e", 5, 200)):
        for step in range(0, until, every):
            if name == "e" and step < 150:
                continue  # a metric that starts late
            value = None if rng.random() < 0.1 else float(rng.normal())
            rows.append({"run_id": 1, "name": name, "step": step, "value": value})
    with engine.begin() as conn:
        conn.execute(insert(Project), [{"id": 1, "name": "p"}])
        conn.execute(
            insert(Run),
            [{"id": 1, "project_id": 1, "name": "r", "config": {}, "status": "running"}],
        )
        conn.execute(insert(StepMetric), rows)
    names = ["a", "b", "c", "d", "e"]
    with engine.connect() as conn:
        for lo, mid, hi, cut in ((0, 40, 80, 30), (20, 100, 160, 70), (100, 150, 199, 120), (0, 198, 199, 0)):
            first = SeriesWindow(*detection_store.read_window(conn, 1, names, lo, mid))
            second = SeriesWindow(*detection_store.read_window(conn, 1, names, mid + 1, hi))
            joined = from_step(extend(first, second), cut)
            whole = SeriesWindow(*detection_store.read_window(conn, 1, names, cut, hi))
            np.testing.assert_array_equal(joined.steps, whole.steps)
            assert list(joined.values) == list(whole.values) and list(joined.present) == list(whole.present)
            for name in whole.values:
                np.testing.assert_array_equal(joined.values[name], whole.values[name])
                np.testing.assert_array_equal(joined.present[name], whole.present[name])
    engine.dispose()


def test_the_history_count_counts_batches_into_the_run_s_history(
    workers: tuple[Services, Services, Services],
) -> None:
    """`runs.history_rev` grows by one for each metrics batch whose first step is at or below the run's
    last step (steps re-logged, a step's metrics in a second batch), and not for a batch that only
    extends the run: the token that tells every worker its window may lack what such a batch wrote."""
    a, _, _ = workers
    sc = scenario("healthy")
    run_id = new_run(a, "counted", {})

    def count() -> int:
        with a.db.read() as conn:
            return int(conn.execute(select(Run.history_rev).where(Run.id == run_id)).scalar_one())

    counts = []
    for lo, hi in [(0, 10), (10, 20), (15, 25), (25, 26), (25, 26), (26, 40)]:
        send(a, run_id, batch_body(sc, lo, hi))
        counts.append(count())
    assert counts == [0, 0, 1, 1, 2, 2]

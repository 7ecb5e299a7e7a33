"""ImportService: a parsed log goes through ingest and the online detector into a run (SQLite and
PostgreSQL through the `settings` fixture)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from contracts import metrics as M
from lldmon_lab.scenarios import collapse_scenario
from monitor.detector import detect_offline
from monitor.domain import Principal
from monitor.errors import Conflict, InvalidInput
from monitor.importers import ParsedLog, load_verl_jsonl, to_columns
from monitor.services.importing import ImportService
from tests.monitor.importers.helpers import scenario_jsonl

P = Principal()


@pytest.fixture
def state(settings: Any) -> Iterator[Any]:
    from monitor.api.app import build_state

    app_state = build_state(settings)
    yield app_state
    app_state.dispatcher.close()
    app_state.db.dispose()


@pytest.fixture
def service(state: Any) -> ImportService:
    return ImportService(state.db, state.runs, state.ingest, state.query, state.alerts)


def stored(state: Any, run_id: int) -> dict[str, tuple[list[int], list[float]]]:
    return {s.name: (s.steps, s.values) for s in state.query.history(P, run_id, None)}


def losses(steps: range, value: float) -> ParsedLog:
    return to_columns({s: {M.LOSS: value, M.REWARD_MEAN: 0.5} for s in steps})


def test_import_runs_the_detector_as_online(tmp_path: Path, state: Any, service: ImportService) -> None:
    log = load_verl_jsonl(scenario_jsonl(tmp_path / "collapse.jsonl", collapse_scenario(3)))
    chunks: list[int] = []
    result = service.import_log(P, log, name="collapse", project="nq", chunk_steps=25, on_steps=chunks.append)
    assert result.created and result.run.status == "finished" and result.run.project == "nq"
    assert (result.steps, result.first_step, result.last_step, result.batches) == (209, 0, 208, 9)
    assert chunks == [25] * 8 + [9]

    # every logged value is stored, NaN as NaN
    series = stored(state, result.run.id)
    assert set(series) == set(log.values)
    assert sum(len(steps) for steps, _ in series.values()) == result.points == log.n_points
    for name, (steps, values) in series.items():
        mask = log.present[name]
        assert steps == log.steps[mask].tolist()
        np.testing.assert_array_equal(np.array(values), log.values[name][mask])

    # the same phases as the detector run offline over the parsed log
    offline = detect_offline(log.steps, log.values, present=log.present)
    expected = [(c.step, c.phase) for c in offline.phase_changes]
    assert [p for p in expected if p[1] == "collapse"]
    assert [(e.step, e.phase) for e in result.phases] == expected
    assert [(e.step, e.phase) for e in state.query.phase_events(P, result.run.id)] == expected
    assert result.run.phase == offline.phases[-1]
    kinds = {a.kind for a in result.alerts}
    assert {"lld_decay", "lld_collapse"} <= kinds <= offline.kinds()
    assert [a.id for a in result.alerts] == [a.id for a in state.alerts.list(P, result.run.id)]

    # another chunk size: the same phases
    again = service.import_log(P, log, name="collapse-64", project="nq", chunk_steps=64)
    assert [(e.step, e.phase) for e in again.phases] == expected


def test_nonfinite_values_are_stored_as_logged(state: Any, service: ImportService) -> None:
    log = to_columns(
        {0: {M.GRAD_NORM: 1.0, "ü/λ": 2.0}, 1: {M.GRAD_NORM: math.inf}, 2: {M.GRAD_NORM: math.nan}}
    )
    result = service.import_log(P, log, name="nonfinite")
    assert result.run.project == "default"
    series = stored(state, result.run.id)
    assert series[M.GRAD_NORM][0] == [0, 1, 2]
    assert series[M.GRAD_NORM][1][:2] == [1.0, math.inf] and math.isnan(series[M.GRAD_NORM][1][2])
    assert series["ü/λ"] == ([0], [2.0])


def test_existing_run_needs_append_or_replace(state: Any, service: ImportService) -> None:
    first = service.import_log(P, losses(range(10), 1.0), name="resumed", project="nq")
    run_id = first.run.id
    before = state.runs.get(P, run_id)

    with pytest.raises(
        Conflict, match=r"run 'resumed' of project 'nq' .* up to step 9: .*--append.*--replace"
    ):
        service.import_log(P, losses(range(5, 15), 2.0), name="resumed", project="nq")
    assert state.runs.get(P, run_id) == before  # refused before anything was touched
    assert stored(state, run_id)[M.LOSS] == (list(range(10)), [1.0] * 10)

    appended = service.import_log(P, losses(range(5, 15), 2.0), name="resumed", project="nq", mode="append")
    assert appended.run.id == run_id and not appended.created
    assert stored(state, run_id)[M.LOSS] == (list(range(15)), [1.0] * 5 + [2.0] * 10)
    assert appended.run.status == "finished" and appended.run.last_step == 14

    replaced = service.import_log(
        P, losses(range(100, 130), 3.0), name="resumed", project="nq", mode="replace"
    )
    assert replaced.run.id == run_id
    assert stored(state, run_id)[M.LOSS] == (list(range(100, 130)), [3.0] * 30)
    assert all(e.step >= 100 for e in state.query.phase_events(P, run_id))
    assert replaced.run.last_step == 129


def test_bad_requests(service: ImportService) -> None:
    with pytest.raises(InvalidInput, match="no metric values"):
        service.import_log(P, to_columns({}), name="empty")
    with pytest.raises(InvalidInput, match="chunk_steps"):
        service.import_log(P, losses(range(3), 1.0), name="x", chunk_steps=0)

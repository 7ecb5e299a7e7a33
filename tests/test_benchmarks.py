"""The benchmark scripts stay runnable: the streaming benchmarks' bodies are valid wire batches, and the
quick mode of `benchmarks.run_all` produces results whose correctness checks hold (speed is not checked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from benchmarks import mlflow_ingest, run_all
from benchmarks._workload import actions_json, make_runs, search_r1_actions
from contracts import metrics as M
from monitor.api.wire import decode_actions, decode_metrics

ROOT = Path(__file__).resolve().parents[1]
PG_URL = os.environ.get("LLDMON_TEST_DATABASE_URL")


def run_quick(out: Path, only: str, *, timeout: int) -> dict[str, Any]:
    """`run_all --quick --only ONLY` into `out`; its results.json (the run must succeed)."""
    argv = [sys.executable, "-m", "benchmarks.run_all", "--quick", "--only", only, "--out", str(out)]
    proc = subprocess.run(
        [*argv, "--pg-url", str(PG_URL)], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    return results


def test_simulated_batches_pass_the_service_decoder() -> None:
    run = make_runs(2, 90, actions=30)[0]
    assert set(run.values) == set(M.CANONICAL_METRICS)

    _, metrics = decode_metrics(run.metrics_body(range(80, 83)))
    assert len(metrics) == sum(run.metric_rows(s) for s in range(80, 83))
    assert set(metrics.steps) == {80, 81, 82}

    batch_id, actions = decode_actions(run.actions_body(7))
    assert len(actions) == 30
    assert set(actions.step) == {7}
    keys = list(zip(actions.traj_index, actions.action_index, strict=True))
    assert keys == sorted(set(keys))  # unique, in (trajectory, action) order
    assert batch_id != decode_actions(run.actions_body(7))[0]  # a fresh id per batch


def test_search_r1_actions_have_the_shape_the_hooks_send() -> None:
    cols = search_r1_actions(2560, seed=3)
    assert all(len(c) == 2560 for c in cols.values())
    traj, action = cols["traj_index"], cols["action_index"]
    n_traj = int(traj[-1]) + 1
    assert 3.5 <= 2560 / n_traj <= 4.5  # about 4 actions per trajectory
    assert np.array_equal(np.unique(traj), np.arange(n_traj))
    starts = np.flatnonzero(action == 0)
    assert np.array_equal(traj[starts], np.arange(n_traj))  # every trajectory starts at action 0
    assert np.array_equal(cols["is_answer"], np.append(action[1:] == 0, True))  # the last action answers
    for name in ("advantage", "reward"):  # constant within a trajectory
        per_traj = np.split(cols[name], starts[1:])
        assert all(np.all(p == p[0]) for p in per_traj)
    assert all(len(c) == 0 for c in search_r1_actions(0, seed=3).values())  # runs without actions
    for name in ("delta", "old_logp_mean", "advantage", "reward"):  # float32 values, sent as doubles
        column = cols[name]
        assert column.dtype == np.float64
        assert np.array_equal(column.astype(np.float32).astype(np.float64), column)
        body = orjson.dumps(actions_json(cols))
        assert orjson.loads(body)[name] == column.tolist()  # the JSON round trip is exact


def test_mlflow_baseline_says_why_it_is_unavailable(tmp_path: Path) -> None:
    reason = mlflow_ingest.unavailable(tmp_path / "no-venv")
    assert reason is not None
    assert "setup_mlflow_venv.sh" in reason


@pytest.mark.postgres
@pytest.mark.skipif(PG_URL is None, reason="needs LLDMON_TEST_DATABASE_URL (a PostgreSQL server)")
def test_quick_streaming_benchmarks(tmp_path: Path) -> None:
    out = tmp_path / "results"
    results = run_quick(out, "concurrent_runs,scale", timeout=240)
    assert results["machine"]["cpus"] == os.cpu_count()
    assert len(results["loadavg_before"]) == 3
    assert set(results["benchmarks"]) == {"concurrent_runs", "scale"}

    conc = results["benchmarks"]["concurrent_runs"]["summary"]
    steps, c = conc["steps"], conc["correctness"]
    runs, actions = conc["args"]["runs"], conc["args"]["actions"]
    assert steps["steps_acknowledged"] > 0
    assert steps["steps_failed"] == 0
    assert c["ok"]
    assert c["metric_rows_lost"] == c["metric_rows_unexpected"] == c["metric_values_wrong"] == 0
    assert c["metric_rows_stored"] == c["metric_rows_acknowledged"] == c["metric_rows_expected"]
    assert c["action_rows_stored"] == c["action_rows_acknowledged"] == steps["steps_acknowledged"] * actions
    assert c["ledger_batches"] == {
        "metrics": runs + steps["steps_acknowledged"],
        "actions": steps["steps_acknowledged"],
    }
    assert conc["detector_per_step"]["count"] == steps["steps_acknowledged"]

    scale = results["benchmarks"]["scale"]["summary"]
    assert [t["config"] for t in scale["trials"]] == ["single", "dual"]
    assert scale["correctness"] == {
        "rows_ok": True,
        "phases_identical": True,
        "phase_events_per_database": scale["correctness"]["phase_events_per_database"],
        "runs_with_phase_changes": scale["correctness"]["runs_with_phase_changes"],
        "ok": True,
    }
    assert scale["correctness"]["phase_events_per_database"] > 0
    w = scale["workload"]
    for trial in scale["trials"]:
        tc = trial["correctness"]
        assert tc["action_rows_stored"] == w["runs"] * w["streamed_steps_per_run"] * w["actions_per_step"]
        assert tc["metric_rows_stored"] == tc["metric_rows_expected"]
        assert tc["metric_rows_duplicated"] == tc["metric_rows_lost"] == 0

    table = (out / "results.md").read_text()
    assert "python -m benchmarks.concurrent_runs" in table
    assert "python -m benchmarks.scale" in table


@pytest.mark.postgres
@pytest.mark.skipif(PG_URL is None, reason="needs LLDMON_TEST_DATABASE_URL (a PostgreSQL server)")
def test_quick_history_and_importing_benchmarks(tmp_path: Path) -> None:
    out = tmp_path / "results"
    results = run_quick(out, "history,importing", timeout=120)
    assert set(results["benchmarks"]) == {"history", "importing"}

    history = results["benchmarks"]["history"]["summary"]
    assert history["points"] == history["steps"] * history["metrics"]
    assert set(history["median_ms"]) == {"runs_show", "export_csv", "export_parquet", "fetch_metrics"}
    assert all(v > 0 for v in history["median_ms"].values())
    assert set(history["file_mib"]) == {"csv", "parquet"}

    importing = results["benchmarks"]["importing"]["summary"]
    args, parse = importing["args"], importing["parse"]
    assert parse["steps"] == args["steps"]
    assert parse["seconds"] > 0
    assert set(importing["import"]) == {"sqlite", "postgresql"}
    for target in importing["import"].values():
        assert target["steps"] == args["import_steps"]
        assert target["values"] > 0
        assert target["steps_per_s"] > 0

    table = (out / "results.md").read_text()
    assert "python -m benchmarks.history" in table
    assert "python -m benchmarks.importing" in table
    assert "results not understood" not in table


@pytest.mark.postgres
@pytest.mark.skipif(PG_URL is None, reason="needs LLDMON_TEST_DATABASE_URL (a PostgreSQL server)")
def test_quick_actions_benchmark(tmp_path: Path) -> None:
    out = tmp_path / "actions.json"
    argv = [sys.executable, "-m", "benchmarks.actions", "--quick", "--no-mlflow", "--json", str(out)]
    proc = subprocess.run(
        [*argv, "--pg-url", str(PG_URL)], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    a, storage = result["args"], result["environment"]["storage"]
    assert storage in ("action_records", "action_blocks")
    assert len(result["environment"]["loadavg_start"]) == 3

    modes = result["ingest"]["modes"]
    assert set(modes) == {"api-pg", "copy", "api-sqlite"}
    for m in modes.values():
        assert m["failed_batches"] == 0
        assert m["records_acknowledged"] == a["rounds"] * a["steps"] * a["records"]
        assert m["values_per_s_median"] == pytest.approx(6 * m["records_per_s_median"], abs=6)
    assert result["ingest"]["ratios"]["api-pg/copy"] > 0
    assert result["mlflow"] == {"skipped": "--no-mlflow given"}

    # every record written is counted on disk: warm-up + timed steps + the read run
    written = (a["warmup"] + a["rounds"] * a["steps"] + a["read_steps"]) * a["records"]
    pg, sqlite = result["disk"]["postgresql"], result["disk"]["sqlite"]
    assert pg["service"]["table"] == sqlite["service"]["table"] == storage
    assert pg["service"]["records"] == sqlite["service"]["records"] == written
    assert pg["old_row_layout_copy"]["records"] == (a["warmup"] + a["rounds"] * a["steps"]) * a["records"]
    assert sqlite["old_row_layout"]["records"] == a["disk_steps"] * a["records"]
    for d in (*pg.values(), *sqlite.values()):
        assert d["bytes_per_record"] > 0

    for backend in ("postgresql", "sqlite"):
        r = result["read"][backend]
        assert r["one_step_http"]["records"] == a["records"]
        assert r["full_read_quantiles"]["steps_covered"] == a["read_steps"]
        if "summaries" in r:
            assert r["summaries"]["steps_covered"] == a["read_steps"]
    assert [t["name"] for t in result["targets"]][-1] == "PostgreSQL bytes per action record"
    assert "| ingest ratio api-pg/copy |" in proc.stdout  # the README rows

    row = run_all.figures("actions", {"summary": result, "status": "ok", "log": ""})
    assert "x raw row COPY" in row
    assert "results not understood" not in row

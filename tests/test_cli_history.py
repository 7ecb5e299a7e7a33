"""`lldmon runs show` and `lldmon export` on SQLite and PostgreSQL: what is printed and written."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from contracts import metrics as M
from monitor.alerting.rules import ActiveCondition
from monitor.api.app import build_state
from monitor.api.schemas import DirectiveOut
from monitor.cli import app
from monitor.config import Settings
from monitor.detector.findings import LLD_DECAY
from monitor.domain import MetricsColumns, Principal
from monitor.store import alerts as alert_store
from monitor.store import detection as detection_store
from monitor.store import events as event_store
from monitor.store import ingest as ingest_store
from monitor.store import runs as run_store

runner = CliRunner()
NAN, INF = math.nan, math.inf

# step -> value; a step that is absent was not logged. grad/norm carries every non-finite value.
SERIES: dict[str, dict[int, float]] = {
    M.REWARD_MEAN: {0: 0.5, 1: 0.55, 2: 0.6, 3: 0.62, 4: 0.61, 5: 0.3},
    M.GRAD_NORM: {0: 1.25, 1: NAN, 2: INF, 4: -INF, 5: NAN},
    M.LOGP_POS: {0: -0.41, 2: -0.47, 5: -1.5},
    "custom/x,y": {3: 1e-12},  # a name that needs CSV quoting
}
STEPS = [0, 1, 2, 3, 4, 5]


def _ingest(state: Any, run_id: int, series: dict[str, dict[int, float]]) -> None:
    rows = [(step, name, v) for name, points in series.items() for step, v in points.items()]
    with state.db.write() as conn:
        ingest_store.write_metrics(
            conn,
            run_id,
            MetricsColumns(
                steps=[r[0] for r in rows],
                names=[r[1] for r in rows],
                values=[None if math.isnan(r[2]) else r[2] for r in rows],  # NULL is NaN in storage
            ),
        )
        run_store.touch_run(conn, run_id, max(r[0] for r in rows))


@pytest.fixture
def seeded(db_url: str, tmp_path: Path) -> dict[str, Any]:
    """Run `grpo-3b` of project nq with metrics, two phase changes, an acked alert and two directives;
    plus a namesake run in project hotpot."""
    state = build_state(Settings(database_url=db_url, data_dir=tmp_path))
    run, _ = state.runs.register(Principal(), "grpo-3b", "nq", {"lr": 1e-6}, ["grpo"])
    other, _ = state.runs.register(Principal(), "grpo-3b", "hotpot", {}, [])
    _ingest(state, run.id, SERIES)
    _ingest(state, other.id, {M.REWARD_MEAN: {0: 0.1}})
    now = datetime.now(timezone.utc)
    with state.db.write() as conn:
        event_store.insert_phase_event(conn, run.id, 1, "healthy", "warmup", {"why": "reward up"})
        event_store.insert_phase_event(conn, run.id, 4, "decay", "healthy", {"slope": -0.02})
        detection_store.save_state(conn, run.id, {}, "decay")
        alert_id = alert_store.create(
            conn, run.id, ActiveCondition(LLD_DECAY, "warning", 4, "logp_pos sliding", {}), now
        )
    state.alerts.acknowledge(Principal(), run.id, alert_id)
    state.directives.set_manual(Principal(), run.id, llds_enabled=True, lam=0.2, reason="decay at 4")
    state.directives.set_manual(Principal(), run.id, llds_enabled=False, lam=0.3, reason="recovered")
    state.db.dispose()
    return {"url": db_url, "run_id": run.id, "other_id": other.id, "alert_id": alert_id}


def cli(seeded: dict[str, Any], *args: str) -> Any:
    return runner.invoke(app, [*args, "--database-url", seeded["url"]], env={"COLUMNS": "200"})


def table(output: str, title: str) -> list[list[str]]:
    """The body rows (as stripped cells) of the rich table printed under `title`."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("└"))
    header_end = next(i for i in range(start, end) if lines[i].startswith("┡"))
    return [[c.strip() for c in line.split("│")[1:-1]] for line in lines[header_end + 1 : end]]


def test_runs_show_prints_the_summary(seeded: dict[str, Any]) -> None:
    result = cli(seeded, "runs", "show", "grpo-3b", "--project", "nq")
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"run {seeded['run_id']}  nq / grpo-3b  status running, phase decay, policy alert" in out
    assert "6 steps logged (steps 0-5), 4 metrics" in out
    assert table(out, "Last values") == [  # key metrics in canonical order, NaN/inf spelled out
        [M.REWARD_MEAN, "0.3", "5"],
        [M.LOGP_POS, "-1.5", "5"],
        [M.GRAD_NORM, "NaN", "5"],
    ]
    assert "1 more metric: --json" in out  # custom/x,y is not a key metric
    assert [r[:3] for r in table(out, "Phases")] == [["healthy", "1", "warmup"], ["decay", "4", "healthy"]]
    [alert] = table(out, "Alerts")
    assert alert[:5] == [str(seeded["alert_id"]), LLD_DECAY, "warning", "4-4", "acknowledged"]
    assert alert[5].startswith("20") and alert[6] == "logp_pos sliding"  # acked at <time>
    assert [[r[0], *r[2:]] for r in table(out, "Directives")] == [
        ["1", "5", "manual", "on", "0.2", "decay at 4"],
        ["2", "5", "manual", "off", "0.3", "recovered"],
    ]


def test_runs_show_json(seeded: dict[str, Any]) -> None:
    result = cli(seeded, "runs", "show", str(seeded["run_id"]), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)  # strict JSON: no bare NaN tokens
    assert (data["id"], data["name"], data["project"], data["status"], data["phase"]) == (
        seeded["run_id"],
        "grpo-3b",
        "nq",
        "running",
        "decay",
    )
    assert data["config"] == {"lr": 1e-6} and data["tags"] == ["grpo"] and data["finished_at"] is None
    assert data["steps"] == {"count": 6, "first": 0, "last": 5}
    assert data["metrics"][M.GRAD_NORM] == {"last_step": 5, "last_value": "NaN", "first_step": 0, "points": 5}
    assert data["metrics"]["custom/x,y"] == {
        "last_step": 3,
        "last_value": 1e-12,
        "first_step": 3,
        "points": 1,
    }
    assert sorted(data["metrics"]) == sorted(SERIES)
    assert [(p["phase"], p["step"], p["previous_phase"]) for p in data["phases"]] == [
        ("healthy", 1, "warmup"),
        ("decay", 4, "healthy"),
    ]
    assert data["phases"][1]["evidence"] == {"slope": -0.02}
    [alert] = data["alerts"]
    assert (alert["id"], alert["kind"], alert["severity"], alert["status"], alert["acknowledged"]) == (
        seeded["alert_id"],
        LLD_DECAY,
        "warning",
        "acknowledged",
        True,
    )
    assert (alert["first_step"], alert["last_step"], alert["resolved_at"]) == (4, 4, None)
    assert [(d["version"], d["llds"], d["source"], d["reason"], d["step"]) for d in data["directives"]] == [
        (1, {"enabled": True, "lam": 0.2}, "manual", "decay at 4", 5),
        (2, {"enabled": False, "lam": 0.3}, "manual", "recovered", 5),
    ]
    assert data["directive"]["version"] == 2
    assert datetime.fromisoformat(data["directives"][0]["updated_at"]).year >= 2024
    # a directive reads as the API shows it (GET /directive, `lldmon directive --json`)
    assert all(set(d) == set(DirectiveOut.model_fields) for d in [data["directive"], *data["directives"]])


def test_runs_show_errors(seeded: dict[str, Any]) -> None:
    ambiguous = cli(seeded, "runs", "show", "grpo-3b")
    assert ambiguous.exit_code == 1
    assert "2 runs are named 'grpo-3b' (projects: hotpot, nq); pass --project" in ambiguous.output
    other = cli(seeded, "runs", "show", "grpo-3b", "--project", "hotpot", "--json")
    assert json.loads(other.output)["id"] == seeded["other_id"]
    quiet = cli(seeded, "runs", "show", str(seeded["other_id"])).output
    assert "1 step logged (steps 0-0), 1 metric" in quiet and table(quiet, "Last values") == [
        [M.REWARD_MEAN, "0.1", "0"]
    ]
    assert "no phase changes yet" in quiet and "no alerts" in quiet
    assert "directive: default (LLDS off, lambda 0.2)" in quiet
    unknown = cli(seeded, "runs", "show", "nope")
    assert unknown.exit_code == 1 and "no run is named 'nope'" in unknown.output
    missing = cli(seeded, "runs", "show", "999")
    assert missing.exit_code == 1 and "run 999 does not exist" in missing.output


def assert_matches(got: pd.DataFrame, names: list[str]) -> None:
    """`got` (read with dtype_backend="pyarrow") holds exactly SERIES: null where a metric was not
    logged, and NaN, +inf, -inf and every float where it was."""
    assert list(got.columns) == ["step", *names]
    assert got["step"].tolist() == STEPS
    for name in names:
        assert (~got[name].isna()).tolist() == [s in SERIES[name] for s in STEPS], name
        values = got[name].to_numpy(dtype=np.float64, na_value=np.nan)
        expected = np.array([SERIES[name].get(s, NAN) for s in STEPS])
        assert np.array_equal(values, expected, equal_nan=True), (name, values)


@pytest.fixture
def outdir(tmp_path: Path) -> Path:
    (tmp_path / "out").mkdir()
    return tmp_path / "out"


def test_export_csv_round_trip(seeded: dict[str, Any], outdir: Path) -> None:
    out = outdir / "run.csv"
    result = cli(seeded, "export", "grpo-3b", "--project", "nq", "--format", "csv", "--output", str(out))
    assert result.exit_code == 0, result.output
    assert "4 metrics" in result.output and "6 steps" in result.output
    lines = out.read_text().splitlines()
    assert lines[0] == 'step,"custom/x,y",grad/norm,lld/logp_pos,reward/mean'
    assert lines[2] == "1,,nan,,0.55" and lines[3] == "2,,inf,-0.47,0.6" and lines[5] == "4,,-inf,,0.61"
    got = pd.read_csv(out, engine="pyarrow", dtype_backend="pyarrow", keep_default_na=False, na_values=[""])
    assert_matches(got, sorted(SERIES))
    plain = pd.read_csv(out)[M.GRAD_NORM].to_numpy()  # the everyday read: missing and NaN both NaN
    assert plain.dtype == np.float64 and np.array_equal(
        plain, [1.25, NAN, INF, NAN, -INF, NAN], equal_nan=True
    )


def test_export_parquet_round_trip_and_metric_selection(seeded: dict[str, Any], outdir: Path) -> None:
    out = outdir / "run.parquet"  # format from the suffix
    picked = f"{M.GRAD_NORM},{M.REWARD_MEAN}"
    result = cli(seeded, "export", str(seeded["run_id"]), "-o", str(out), "-m", picked, "-m", M.LOGP_POS)
    assert result.exit_code == 0, result.output
    got = pd.read_parquet(out, dtype_backend="pyarrow")
    assert_matches(got, [M.GRAD_NORM, M.REWARD_MEAN, M.LOGP_POS])
    schema = pq.read_schema(out)
    assert str(schema.field("step").type) == "int64" and str(schema.field(M.GRAD_NORM).type) == "double"
    assert json.loads(schema.metadata[b"lldmon"]) == {
        "run_id": seeded["run_id"],
        "run": "grpo-3b",
        "project": "nq",
    }
    everything = outdir / "all.parquet"
    assert cli(seeded, "export", str(seeded["run_id"]), "-f", "parquet", "-o", str(everything)).exit_code == 0
    assert_matches(pd.read_parquet(everything, dtype_backend="pyarrow"), sorted(SERIES))


def test_export_csv_to_stdout(seeded: dict[str, Any]) -> None:
    result = cli(seeded, "export", str(seeded["run_id"]), "-o", "-", "-m", M.LOGP_POS)
    assert result.exit_code == 0, result.output
    assert result.output == "step,lld/logp_pos\n0,-0.41\n2,-0.47\n5,-1.5\n"


def test_export_errors_leave_no_file(
    seeded: dict[str, Any], outdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = str(seeded["run_id"])
    target = outdir / "out.csv"
    unknown = cli(seeded, "export", run, "-o", str(target), "-m", f"{M.REWARD_MEAN},nope/x")
    assert unknown.exit_code == 1 and f"run {run} has no metric 'nope/x'" in unknown.output
    nowhere = outdir / "missing-dir" / "out.csv"
    unwritable = cli(seeded, "export", run, "-o", str(nowhere))
    assert unwritable.exit_code == 1 and "cannot write" in unwritable.output
    bad_format = cli(seeded, "export", run, "-f", "xlsx", "-o", str(target))
    assert bad_format.exit_code == 2 and "--format must be csv or parquet" in bad_format.output
    assert list(outdir.iterdir()) == []

    # A failure half-way through the write: the old file survives and no temporary file is left.
    old = outdir / "out.parquet"
    old.write_bytes(b"previous export")

    def fail_midway(table: Any, where: Any, **kwargs: Any) -> None:
        where.write(b"PAR1 half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", fail_midway)
    full = cli(seeded, "export", run, "-o", str(old))
    assert full.exit_code == 1 and "No space left on device" in full.output
    assert old.read_bytes() == b"previous export"
    assert [p.name for p in outdir.iterdir()] == ["out.parquet"]


def test_summary_json_is_strict_even_for_non_finite_evidence() -> None:
    from monitor.domain import DirectiveInfo, PhaseEventInfo, RunInfo, RunSummary
    from monitor.run_report import summary_json

    now = datetime.now(timezone.utc)
    run = RunInfo(1, "p", 1, "r", {"lr": INF}, [], "running", "alert", "decay", 3, now, now, None)
    event = PhaseEventInfo(1, 1, 3, "decay", "healthy", {"baseline": NAN, "window": [1.0, -INF]}, now)
    summary = RunSummary(run, 0, None, None, [], [event], [], [], DirectiveInfo())
    data = json.loads(json.dumps(summary_json(summary), allow_nan=False))
    assert data["config"] == {"lr": "Infinity"}
    assert data["phases"][0]["evidence"] == {"baseline": "NaN", "window": [1.0, "-Infinity"]}
    assert data["steps"] == {"count": 0, "first": None, "last": None} and data["directives"] == []

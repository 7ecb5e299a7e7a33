"""Issue 16 #17: lldmon could not re-import its own export (CSV refused for lacking `_step`, Parquet
"cannot tell the format"). `lldmon export` then `lldmon import` with the format found by `auto` gives
back the same series: names, steps, NaN / +-inf and "not logged" (SQLite and PostgreSQL via `db_url`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from contracts import metrics as M
from monitor.api.app import build_state
from monitor.cli import app
from monitor.config import Settings
from monitor.domain import MetricsColumns, Principal
from monitor.importers import detect_format, load_log
from monitor.store import ingest as ingest_store
from monitor.store import runs as run_store

runner = CliRunner()
NAN, INF = math.nan, math.inf

# step -> value (an absent step was not logged); the extremes of float64 and of the step range.
CANONICAL: dict[str, dict[int, float]] = {
    M.REWARD_MEAN: {0: 0.5, 1: 0.1 + 0.2, 2: 1e-300, 7: 0.61, 2**62: 0.3},
    M.GRAD_NORM: {0: 1.25, 1: NAN, 2: INF, 7: -INF, 2**62: 1.7976931348623157e308},
    M.LOGP_POS: {0: -0.41, 2: -5e-324},
    'custom/x,y "quoted"': {1: 1e-12},  # a name that needs CSV quoting
    "tools/call_frequency": {7: 2.0},
}
TRAINER_KEYS: dict[str, dict[int, float]] = {
    # names the trainer vocabulary would rename, merge or drop: the lldmon format keeps them as they are
    "critic/score/mean": {0: 0.9, 1: 0.8},
    "lldmon/adv_pos_mass": {7: 2.0},
    "actor/entropy": {0: 2.5},
    "_private": {1: 3.0},
}


def _seed(db_url: str, tmp_path: Path, series: dict[str, dict[int, float]]) -> int:
    state = build_state(Settings(database_url=db_url, data_dir=tmp_path))
    try:
        run, _ = state.runs.register(Principal(), "source", "nq", {}, [])
        rows = [(step, name, v) for name, points in series.items() for step, v in points.items()]
        with state.db.write() as conn:
            ingest_store.write_metrics(
                conn,
                run.id,
                MetricsColumns(
                    steps=[r[0] for r in rows],
                    names=[r[1] for r in rows],
                    values=[None if math.isnan(r[2]) else r[2] for r in rows],
                ),
            )
            run_store.touch_run(conn, run.id, max(r[0] for r in rows))
        return int(run.id)
    finally:
        state.db.dispose()


def _stored(db_url: str, tmp_path: Path, run: str) -> dict[str, list[tuple[int, Any]]]:
    """name -> [(step, value)] with NaN as the string 'nan' (so == compares it)."""
    state = build_state(Settings(database_url=db_url, data_dir=tmp_path))
    try:
        [info] = [r for r in state.runs.list(Principal(), _filter(run))]
        history = state.query.history(Principal(), info.id, None)
    finally:
        state.db.dispose()
    return {
        s.name: [(step, "nan" if math.isnan(v) else v) for step, v in zip(s.steps, s.values, strict=True)]
        for s in history
    }


def _filter(name: str) -> Any:
    from monitor.domain import RunFilter

    return RunFilter(name=name)


def _cli(db_url: str, *args: str) -> str:
    result = runner.invoke(app, [*args, "--database-url", db_url], env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_export_reimports_with_the_same_values(db_url: str, tmp_path: Path, suffix: str) -> None:
    run_id = _seed(db_url, tmp_path, CANONICAL)
    out = tmp_path / f"run.{suffix}"
    _cli(db_url, "export", str(run_id), "-o", str(out))
    output = _cli(db_url, "import", str(out), "--run", "copy")  # --format auto
    assert "'copy'" in output and "warning" not in output, output
    original = _stored(db_url, tmp_path, "source")
    assert _stored(db_url, tmp_path, "copy") == original
    assert original[M.GRAD_NORM] == [
        (0, 1.25),
        (1, "nan"),
        (2, INF),
        (7, -INF),
        (2**62, 1.7976931348623157e308),
    ]


@pytest.mark.parametrize(("suffix", "fmt"), [("parquet", "auto"), ("csv", "lldmon")])
def test_lldmon_format_keeps_every_name(db_url: str, tmp_path: Path, suffix: str, fmt: str) -> None:
    """The export's names are stored names: the lldmon format takes them as they are, where the generic
    CSV importer would map trainer keys (critic/score/mean -> reward/mean) and drop `_` columns."""
    run_id = _seed(db_url, tmp_path, {**CANONICAL, **TRAINER_KEYS})
    out = tmp_path / f"run.{suffix}"
    _cli(db_url, "export", str(run_id), "-o", str(out))
    assert detect_format(out) == ("lldmon" if suffix == "parquet" else "csv")
    _cli(db_url, "import", str(out), "--run", "copy", "--format", fmt)
    assert _stored(db_url, tmp_path, "copy") == _stored(db_url, tmp_path, "source")


def test_parquet_written_by_others(tmp_path: Path) -> None:
    """pandas-style Parquet: float steps, nulls, a step logged twice (the later row wins), a text column
    and a row without a step are reported, not fatal; a file without a step column is refused."""
    table = pa.table(
        {
            "step": pa.array([0.0, 1.0, 1.0, None, 2.5, 3.0]),
            "loss": pa.array([1.0, None, 0.5, 9.0, 9.0, float("nan")]),
            "note": pa.array(["a", "b", "c", "d", "e", "f"]),
        }
    )
    path = tmp_path / "other.pq"
    pq.write_table(table, path)
    log = load_log([path])
    assert log.steps.tolist() == [0, 1, 3]
    assert log.present["loss"].tolist() == [True, True, True]
    assert log.values["loss"][:2].tolist() == [1.0, 0.5] and math.isnan(log.values["loss"][2])
    reasons = [d.reason for d in log.diagnostics]
    assert any("note" in r and "not numeric" in r for r in reasons)
    assert [d.line for d in log.diagnostics if "step is not" in d.reason] == [4, 5]

    pq.write_table(pa.table({"x": [1.0]}), tmp_path / "nostep.parquet")
    with pytest.raises(ValueError, match="no 'step' column"):
        load_log([tmp_path / "nostep.parquet"])

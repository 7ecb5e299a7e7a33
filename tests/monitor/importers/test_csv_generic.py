"""Generic CSV with a step column (`--format csv`: TensorBoard exports, custom loggers) -> canonical columns."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from contracts import metrics as M
from monitor.importers import LogImportError, MalformedLog, detect_format, load_csv, load_log
from monitor.importers.csv_table import STEP_COLUMNS
from tests.monitor.importers.helpers import REAL, needs_real

BOERZ = [REAL / f"boerz_alfworld_grpo7b_3seeds/run_{seed}_telemetry.csv" for seed in "abc"]


def write_csv(path: Path, rows: Sequence[Sequence[object]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows(rows)
    return path


@pytest.mark.parametrize("step_column", STEP_COLUMNS)
def test_each_step_column_alias(tmp_path: Path, step_column: str) -> None:
    path = write_csv(
        tmp_path / "export.csv",
        [[step_column, "actor/grad_norm", "my/metric"], [3, 1.5, 0.1], [4, 1.25, 0.2]],
    )
    log = load_log([path], "csv")
    assert log.steps.tolist() == [3, 4] and log.diagnostics == ()
    assert log.values[M.GRAD_NORM].tolist() == [1.5, 1.25]  # mapped through the contract
    assert log.values["my/metric"].tolist() == [0.1, 0.2]  # unknown: its own name
    assert step_column not in log.values


def test_first_step_column_in_order_wins_and_other_counters_are_not_metrics(tmp_path: Path) -> None:
    path = write_csv(
        tmp_path / "export.csv",
        [["iteration", "global_step", "step", "_runtime", "", "loss"], [0, 10, 100, 1.0, 0, 0.5]],
    )
    log = load_csv(path)
    assert log.steps.tolist() == [100]  # "step" comes first in STEP_COLUMNS
    assert set(log.values) == {M.LOSS}  # other step columns, _bookkeeping and unnamed columns dropped


def test_no_step_column_names_the_columns_seen(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "export.csv", [["Wall time", "Step", "Value"], [1.7e9, 1, 0.5]])
    with pytest.raises(LogImportError, match=r"no step column \(one of step, _step, global_step") as err:
        load_log([path], "auto")
    assert "columns: ['Wall time', 'Step', 'Value']" in str(err.value)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(LogImportError, match=r"empty file, expected a header with a step column"):
        load_csv(empty)


def test_nan_and_inf_are_data_and_empty_cells_are_not_logged(tmp_path: Path) -> None:
    path = write_csv(
        tmp_path / "export.csv",
        [
            ["step", "actor/entropy", "critic/score/mean", "loss"],
            [0, 0.5, 0.1, ""],
            [1, "nan", "inf", "-inf"],
            [2, "", "NaN", "Infinity"],
            [3, "", "", ""],  # nothing logged: no step
        ],
    )
    log = load_csv(path)
    assert log.steps.tolist() == [0, 1, 2] and log.diagnostics == ()
    assert log.present[M.ENTROPY_MEAN].tolist() == [True, True, False]
    assert log.present[M.LOSS].tolist() == [False, True, True]
    assert math.isnan(log.values[M.ENTROPY_MEAN][1])
    assert log.values[M.REWARD_MEAN][1] == math.inf and math.isnan(log.values[M.REWARD_MEAN][2])
    assert log.values[M.LOSS][1:].tolist() == [-math.inf, math.inf]


def test_duplicate_steps_merge_later_row_wins_and_later_file_wins(tmp_path: Path) -> None:
    path = write_csv(
        tmp_path / "a.csv",
        [["step", "loss", "reward_extra"], [0, 1.0, ""], [1, 1.0, 5.0], [1, 2.0, ""], [2, 1.0, ""]],
    )
    log = load_csv(path)
    assert log.values[M.LOSS].tolist() == [1.0, 2.0, 1.0]  # the later row wins for the key it logs
    assert log.values["reward_extra"][1] == 5.0  # and the step keeps what only the earlier row logged
    resumed = write_csv(tmp_path / "b.csv", [["step", "loss"], [2, 3.0], [3, 3.0]])
    assert load_csv([path, resumed]).values[M.LOSS].tolist() == [1.0, 2.0, 3.0, 3.0]


def test_malformed_rows_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "export.csv"
    path.write_text("step,loss\n0,0.5\nx,0.4\n2,abc\n3\n4,0.3\n", encoding="utf-8")
    log = load_csv(path)
    assert log.steps.tolist() == [0, 4]
    assert [str(d).split(": ", 1)[1] for d in log.diagnostics] == [
        "step is not a non-negative integer: 'x'",
        "step 2: loss is not a number: 'abc'",
        "1 cells, the header has 2 (truncated row?)",
    ]
    with pytest.raises(MalformedLog, match=r"export\.csv:3: step is not"):
        load_csv(path, strict=True)


@needs_real
def test_boerz_tensorboard_exports() -> None:
    for path in BOERZ:
        assert detect_format(path) == "csv"
        log = load_log([path])
        assert log.diagnostics == ()
        assert log.steps.tolist() == list(range(151))  # step 0 holds validation only
        for name in (M.REWARD_MEAN, M.ENTROPY_MEAN, M.GRAD_NORM, M.KL_REF, M.RESPONSE_LENGTH_MEAN):
            assert log.present[name][1:].all() and not log.present[name][0], (path.name, name)
        assert log.present["val/success_rate"][0]
        assert "episode/success_rate" in log.values and "actor/pg_loss" in log.values
    run_c = load_log([BOERZ[2]])
    assert 1.8 < float(max(run_c.values[M.ENTROPY_MEAN][1:])) < 1.95  # the late entropy drift (PROVENANCE)


def test_lldmon_import_format_csv(tmp_path: Path, db_url: str) -> None:
    from typer.testing import CliRunner

    from monitor.cli import app

    path = write_csv(
        tmp_path / "tb_export.txt",
        [["global_step", "actor/grad_norm", "critic/score/mean"], *[[s, 1.0, 0.5] for s in range(12)]],
    )
    args = ["import", str(path), "--run", "tb", "--database-url", db_url]
    result = CliRunner().invoke(app, [*args, "--format", "csv"], env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    assert "imported 12 steps (0-11), 24 values of 2 metrics from 1 csv file(s)" in result.output
    bad = write_csv(tmp_path / "bad.csv", [["time", "loss"], [0, 1.0]])
    refused = CliRunner().invoke(
        app, ["import", str(bad), "--run", "x", "--database-url", db_url], env={"COLUMNS": "240"}
    )
    assert (
        refused.exit_code == 2 and "no step column" in refused.output and "'time', 'loss'" in refused.output
    )

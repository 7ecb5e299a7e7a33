"""W&B history CSV exports -> canonical metric columns."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from contracts import metrics as M
from monitor.importers import LogImportError, MalformedLog, load_wandb_csv


def write_csv(path: Path, rows: Sequence[Sequence[object]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows(rows)
    return path


def test_history_export_columns(tmp_path: Path) -> None:
    media = '{"_type": "table-file", "path": "media/table/x.json"}'
    path = write_csv(
        tmp_path / "history.csv",
        [
            [
                "",
                "_step",
                "_runtime",
                "_timestamp",
                "actor/entropy",
                "critic/score/mean",
                "val/Größe",
                "samples",
            ],
            [0, 0, 1.5, 1.7e9, 0.5, 0.1, "", ""],
            [1, 1, 3.0, 1.7e9, "NaN", "inf", 0.25, media],
            [2, 2, 4.5, 1.7e9, "", "-Infinity", "", ""],
            [3, 3, 6.0, 1.7e9, "", "", "", ""],  # nothing logged: no step
        ],
    )
    log = load_wandb_csv(path)
    assert log.steps.tolist() == [0, 1, 2] and log.diagnostics == ()
    assert set(log.values) == {M.ENTROPY_MEAN, M.REWARD_MEAN, "val/Größe"}  # _runtime etc. are not metrics
    assert log.present[M.ENTROPY_MEAN].tolist() == [True, True, False]  # empty cell = not logged
    assert math.isnan(log.values[M.ENTROPY_MEAN][1])
    assert log.values[M.REWARD_MEAN].tolist() == [0.1, math.inf, -math.inf]
    assert log.values["val/Größe"][1] == 0.25


def test_transformers_rows_use_global_step(tmp_path: Path) -> None:
    """transformers logs `train/global_step` with every row; `_step` only counts log calls."""
    path = write_csv(
        tmp_path / "trl.csv",
        [
            ["_step", "train/global_step", "train/reward", "train/grad_norm", "eval/loss", "train/epoch"],
            [0, 10, 0.5, 1.0, "", 0.1],
            [1, 10, "", "", 0.7, 0.1],
            [2, 20, 0.6, 1.1, "", 0.2],
        ],
    )
    log = load_wandb_csv(path)
    assert log.steps.tolist() == [10, 20]
    assert log.values[M.REWARD_MEAN].tolist() == [0.5, 0.6] and log.values[M.GRAD_NORM][1] == 1.1
    assert log.values["eval/loss"][0] == 0.7 and log.values["train/epoch"].tolist() == [0.1, 0.2]


def test_resumed_exports_later_file_wins(tmp_path: Path) -> None:
    a = write_csv(tmp_path / "a.csv", [["_step", "loss"], *[[s, 1.0] for s in range(4)]])
    b = write_csv(tmp_path / "b.csv", [["_step", "loss"], *[[s, 2.0] for s in range(2, 6)]])
    assert load_wandb_csv([a, b]).values[M.LOSS].tolist() == [1.0, 1.0, 2.0, 2.0, 2.0, 2.0]


def test_malformed_rows_name_their_line(tmp_path: Path) -> None:
    path = tmp_path / "history.csv"
    path.write_text(
        "_step,loss,note\n"
        '0,0.5,"two\nlines"\n'  # a quoted cell over two lines: the next record starts on line 4
        "1,0.4\n"
        ",0.3,\n"
        "2.5,0.2,\n"
        "3,abc,\n"
        "4,0.1,\n"
        "5,0.",
        encoding="utf-8",
    )
    log = load_wandb_csv(path)
    assert log.steps.tolist() == [0, 4]
    assert [str(d) for d in log.diagnostics] == [
        f"{path}:2: step 0: note is not a number: 'two\\nlines'",
        f"{path}:4: 2 cells, the header has 3 (truncated row?)",
        f"{path}:5: no step (empty _step cell)",
        f"{path}:6: _step is not a non-negative integer: '2.5'",
        f"{path}:7: step 3: loss is not a number: 'abc'",
        f"{path}:9: 2 cells, the header has 3 (truncated row?)",
    ]
    assert log.values[M.LOSS].tolist() == [0.5, 0.1]
    with pytest.raises(MalformedLog, match=rf"^{path}:2: step 0: note is not a number"):
        load_wandb_csv(path, strict=True)


def test_without_step_column(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "chart.csv", [["Step", "run - loss"], [0, 1.0]])
    with pytest.raises(LogImportError, match=r"no _step column .*columns: \['Step', 'run - loss'\]"):
        load_wandb_csv(path)

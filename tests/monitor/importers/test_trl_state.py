"""TRL / transformers trainer_state.json (`log_history`) -> canonical metric columns."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from contracts import metrics as M
from monitor.importers import LogImportError, MalformedLog, load_log, load_trl_state

HISTORY: list[dict[str, Any]] = [
    {"epoch": 0.01, "grad_norm": 1.5, "learning_rate": 1e-6, "loss": 0.13, "reward": 1.06, "step": 1},
    {"epoch": 0.02, "grad_norm": float("nan"), "loss": float("inf"), "reward": 0.9, "step": 2},
    {"epoch": 0.02, "eval_loss": 0.4, "eval_runtime": 3.2, "step": 2},
    {"epoch": 0.03, "entropy": 0.05, "frac_reward_zero_std": 0.5, "rewards/ключ/mean": 0.7, "step": 3},
    {"epoch": 0.03, "step": 3, "total_flos": 0.0, "train_loss": 0.1, "train_runtime": 100.0},
]


def trainer_state(path: Path, history: list[dict[str, Any]], global_step: int = 3) -> Path:
    """What transformers writes: sorted keys, indent 2, NaN / Infinity as bare tokens."""
    state = {"best_metric": None, "epoch": 0.03, "global_step": global_step, "log_history": history}
    path.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def test_log_history_with_eval_summary_and_nonfinite(tmp_path: Path) -> None:
    log = load_trl_state(trainer_state(tmp_path / "trainer_state.json", HISTORY))
    assert log.steps.tolist() == [1, 2, 3] and log.diagnostics == ()
    assert log.values[M.REWARD_MEAN].tolist()[:2] == [1.06, 0.9]
    assert math.isnan(log.values[M.GRAD_NORM][1]) and log.present[M.GRAD_NORM][1]
    assert log.values[M.LOSS][1] == math.inf
    assert log.values["eval_loss"][1] == 0.4  # merged into its step, as trl-log does
    assert log.values[M.ENTROPY_MEAN][2] == 0.05 and log.values[M.ADV_FRAC_ZERO_STD_GROUPS][2] == 0.5
    assert log.values["rewards/ключ/mean"][2] == 0.7
    assert "train_loss" not in log.values and "total_flos" not in log.values  # the summary entry
    assert log.values["epoch"].tolist() == [0.01, 0.02, 0.03]
    # a checkpoint directory stands for its trainer_state.json
    assert load_log([tmp_path], "auto").steps.tolist() == [1, 2, 3]


def test_resumed_checkpoints_later_file_wins(tmp_path: Path) -> None:
    first = trainer_state(tmp_path / "a.json", [{"loss": 1.0, "only_a": 1.0, "step": s} for s in (1, 2, 3)])
    second = trainer_state(tmp_path / "b.json", [{"loss": 2.0, "step": s} for s in (3, 4)])
    log = load_trl_state([first, second])
    assert log.steps.tolist() == [1, 2, 3, 4]
    assert log.values[M.LOSS].tolist() == [1.0, 1.0, 2.0, 2.0]
    assert log.present["only_a"].tolist() == [True, True, False, False]


def test_malformed_entries_name_their_line(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text(
        "{\n"
        '  "global_step": 4,\n'
        '  "log_history": [\n'
        '    {"loss": 0.5, "step": 1},\n'
        '    {"loss": 0.4},\n'
        '    {"loss": "high", "reward": 1.0, "step": 2},\n'
        '    {"loss": 0.3, "step": "three"},\n'
        "    7,\n"
        '    {"loss": 0.2, "step": 4},\n'
        '    {"loss": 0.1, "ste',
        encoding="utf-8",
    )
    log = load_trl_state(path)
    assert log.steps.tolist() == [1, 2, 4]
    assert log.values[M.REWARD_MEAN][1] == 1.0 and not log.present[M.LOSS][1]
    assert [str(d) for d in log.diagnostics] == [
        f'{path}:5: log_history entry has no "step"',
        f"{path}:6: step 2: loss is not a number: 'high'",
        f"{path}:7: step is not a non-negative integer: 'three'",
        f"{path}:8: log_history entry is not an object: 7",
        f"{path}:10: invalid JSON in log_history: Unterminated string starting at",
    ]
    with pytest.raises(MalformedLog, match=rf'^{path}:5: log_history entry has no "step"$'):
        load_trl_state(path, strict=True)


def test_not_a_trainer_state(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"lr": 1e-6}')
    with pytest.raises(LogImportError, match='no "log_history" list'):
        load_trl_state(path)

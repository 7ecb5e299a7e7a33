"""ms-swift `logging.jsonl` -> canonical columns (TRL's vocabulary; the step from "global_step/max_steps")."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from contracts import metrics as M
from monitor.importers import MalformedLog, detect_format, load_log, load_swift_jsonl


def swift_line(step: int, **metrics: Any) -> dict[str, Any]:
    max_steps = 100
    return {
        **metrics,
        "epoch": step / max_steps,
        "global_step/max_steps": f"{step}/{max_steps}",
        "percentage": f"{100 * step / max_steps:.2f}%",
        "elapsed_time": "4m 12s",
        "remaining_time": "1h 2m 3s",
        "memory(GiB)": 32.4,
        "train_speed(s/it)": 251.5,
    }


def write_lines(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")  # NaN -> NaN token
    return path


def test_grpo_keys_map_through_the_trl_contract(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "logging.jsonl",
        [
            swift_line(
                1,
                loss=0.01,
                grad_norm=0.69,
                learning_rate=1e-6,
                reward=0.62,
                reward_std=0.53,
                frac_reward_zero_std=0.25,
                kl=0.017,
                **{
                    "completions/mean_length": 322.9,
                    "completions/clipped_ratio": 0.0,
                    "clip_ratio/region_mean": 0.001,
                    "entropy/mean": 0.61,
                    "rewards/AccuracyORM/mean": 0.43,
                },
            ),
            swift_line(2, loss=float("nan"), grad_norm=float("inf"), reward=0.7),
            {"eval_loss": 0.4, "eval_reward": 0.55, "epoch": 0.02, "global_step/max_steps": "2/100"},
            {"train_runtime": 12.0, "train_loss": 0.01, "global_step/max_steps": "2/100"},  # summary: skipped
            {"last_model_checkpoint": "/out/checkpoint-2", "global_step": 2, "log_history": []},
        ],
    )
    assert detect_format(path) == "ms-swift"
    log = load_log([path])
    assert log.diagnostics == () and log.steps.tolist() == [1, 2]
    assert log.values[M.REWARD_MEAN].tolist() == [0.62, 0.7]
    assert log.values[M.REWARD_STD][0] == 0.53 and log.values[M.ADV_FRAC_ZERO_STD_GROUPS][0] == 0.25
    assert log.values[M.KL_REF][0] == 0.017 and log.values[M.CLIP_FRAC][0] == 0.001
    assert log.values[M.RESPONSE_LENGTH_MEAN][0] == 322.9 and log.values[M.RESPONSE_CLIP_RATIO][0] == 0.0
    assert log.values[M.ENTROPY_MEAN][0] == 0.61  # already the canonical name
    assert math.isnan(log.values[M.LOSS][1]) and log.present[M.LOSS][1]  # NaN is data
    assert log.values[M.GRAD_NORM][1] == math.inf
    assert log.values["eval_reward"].tolist()[1] == 0.55  # evaluation joins its step
    assert log.values["memory(GiB)"][0] == 32.4 and "learning_rate" in log.values
    assert not {"percentage", "elapsed_time", "train_runtime", "train_loss"} & set(log.values)


def test_older_trl_keys_and_other_step_keys(tmp_path: Path) -> None:
    megatron = write_lines(
        tmp_path / "megatron.jsonl",
        [{"loss": 0.5, "reward": 0.1, "iteration": "7/10", "elapsed_time": "1s"}],
    )
    old = write_lines(
        tmp_path / "old.jsonl",
        [{"loss": 0.5, "reward": 0.1, "completion_length": 80.0, "clip_ratio": 0.02, "global_step": 3}],
    )
    assert load_swift_jsonl(megatron).steps.tolist() == [7]
    log = load_log([old])
    assert log.steps.tolist() == [3]
    assert log.values[M.RESPONSE_LENGTH_MEAN][0] == 80.0 and log.values[M.CLIP_FRAC][0] == 0.02


def test_malformed_lines_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "logging.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps(swift_line(1, loss=0.1)),
                "not json",
                json.dumps({"loss": 0.1}),
                json.dumps({"loss": 0.1, "global_step/max_steps": "?/10"}),
                json.dumps(swift_line(2, loss=0.2, note="text")),
                '{"loss": 0.3, "global_step/max_steps": "3/10"',  # cut off, no newline
            ]
        ),
        encoding="utf-8",
    )
    log = load_swift_jsonl(path)
    assert log.steps.tolist() == [1, 2]
    reasons = [str(d).split(": ", 1)[1] for d in log.diagnostics]
    assert reasons[0] == "invalid JSON at column 1: Expecting value"
    assert reasons[1:4] == [
        'no step ("global_step/max_steps" or "global_step")',
        "global_step/max_steps does not start with a step: '?/10'",
        "step 2: note is not a number: 'text'",
    ]
    assert reasons[4].endswith("(last line has no newline: truncated?)")
    with pytest.raises(MalformedLog, match=r"logging\.jsonl:2: invalid JSON"):
        load_swift_jsonl(path, strict=True)

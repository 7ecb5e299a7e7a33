"""TRL stdout (one printed dict per logged step among tqdm noise) -> canonical metric columns."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from contracts import metrics as M
from monitor.importers import (
    Diagnostics,
    MalformedLog,
    load_trl_stdout,
    load_verl_console,
    parse_trl_stdout,
    read_trl_stdout,
)
from tests.monitor.importers.helpers import FINQA_TRL, needs_real

TQDM = "\r  0%|          | 1/2400 [00:05<3:20:52,  5.02s/it]\r                                   \r"


def test_trl_dicts_among_tqdm_noise() -> None:
    text = (
        "Loading checkpoint shards: 100%|##########| 4/4\n"
        + TQDM
        + "{'loss': 0.1367, 'grad_norm': 1.49, 'reward': 1.06, 'frac_reward_zero_std': 0.0, 'epoch': 0.0}\n"
        + TQDM
        + "{'loss': nan, 'grad_norm': inf, 'reward': 2.0, 'reward_std': 0.0, 'entropy': 0.04, 'epoch': 0.0}\n"
        + "{'eval_loss': 0.5, 'epoch': 0.0}\n"
        + TQDM
        + "{'loss': 0.01, 'grad_norm': -inf, 'completions/mean_length': 29.1, 'clip_ratio/region_mean': 0.0, 'epoch': 0.01}"
        + TQDM
        + "\n{'train_runtime': 10392.8, 'train_loss': 0.0029, 'epoch': 0.52}\n"
        + '{\n  "saved": "x",\n  "max_steps": 2400\n}\n'
    )
    diagnostics = Diagnostics()
    records = parse_trl_stdout(text, diagnostics=diagnostics)
    assert sorted(records) == [1, 2, 3]
    assert records[1][M.LOSS] == 0.1367 and records[1][M.ADV_FRAC_ZERO_STD_GROUPS] == 0.0
    assert records[1][M.REWARD_MEAN] == 1.06
    assert math.isnan(records[2][M.LOSS]) and records[2][M.GRAD_NORM] == math.inf
    assert records[2]["eval_loss"] == 0.5  # evaluation dicts belong to the current step
    assert records[3][M.GRAD_NORM] == -math.inf and records[3][M.RESPONSE_LENGTH_MEAN] == 29.1
    assert records[3][M.CLIP_FRAC] == 0.0 and records[3]["epoch"] == 0.01
    assert diagnostics.items == []


def test_trl_step_key_wins_and_first_step(tmp_path: Path) -> None:
    text = "{'loss': 1.0, 'step': 10}\n{'loss': 2.0}\n{'loss': 3.0, 'global_step': 40}\n{'loss': 4.0}"
    assert sorted(parse_trl_stdout(text)) == [10, 11, 40, 41]
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("\n".join("{'loss': 1.0}" for _ in range(5)))
    b.write_text("\n".join("{'loss': 2.0}" for _ in range(5)))
    log = load_trl_stdout([a, b], first_step=[1, 4])
    assert log.steps.tolist() == list(range(1, 9))
    assert log.values[M.LOSS].tolist() == [1.0] * 3 + [2.0] * 5
    with pytest.raises(ValueError, match="first_step"):
        load_trl_stdout([a, b], first_step=[1])
    steps, values = read_trl_stdout(a)
    assert steps.tolist() == [1, 2, 3, 4, 5] and values[M.LOSS].tolist() == [1.0] * 5


def test_garbage_does_not_crash(tmp_path: Path) -> None:
    path = tmp_path / "junk.log"
    path.write_bytes(b"\xff\xfe{'loss': [1, 2]}\x00{'a': 'b'}\nstep:x - y:z\n{'loss': 1e999}")
    log = load_trl_stdout(path)
    assert log.steps.tolist() == [1]  # only the last dict has a number (inf)
    assert load_verl_console(path).steps.size == 0


def test_malformed_dicts_are_reported_with_their_line(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text(
        "{'loss': 0.5, 'reward': 1.0, 'epoch': 0.0}\n"
        + TQDM
        + "{'loss': 0.4, 'reward': 'n/a', 'tag': 'x', 'epoch': 0.0}\n"
        + "{'loss': 0.3.1, 'epoch': 0.0}\n"
        + "{'model': 'qwen'}\n"  # no number: not a log dict, not reported
        + "{'loss': 0.2, 'épsilon/ü': 0.1, 'epoch': 0.0}\n"
        + "{'loss': 0.1, 'grad_norm': 0.",  # cut off while printing
        encoding="utf-8",
    )
    log = load_trl_stdout(path)
    assert log.steps.tolist() == [1, 2, 3]
    assert log.values[M.LOSS].tolist() == [0.5, 0.4, 0.2]
    assert log.values["épsilon/ü"][2] == 0.1
    assert [str(d) for d in log.diagnostics] == [
        f"{path}:2: reward is not a number: 'n/a'",
        f"{path}:2: tag is not a number: 'x'",
        f"{path}:3: not a valid Python dict: \"{{'loss': 0.3.1, 'epoch': 0.0}}\"",
        f"{path}:6: log dict is cut off (no closing brace) (last line has no newline: truncated?)",
    ]
    with pytest.raises(MalformedLog, match=rf"^{path}:2: reward is not a number: 'n/a'$"):
        load_trl_stdout(path, strict=True)


@needs_real
def test_real_trl_finqa_log() -> None:
    log = load_trl_stdout(FINQA_TRL)
    assert log.steps.tolist() == list(range(1, 2401)) and log.diagnostics == ()
    assert log.present[M.REWARD_MEAN].all() and np.isfinite(log.values[M.REWARD_MEAN]).all()
    assert log.values[M.LOSS][0] == pytest.approx(0.1367)
    assert set(np.unique(log.values[M.ADV_FRAC_ZERO_STD_GROUPS]).tolist()) <= {0.0, 0.5, 1.0}

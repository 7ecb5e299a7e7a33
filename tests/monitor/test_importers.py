"""Small importers: verl console logs and TRL stdout -> canonical metric columns."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from contracts import metrics as M
from monitor.importers import (
    TRL_NAMES,
    VERL_NAMES,
    canonical_name,
    load_trl_stdout,
    load_verl_console,
    parse_trl_stdout,
    parse_verl_console,
    read_trl_stdout,
    read_verl_console,
)
from monitor.importers.verl_console import parse_verl_line

REAL = Path(__file__).resolve().parents[2].parent / "shared/datasets/real_runs"

RAY = "\x1b[36m(TaskRunner pid=7283)\x1b[0m "


def verl_line(step: int, **metrics: object) -> str:
    return RAY + f"step:{step} - " + " - ".join(f"{k}:{v}" for k, v in metrics.items())


def test_name_maps_cover_the_brief() -> None:
    assert VERL_NAMES["actor/entropy"] == M.ENTROPY_MEAN
    assert VERL_NAMES["actor/entropy_loss"] == M.ENTROPY_MEAN
    assert VERL_NAMES["actor/grad_norm"] == M.GRAD_NORM
    assert VERL_NAMES["critic/score/mean"] == M.REWARD_MEAN
    assert VERL_NAMES["response_length/mean"] == M.RESPONSE_LENGTH_MEAN
    assert VERL_NAMES["response_length/clip_ratio"] == M.RESPONSE_CLIP_RATIO
    assert VERL_NAMES["actor/ppo_kl"] == M.KL
    assert VERL_NAMES["actor/pg_clipfrac"] == M.CLIP_FRAC
    assert TRL_NAMES["frac_reward_zero_std"] == M.ADV_FRAC_ZERO_STD_GROUPS
    assert TRL_NAMES["completions/mean_length"] == M.RESPONSE_LENGTH_MEAN
    assert TRL_NAMES["clip_ratio/region_mean"] == M.CLIP_FRAC
    assert canonical_name("timing/gen", VERL_NAMES) == "timing/gen"


def test_verl_line_with_ansi_and_ray_prefix() -> None:
    parsed = parse_verl_line(
        "\x1b[2m\x1b[36m(main_task pid=64899, ip=10.0.0.1)\x1b[0m step:7 - actor/grad_norm:1.5 - critic/lr(1e-4):0.100"
    )
    assert parsed == (7, {"actor/grad_norm": 1.5, "critic/lr(1e-4)": 0.1})
    assert parse_verl_line("  'clip_ratio': 0.2,") is None
    assert parse_verl_line(RAY + "training/global_step:101.000 - x:1") is None


def test_verl_console_merges_lines_and_keeps_nonfinite() -> None:
    text = "\n".join(
        [
            "2026-07-06 22:27:51,552 WARNING something -- step:3 is not a metrics line",
            verl_line(0, **{"test_score/openai/gsm8k": 0.5}),
            verl_line(0, **{"actor/grad_norm": 2.0, "critic/score/mean": 0.1, "actor/entropy_loss": 0.4}),
            verl_line(1, **{"actor/grad_norm": "nan", "critic/score/mean": 0.2, "weird": "abc"}),
            verl_line(2, **{"actor/grad_norm": "inf", "response_length/clip_ratio": 0.0}),
        ]
    )
    records = parse_verl_console(text)
    assert sorted(records) == [0, 1, 2]
    assert records[0] == {
        "test_score/openai/gsm8k": 0.5,
        M.GRAD_NORM: 2.0,
        M.REWARD_MEAN: 0.1,
        M.ENTROPY_MEAN: 0.4,
    }
    assert math.isnan(records[1][M.GRAD_NORM]) and "weird" not in records[1]
    assert records[2][M.GRAD_NORM] == math.inf


def test_verl_prefers_new_entropy_name() -> None:
    both = {"actor/entropy": 0.3, "actor/entropy_loss": 0.9}
    for names in (["actor/entropy", "actor/entropy_loss"], ["actor/entropy_loss", "actor/entropy"]):
        line = verl_line(5, **{name: both[name] for name in names})
        assert parse_verl_console(line)[5][M.ENTROPY_MEAN] == 0.3


def test_verl_resumed_run_later_file_wins(tmp_path: Path) -> None:
    first = tmp_path / "a.log"
    second = tmp_path / "b.log"
    first.write_text(
        "\n".join(verl_line(s, **{"actor/grad_norm": 1.0, "only_first": 1}) for s in range(0, 6))
    )
    second.write_text("\n".join(verl_line(s, **{"actor/grad_norm": 2.0}) for s in range(4, 9)))
    log = load_verl_console([first, second])
    assert log.steps.tolist() == list(range(9))
    assert log.values[M.GRAD_NORM].tolist() == [1.0] * 4 + [2.0] * 5
    # the later file's step replaces the whole step: `only_first` is not logged at steps 4-5 any more
    assert log.present["only_first"].tolist() == [True] * 4 + [False] * 5
    steps, values = read_verl_console([first, second])
    assert steps.dtype == np.int64 and values[M.GRAD_NORM].dtype == np.float64
    assert np.isnan(values["only_first"][4])


def test_verl_present_marks_logged_nan(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_text(
        verl_line(0, **{"actor/grad_norm": 1.0})
        + "\n"
        + verl_line(1, **{"actor/grad_norm": "nan"})
        + "\n"
        + verl_line(2, **{"x": 1})
    )
    log = load_verl_console(path)
    assert log.present[M.GRAD_NORM].tolist() == [True, True, False]
    assert np.isnan(log.values[M.GRAD_NORM][1:]).all()


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
    records = parse_trl_stdout(text)
    assert sorted(records) == [1, 2, 3]
    assert records[1][M.LOSS] == 0.1367 and records[1][M.ADV_FRAC_ZERO_STD_GROUPS] == 0.0
    assert math.isnan(records[2][M.LOSS]) and records[2][M.GRAD_NORM] == math.inf
    assert records[2]["eval_loss"] == 0.5  # evaluation dicts belong to the current step
    assert records[3][M.GRAD_NORM] == -math.inf and records[3][M.RESPONSE_LENGTH_MEAN] == 29.1
    assert records[3][M.CLIP_FRAC] == 0.0 and records[3]["epoch"] == 0.01


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


needs_real = pytest.mark.skipif(not REAL.is_dir(), reason="../shared/datasets/real_runs is missing")


@needs_real
def test_real_verl_gsm8k_log() -> None:
    log = load_verl_console(REAL / "verl_data_gsm8k_ppo/Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log")
    assert log.steps[0] == 0 and log.steps[-1] == 434 and log.steps.size == 435
    assert log.values[M.GRAD_NORM][16] == pytest.approx(65.958)  # the isolated spike of the README
    assert {M.REWARD_MEAN, M.ENTROPY_MEAN, M.KL, M.CLIP_FRAC, M.RESPONSE_LENGTH_MEAN} <= set(log.values)
    assert log.present["val/test_score/openai/gsm8k"][9]  # periodic validation inside the step line
    assert not log.present["val/test_score/openai/gsm8k"][0]


@needs_real
def test_real_resumed_searchr1_run() -> None:
    folder = REAL / "wallace_searchr1_grpo_gigpo"
    log = load_verl_console(
        [folder / "grpo__train_v2.pre_resume_step100.log", folder / "grpo__train_v2_resume_from100.log"]
    )
    assert log.steps.tolist() == list(range(301))
    i = int(np.searchsorted(log.steps, 120))
    assert log.values[M.GRAD_NORM][i] == pytest.approx(0.195)  # the resume file's value (pre-resume: 0.554)
    assert M.RESPONSE_CLIP_RATIO in log.values


@needs_real
def test_real_trl_finqa_log() -> None:
    log = load_trl_stdout(REAL / "wallace_finqa_trl_grpo/train_stage7_grpo_long2400_r32.log")
    assert log.steps.tolist() == list(range(1, 2401))
    assert log.values[M.LOSS][0] == pytest.approx(0.1367)
    assert set(np.unique(log.values[M.ADV_FRAC_ZERO_STD_GROUPS]).tolist()) <= {0.0, 0.5, 1.0}

"""verl console logs -> canonical metric columns, with malformed lines reported by file and line."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from contracts import metrics as M
from monitor.importers import (
    TRL_NAMES,
    VERL_NAMES,
    Diagnostic,
    Diagnostics,
    MalformedLog,
    load_verl_console,
    parse_verl_console,
    read_verl_console,
)
from monitor.importers.verl_console import parse_verl_line
from tests.monitor.importers.helpers import GSM8K_VERL, RAY, SEARCH_R1_GRPO, needs_real, verl_line


def test_name_maps_cover_the_brief() -> None:
    assert VERL_NAMES["actor/entropy"] == M.ENTROPY_MEAN
    assert VERL_NAMES["actor/entropy_loss"] == M.ENTROPY_MEAN
    assert VERL_NAMES["actor/grad_norm"] == M.GRAD_NORM
    assert VERL_NAMES["critic/score/mean"] == M.REWARD_MEAN
    assert VERL_NAMES["response_length/mean"] == M.RESPONSE_LENGTH_MEAN
    assert VERL_NAMES["response_length/clip_ratio"] == M.RESPONSE_CLIP_RATIO
    assert VERL_NAMES["actor/ppo_kl"] == M.KL_OLD
    assert VERL_NAMES["actor/kl_loss"] == M.KL_REF
    assert VERL_NAMES["actor/loss"] == M.LOSS
    assert VERL_NAMES["num_turns/mean"] == VERL_NAMES["training/num_turns/mean"] == M.TURNS_MEAN
    assert VERL_NAMES["env/number_of_valid_search"] == M.SEARCH_VALID_PER_TRAJ
    assert VERL_NAMES["actor/pg_clipfrac"] == M.CLIP_FRAC
    assert TRL_NAMES["reward"] == M.REWARD_MEAN
    assert TRL_NAMES["frac_reward_zero_std"] == M.ADV_FRAC_ZERO_STD_GROUPS
    assert TRL_NAMES["completions/mean_length"] == M.RESPONSE_LENGTH_MEAN
    assert TRL_NAMES["clip_ratio/region_mean"] == M.CLIP_FRAC
    assert M.KL_REF in TRL_NAMES.values() and M.KL_OLD not in TRL_NAMES.values()
    assert "timing/gen" not in VERL_NAMES


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
            verl_line(2, **{"actor/grad_norm": "inf", "response_length/clip_ratio": 0.0, "λ/ü": "-inf"}),
        ]
    )
    diagnostics = Diagnostics()
    records = parse_verl_console(text, diagnostics, "run.log")
    assert sorted(records) == [0, 1, 2]
    assert records[0] == {
        "test_score/openai/gsm8k": 0.5,
        M.GRAD_NORM: 2.0,
        M.REWARD_MEAN: 0.1,
        M.ENTROPY_MEAN: 0.4,
    }
    assert math.isnan(records[1][M.GRAD_NORM]) and "weird" not in records[1]
    assert records[2][M.GRAD_NORM] == math.inf and records[2]["λ/ü"] == -math.inf
    assert diagnostics.items == [Diagnostic("run.log", 4, "step 1: weird is not a number: 'abc'")]


def test_verl_prefers_new_entropy_name() -> None:
    both = {"actor/entropy": 0.3, "actor/entropy_loss": 0.9}
    for names in (["actor/entropy", "actor/entropy_loss"], ["actor/entropy_loss", "actor/entropy"]):
        line = verl_line(5, **{name: both[name] for name in names})
        row = parse_verl_console(line)[5]
        assert row[M.ENTROPY_MEAN] == 0.3 and row["actor/entropy_loss"] == 0.9  # the other keeps its name


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


def test_malformed_pairs_and_truncated_last_line(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_text(
        "config: {'lr': 1e-6}\n"
        + verl_line(0, **{"actor/grad_norm": 1.0})
        + "\n"
        + verl_line(1, **{"actor/grad_norm": "1.2.3"})
        + " - no_colon_here\n"
        + RAY
        + "step:2 - actor/grad_norm:0.5 - critic/score/me",  # the trainer died mid-line
        encoding="utf-8",
    )
    log = load_verl_console(path)
    assert log.steps.tolist() == [0, 2]
    assert log.values[M.GRAD_NORM].tolist() == [1.0, 0.5]
    assert [str(d) for d in log.diagnostics] == [
        f"{path}:3: step 1: actor/grad_norm is not a number: '1.2.3'",
        f"{path}:3: step 1: 'no_colon_here' is not key:value",
        f"{path}:4: step 2: 'critic/score/me' is not key:value (last line has no newline: truncated?)",
    ]
    with pytest.raises(MalformedLog, match=rf"^{path}:3: step 1: actor/grad_norm is not a number") as err:
        load_verl_console(path, strict=True)
    assert err.value.diagnostic.line == 3


@needs_real
def test_real_verl_gsm8k_log() -> None:
    log = load_verl_console(GSM8K_VERL)
    assert log.steps[0] == 0 and log.steps[-1] == 434 and log.steps.size == 435
    assert log.values[M.GRAD_NORM][16] == pytest.approx(65.958)  # the isolated spike of the README
    assert {M.REWARD_MEAN, M.ENTROPY_MEAN, M.KL_OLD, M.CLIP_FRAC, M.RESPONSE_LENGTH_MEAN} <= set(log.values)
    assert log.present["val/test_score/openai/gsm8k"][9]  # periodic validation inside the step line
    assert not log.present["val/test_score/openai/gsm8k"][0]
    assert log.diagnostics == ()


@needs_real
def test_real_resumed_searchr1_run() -> None:
    pre, resumed = (load_verl_console(p) for p in SEARCH_R1_GRPO)
    log = load_verl_console(SEARCH_R1_GRPO)
    assert log.steps.tolist() == list(range(301)) and log.diagnostics == ()
    assert pre.steps.tolist() == list(range(150)) and resumed.steps.tolist() == list(range(101, 301))
    # 101..149 are in both files: every value there is the resume file's
    for name in (M.GRAD_NORM, M.REWARD_MEAN, M.ENTROPY_MEAN):
        np.testing.assert_array_equal(log.values[name][101:150], resumed.values[name][:49])
        np.testing.assert_array_equal(log.values[name][:101], pre.values[name][:101])
    assert log.values[M.GRAD_NORM][120] == pytest.approx(0.195)  # the resume file's (pre-resume: 0.554)
    assert pre.values[M.GRAD_NORM][120] == pytest.approx(0.554)
    assert M.RESPONSE_CLIP_RATIO in log.values

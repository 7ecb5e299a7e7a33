"""The second batch of real logs imports with `--format auto`: the verl-agent console logs (ymguan) and the
W&B-captured verl console log of a real collapse (aopd: numpy-scalar values, lines cut at 4096 characters)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from contracts import metrics as M
from monitor.importers import detect_format, load_log
from monitor.importers.verl_console import WANDB_LINE_LIMIT, parse_value
from tests.monitor.importers.helpers import REAL, needs_real

YMGUAN = sorted((REAL / "ymguan_alfworld_grpo_gigpo_1.5b").glob("*.log"))
AOPD = REAL / "aopd_retool_qwen3_4b_grpo_collapse/run-20251129_221801-i80f2v90_output.log"


def test_numpy_scalar_values() -> None:
    assert parse_value("np.float64(0.40021155774593353)") == 0.40021155774593353
    assert parse_value("np.int32(7)") == 7.0 and parse_value(" 0.5 ") == 0.5
    assert np.isnan(parse_value("np.float64(nan)") or 0.0)
    assert parse_value("np.float64(0.") is None and parse_value("tensor(1.0)") is None


def test_a_line_cut_by_wandb_loses_only_its_last_pair(tmp_path: Path) -> None:
    head = "step:10 - actor/grad_norm:np.float64(17.39) - actor/entropy:0.371 - "
    filler = "val-aux/x:" + "1" * (WANDB_LINE_LIMIT - len(head) - len("val-aux/x:") - len(" - val-a"))
    line = head + filler + " - val-a"
    assert len(line) == WANDB_LINE_LIMIT
    path = tmp_path / "output.log"
    path.write_text("step:9 - actor/grad_norm:4.07\n" + line + "\nstep:11 - actor/grad_norm:4.91\n")
    log = load_log([path])
    assert log.values[M.GRAD_NORM].tolist() == [4.07, 17.39, 4.91]
    assert log.values[M.ENTROPY_MEAN][1] == 0.371 and "val-aux/x" in log.values
    (diagnostic,) = log.diagnostics
    assert diagnostic.line == 2 and "line cut at 4096 characters" in diagnostic.reason


@needs_real
def test_ymguan_verl_agent_logs() -> None:
    assert len(YMGUAN) == 2
    for path in YMGUAN:
        assert detect_format(path) == "verl-console"
        log = load_log([path])
        assert log.diagnostics == ()
        assert log.steps[0] == 0 and log.steps[-1] == 150
        for name in (M.REWARD_MEAN, M.ENTROPY_MEAN, M.GRAD_NORM, M.KL_REF, M.RESPONSE_LENGTH_MEAN):
            assert log.present[name].sum() >= 150, (path.name, name)


@needs_real
def test_aopd_collapse_log() -> None:
    assert detect_format(AOPD) == "verl-console"
    log = load_log([AOPD])
    assert log.steps[0] == 0 and log.steps[-1] == 261 and len(log) == 262
    # only the cut lines (validation every 10 steps, and step 0) are reported, nothing else
    assert log.diagnostics and all("line cut at 4096" in d.reason for d in log.diagnostics)
    assert {int(d.reason.split()[1].rstrip(":")) for d in log.diagnostics} <= set(range(0, 262, 10))
    at = {int(s): i for i, s in enumerate(log.steps)}
    grad = log.values[M.GRAD_NORM]
    assert grad[at[1]] == 0.40021155774593353  # np.float64(...) values are read
    assert round(float(grad[at[10]]), 1) == 17.4  # the surge on a cut (validation) line
    assert round(float(log.values[M.ENTROPY_MEAN][at[12]]), 4) == 0.0068
    assert round(float(log.values[M.RESPONSE_LENGTH_MEAN][at[12]]), 1) == 1.0
    assert log.present[M.KL_REF][at[1]]  # actor/reward_kl_penalty: the KL in the reward
    reward = log.values[M.REWARD_MEAN]
    assert not log.present[M.REWARD_MEAN][at[10]]  # cut before critic/score/mean: missing, not 0
    assert round(float(reward[at[1]]), 3) == -0.676 and float(np.nanmax(reward[at[50] :])) == -1.0

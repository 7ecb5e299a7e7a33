"""The false-critical budget (`lldmon_lab.eval_harder`, `lldmon eval --harder`): the harder series of a
control keep what they must keep, and the budget counts critical episodes per 10,000 healthy steps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from contracts import metrics as M
from lldmon_lab.eval_harder import (
    AFFINE,
    Budget,
    affine,
    block_shuffled,
    budgets,
    judge,
    render_budgets,
    thinned,
    variants,
)
from lldmon_lab.evaluation import LabelledRun
from lldmon_lab.scenarios import healthy_scenario
from monitor.cli import app

RUN = LabelledRun.from_scenario(healthy_scenario(2))


def test_affine_moves_the_reward_and_its_floor_and_nothing_else() -> None:
    moved = affine(RUN, 3.0, -1.0)
    np.testing.assert_allclose(moved.values[M.REWARD_MEAN], 3 * RUN.values[M.REWARD_MEAN] - 1)
    np.testing.assert_array_equal(moved.values[M.GRAD_NORM], RUN.values[M.GRAD_NORM])
    assert RUN.reward_floor == 0.0 and moved.reward_floor == -1.0
    with pytest.raises(ValueError, match="a must be > 0"):
        affine(RUN, -1.0, 0.0)
    # a declared reward series is the reward the detector judges: it moves with its floor
    success = "rewards/exact_match/mean"
    declared = replace(
        RUN, values={**RUN.values, success: RUN.values[M.REWARD_MEAN] / 2}, reward_metric=success
    )
    moved = affine(declared, 3.0, -1.0)
    np.testing.assert_allclose(moved.values[success], 3 * declared.values[success] - 1)
    np.testing.assert_allclose(moved.values[M.REWARD_MEAN], 3 * RUN.values[M.REWARD_MEAN] - 1)
    assert moved.reward_floor == -1.0 and moved.reward_metric == success
    assert moved.reward_unit == 3.0  # the floor's minimum rise is declared in the reward's units too


def test_block_shuffling_keeps_the_course_and_moves_the_texture() -> None:
    """A learning run still learns after shuffling (its level is kept; only deviations move), and every
    metric is moved by the same permutation of blocks."""
    shuffled = block_shuffled(RUN)
    before, after = RUN.values[M.REWARD_MEAN], shuffled.values[M.REWARD_MEAN]
    assert not np.array_equal(before, after)
    n = before.size
    assert np.mean(after[-50:]) - np.mean(after[:50]) == pytest.approx(
        np.mean(before[-50:]) - np.mean(before[:50]), abs=0.05
    )
    assert np.all(shuffled.values[M.GRAD_NORM] > 0)  # a positive metric stays positive (ratios move)
    assert shuffled.steps.size == n and shuffled.name.endswith("[shuffled]")
    assert np.array_equal(block_shuffled(RUN).values[M.REWARD_MEAN], after)  # a fixed seed


def test_thinning_keeps_one_value_per_block() -> None:
    thin = thinned(RUN, 10)
    logged = thin.steps[np.isfinite(thin.values[M.REWARD_MEAN])]
    assert np.unique(logged // 10).size == logged.size  # one reward per 10-step block
    assert logged.size >= RUN.steps.size // 10


def test_the_budget_counts_critical_episodes_per_10k_healthy_steps() -> None:
    names = [name for name, _ in variants(RUN)]
    assert names[0] == "as recorded" and len(names) == 3 + len(AFFINE)
    rows = judge(RUN)
    assert [r[0] for r in rows] == names and all(criticals == 0 for _, _, criticals in rows)
    other = LabelledRun.from_scenario(healthy_scenario(3))
    out = budgets([RUN, other], [[("as recorded", 1000, 0)], [("as recorded", 3000, 2)]])
    assert out == [Budget(RUN.source, "as recorded", 2, 4000, 2, (other.name,))]
    assert out[0].per_10k == pytest.approx(5.0)
    assert "5.00" in render_budgets(out) and other.name in render_budgets(out)


def test_lldmon_eval_harder_prints_the_budget() -> None:
    result = CliRunner().invoke(
        app,
        ["eval", "--collapse", "0", "--controls", "1", "--no-lab", "--no-found", "--harder", "--scale-free"],
        env={"COLUMNS": "240"},
    )
    assert result.exit_code == 0, result.output
    assert "scale-free: every run judged without a declared reward floor" in result.output
    assert "false-critical budget (critical findings per 10,000 healthy steps)" in result.output
    assert "reward 3r-1" in result.output and "shuffled in 20-step blocks" in result.output

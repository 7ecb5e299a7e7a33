"""Tests of trainer_hooks.likelihood: hand cases per metric, and a naive loop reference under hypothesis."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from contracts import metrics as M
from contracts.wire import ACTION_COLUMNS
from trainer_hooks.actions import action_ids, action_sums, num_actions
from trainer_hooks.likelihood import (
    StepMeasurement,
    _segments,
    correct_rows,
    measure_step,
    response_advantages,
)

NAN = math.nan
X = NAN  # value on mask == 0 tokens (tool feedback, padding): never read, so it must not leak
INF = math.inf
LN_08 = math.log(0.8)

# ----------------------------------------------------------------------------------------------
# Hand case (float64, dyadic numbers so every sum is exact). D = new - old.
#
#  row  A     reward  mask             old                        D                       actions (D, old mean)
#  0   +1.0   1.0    1 1 0 0 1 1 0 0  -1  -.5  X X -.25 -.25 X X  -.5  .25 X X .125 -.5   (-.25, -.75) (-.375, -.25)*
#  1   +0.5   1.0    1 1 1 0 0 0 0 0  -2  -2  -2  X ...            .5   0   0  X ...       (.5, -2)
#  2   -1.0   0.0    1 0 1 0 0 0 0 0  -1   X  -3  X ...            -1   X  .5  X ...       (-1, -1) (.5, -3)
#  3   -0.5   1.0    0 0 0 0 0 0 0 0  (empty response: in length/turns/garbled/reward only)
#  4    0.0   0.5    1 1 1 1 0 0 0 0  -4  -4  -4  -4               0    0   0   0          (0, -4): ppl e^4 >= 50
#  * answer_mask marks row 0 token 5 (so action 1 of row 0) and row 2 token 1 (a gap: no action).
#
#  pos rows 0, 1: 7 tokens, old sum -8; D_traj -.625 and .5; actions -.25 -.375 .5
#  neg rows 2 (row 3 is empty): 2 tokens, old sum -4; D_traj -.5
#  ratios on pos tokens: exp of (-.5 .25 .125 -.5 .5 0 0); below 0.8: the two -.5
#  advantage mass per mask token (rows 0 1 2 4 have 4 3 2 4 tokens): (4 * 1 + 3 * .5) / (2 * 1);
#  on answer tokens (row 0 token 5 only): +inf; groups [0 0 1 1 2]: rewards (1 1) (0 1) (.5)
#  correct (reward >= 1, with a mask token): rows 0 1 (as pos); reward >= .5: rows 0 1 4

OLD = [
    [-1.0, -0.5, X, X, -0.25, -0.25, X, X],
    [-2.0, -2.0, -2.0, X, X, X, X, X],
    [-1.0, X, -3.0, X, X, X, X, X],
    [X] * 8,
    [-4.0, -4.0, -4.0, -4.0, X, X, X, X],
]
DELTA = [
    [-0.5, 0.25, X, X, 0.125, -0.5, X, X],
    [0.5, 0.0, 0.0, X, X, X, X, X],
    [-1.0, X, 0.5, X, X, X, X, X],
    [X] * 8,
    [0.0, 0.0, 0.0, 0.0, X, X, X, X],
]
MASK = [
    [1, 1, 0, 0, 1, 1, 0, 0],
    [1, 1, 1, 0, 0, 0, 0, 0],
    [1, 0, 1, 0, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0, 0, 0],
    [1, 1, 1, 1, 0, 0, 0, 0],
]
ANSWER = [[0, 0, 0, 0, 0, 1, 0, 0], [0] * 8, [0, 1, 0, 0, 0, 0, 0, 0], [0] * 8, [0] * 8]
ENTROPY = [
    [3.0, 1.0, X, X, 1.0, 1.0, X, X],
    [1.0, 1.0, 1.0, X, X, X, X, X],
    [1.0, X, 1.0, X, X, X, X, X],
    [X] * 8,
    [1.0, 1.0, 1.0, 1.0, X, X, X, X],
]
ADV = [1.0, 0.5, -1.0, -0.5, 0.0]
REWARDS = [1.0, 1.0, 0.0, 1.0, 0.5]
GROUPS = [0, 0, 1, 1, 2]
VALID_SEARCHES = [2.0, 1.0, 0.0, 0.0, 3.0]

POS_RATIOS = [math.exp(d) for d in (-0.5, 0.25, 0.125, -0.5, 0.5, 0.0, 0.0)]
HAND_METRICS = {
    M.LOGP_POS: -8 / 7,
    M.LOGP_NEG: -2.0,
    M.DELTA_TRAJ_POS: (-0.625 + 0.5) / 2,
    M.DELTA_TRAJ_NEG: -0.5,
    M.DELTA_ACTION_POS: (-0.25 - 0.375 + 0.5) / 3,
    M.FRAC_TRAJ_DECREASED_POS: 1 / 2,
    M.FRAC_ACTION_DECREASED_POS: 2 / 3,
    M.ENTROPY_MEAN: 15 / 13,
    M.REWARD_MEAN: 0.7,
    M.REWARD_STD: 0.4,
    M.RESPONSE_LENGTH_MEAN: 13 / 5,
    M.TURNS_MEAN: 6 / 5,
    M.SEARCH_VALID_PER_TRAJ: 6 / 5,
    M.RATIO_POS_MEAN: sum(POS_RATIOS) / 7,
    M.RATIO_POS_MIN: math.exp(-0.5),
    M.RATIO_POS_FRAC_LOW: 2 / 7,
    M.ADV_POS_NEG_MASS_RATIO: 5.5 / 2,
    M.ADV_POS_NEG_MASS_RATIO_ANSWER: INF,
    M.ADV_FRAC_ZERO_STD_GROUPS: 2 / 3,
    M.GARBLED_FRAC: 1 / 5,
}
HAND_ACTIONS: dict[str, list[Any]] = {
    "step": [7] * 6,
    "traj_index": [0, 0, 1, 2, 2, 4],
    "action_index": [0, 1, 0, 0, 1, 0],
    "n_tokens": [2, 2, 3, 1, 1, 4],
    "delta": [-0.25, -0.375, 0.5, -1.0, 0.5, 0.0],
    "old_logp_mean": [-0.75, -0.25, -2.0, -1.0, -3.0, -4.0],
    "advantage": [1.0, 1.0, 0.5, -1.0, -1.0, 0.0],
    "reward": [1.0, 1.0, 1.0, 0.0, 0.0, 0.5],
    "is_answer": [False, True, False, False, False, False],
    "source": ["probe"] * 6,
}


def t64(rows: list[list[float]] | list[float]) -> Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def hand_inputs(**overrides: Any) -> dict[str, Any]:
    old = t64(OLD)
    kwargs: dict[str, Any] = {
        "old_logp": old,
        "new_logp": old + t64(DELTA),
        "mask": torch.tensor(MASK),
        "advantages": t64(ADV),
        "rewards": t64(REWARDS),
        "entropy": t64(ENTROPY),
        "answer_mask": torch.tensor(ANSWER),
        "valid_searches": t64(VALID_SEARCHES),
        "group_ids": torch.tensor(GROUPS),
        "source": "probe",
        "step": 7,
    }
    kwargs.update(overrides)
    return kwargs


def test_hand_case_every_metric() -> None:
    out = measure_step(**hand_inputs())
    assert set(out.metrics) == set(HAND_METRICS)
    for name, expected in HAND_METRICS.items():
        assert out.metrics[name] == pytest.approx(expected, rel=1e-12), name
    assert all(isinstance(v, float) for v in out.metrics.values())


def test_hand_case_action_records() -> None:
    out = measure_step(**hand_inputs())
    assert tuple(out.actions) == ACTION_COLUMNS
    assert out.actions == HAND_ACTIONS
    assert all(type(v) is int for k in ("traj_index", "action_index", "n_tokens") for v in out.actions[k])


def test_float32_and_bfloat16_inputs_are_measured_in_float32() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        kw = hand_inputs()
        kw["old_logp"], kw["new_logp"] = kw["old_logp"].to(dtype), kw["new_logp"].to(dtype)
        out = measure_step(**kw)
        for name, expected in HAND_METRICS.items():  # dyadic values are exact even in bfloat16
            assert out.metrics[name] == pytest.approx(expected, rel=1e-6), (dtype, name)


def test_token_level_advantages_give_the_same_result() -> None:
    adv_bt = t64(ADV).unsqueeze(1).expand(5, 8).clone()
    adv_bt[torch.tensor(MASK) == 0] = NAN  # never read off the mask
    assert measure_step(**hand_inputs(advantages=adv_bt)) == measure_step(**hand_inputs())


def test_empty_response_advantage_is_ignored_for_mass_ratio() -> None:
    # Row 3 is empty: making its advantage huge changes neither the mass ratio nor the neg metrics.
    out = measure_step(**hand_inputs(advantages=t64([1.0, 0.5, -1.0, -100.0, 0.0])))
    assert out.metrics == measure_step(**hand_inputs()).metrics


# ----------------------------------------------------------------------------------------------
# edge cases


@pytest.mark.parametrize("same_object", [True, False])
def test_unchanged_policy_first_minibatch(same_object: bool) -> None:
    kw = hand_inputs()
    kw["new_logp"] = kw["old_logp"] if same_object else kw["old_logp"].clone()
    out = measure_step(**kw)
    assert out.metrics[M.DELTA_TRAJ_POS] == 0.0
    assert out.metrics[M.DELTA_ACTION_POS] == 0.0
    assert out.metrics[M.FRAC_TRAJ_DECREASED_POS] == 0.0  # 0 < eps = 0 is false
    assert out.metrics[M.FRAC_ACTION_DECREASED_POS] == 0.0
    assert out.metrics[M.RATIO_POS_MEAN] == 1.0
    assert out.metrics[M.RATIO_POS_MIN] == 1.0
    assert out.metrics[M.RATIO_POS_FRAC_LOW] == 0.0
    assert out.metrics[M.LOGP_POS] == HAND_METRICS[M.LOGP_POS]


def test_eps_and_clip_eps_thresholds() -> None:
    out = measure_step(**hand_inputs(eps=0.6, clip_eps=0.5))
    assert out.metrics[M.FRAC_TRAJ_DECREASED_POS] == 1.0  # -.625 and .5 both < .6
    assert out.metrics[M.FRAC_ACTION_DECREASED_POS] == 1.0  # -.25 -.375 .5 all < .6
    assert out.metrics[M.RATIO_POS_FRAC_LOW] == 0.0  # exp(-.5) = .61 >= .5
    out = measure_step(**hand_inputs(eps=-0.375))
    assert out.metrics[M.FRAC_ACTION_DECREASED_POS] == 0.0  # strict: -.375 < -.375 is false
    out = measure_step(**hand_inputs(clip_eps=0.0))
    assert out.metrics[M.RATIO_POS_FRAC_LOW] == 2 / 7  # strict: the two r = exp(0) = 1 are not low


def test_garbled_threshold_uses_old_logp_perplexity() -> None:
    assert measure_step(**hand_inputs(garbled_ppl=math.exp(4.0) + 1)).metrics[M.GARBLED_FRAC] == 0.0
    assert measure_step(**hand_inputs(garbled_ppl=math.exp(4.0))).metrics[M.GARBLED_FRAC] == 1 / 5  # >=
    # ppl >= 2: rows 0 (action 0: e^.75), 1 (e^2), 2 (e^1, e^3), 4 (e^4); row 3 (empty) is not.
    assert measure_step(**hand_inputs(garbled_ppl=2.0)).metrics[M.GARBLED_FRAC] == 4 / 5


def test_all_negative_and_zero_advantages_omit_pos_metrics() -> None:
    out = measure_step(**hand_inputs(advantages=t64([-1.0, -0.5, -1.0, -0.5, 0.0])))
    for name in (
        M.LOGP_POS,
        M.DELTA_TRAJ_POS,
        M.DELTA_ACTION_POS,
        M.FRAC_TRAJ_DECREASED_POS,
        M.FRAC_ACTION_DECREASED_POS,
        M.RATIO_POS_MEAN,
        M.RATIO_POS_MIN,
        M.RATIO_POS_FRAC_LOW,
    ):
        assert name not in out.metrics
    assert out.metrics[M.LOGP_NEG] == pytest.approx(-12 / 9)  # rows 0 1 2: (-2 - 6 - 4) / (4 + 3 + 2)
    assert out.metrics[M.DELTA_TRAJ_NEG] == pytest.approx((-0.625 + 0.5 - 0.5) / 3)
    assert out.metrics[M.ADV_POS_NEG_MASS_RATIO] == 0.0
    assert out.metrics[M.ADV_POS_NEG_MASS_RATIO_ANSWER] == 0.0  # row 0 token 5 has A = -1
    assert len(out.actions["step"]) == 6  # records cover every response, whatever its advantage


def test_mass_ratio_no_negative_mass() -> None:
    only_pos = measure_step(**hand_inputs(advantages=t64([1.0, 0.5, 0.0, -3.0, 0.0])))
    assert only_pos.metrics[M.ADV_POS_NEG_MASS_RATIO] == INF  # row 3's -3 is an empty response
    assert M.LOGP_NEG not in only_pos.metrics
    zero = measure_step(**hand_inputs(advantages=torch.zeros(5, dtype=torch.float64)))
    assert math.isnan(zero.metrics[M.ADV_POS_NEG_MASS_RATIO])  # no learning signal at all
    assert math.isnan(zero.metrics[M.ADV_POS_NEG_MASS_RATIO_ANSWER])


def test_mass_ratio_is_per_token_not_per_response() -> None:
    # One GRPO group: 2 correct answers of 2 tokens, 2 wrong ones of 5 tokens. Rewards (1 1 0 0) give
    # A = +-1 (mean .5, std .5): per response the masses are 2 and 2 (ratio exactly 1, as always in
    # GRPO), per token 2 * 2 = 4 and 2 * 5 = 10.
    rewards = t64([1.0, 1.0, 0.0, 0.0])
    adv = (rewards - rewards.mean()) / rewards.std(correction=0)
    assert adv.tolist() == [1.0, 1.0, -1.0, -1.0]
    per_response = adv[adv > 0].sum() / -adv[adv < 0].sum()
    assert per_response == 1.0
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 0, 1, 1, 1]])
    answer = torch.tensor([[0, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0], [0, 0, 1, 1, 1, 0], [0, 0, 1, 0, 1, 1]])
    logp = torch.full((4, 6), -1.0, dtype=torch.float64)
    kw: dict[str, Any] = {"old_logp": logp, "new_logp": logp, "mask": mask, "answer_mask": answer}
    out = measure_step(advantages=adv, **kw).metrics
    assert out[M.ADV_POS_NEG_MASS_RATIO] == 4 / 10 != per_response
    # answer tokens on the mask: 1 + 1 correct, 3 + 2 wrong (row 3 token 2 is off the mask)
    assert out[M.ADV_POS_NEG_MASS_RATIO_ANSWER] == 2 / 5
    # The same advantages given per token (B, T), and per-token calibrated advantages.
    adv_bt = adv.unsqueeze(1).expand(4, 6).clone()
    assert measure_step(advantages=adv_bt, **kw).metrics == out
    adv_bt[0, 0] = 3.0  # row 0 tokens: 3 + 1; mean 2 per response
    adv_bt[2, 5] = -100.0  # off the mask: never read
    out_bt = measure_step(advantages=adv_bt, **kw).metrics
    assert out_bt[M.ADV_POS_NEG_MASS_RATIO] == 6 / 10
    assert out_bt[M.ADV_POS_NEG_MASS_RATIO_ANSWER] == 2 / 5  # row 0's answer token still has A = 1
    no_answer = measure_step(advantages=adv, **{**kw, "answer_mask": torch.zeros(4, 6)}).metrics
    assert M.ADV_POS_NEG_MASS_RATIO_ANSWER not in no_answer  # no answer token on the mask


def test_correct_population() -> None:
    out = measure_step(**hand_inputs(success_threshold=1.0)).metrics
    # rows 0 and 1 (row 3 is correct but empty): the same rows as pos in the hand case
    assert out[M.LOGP_CORRECT] == HAND_METRICS[M.LOGP_POS]
    assert out[M.DELTA_TRAJ_CORRECT] == HAND_METRICS[M.DELTA_TRAJ_POS]
    assert out[M.FRAC_TRAJ_DECREASED_CORRECT] == HAND_METRICS[M.FRAC_TRAJ_DECREASED_POS]
    assert set(out) == set(HAND_METRICS) | {
        M.LOGP_CORRECT,
        M.DELTA_TRAJ_CORRECT,
        M.FRAC_TRAJ_DECREASED_CORRECT,
    }
    # reward >= .5: rows 0 1 4 (row 4 has A = 0: not pos, but correct); 11 tokens, old sum -24
    out = measure_step(**hand_inputs(success_threshold=0.5)).metrics
    assert out[M.LOGP_CORRECT] == -24 / 11
    assert out[M.DELTA_TRAJ_CORRECT] == pytest.approx((-0.625 + 0.5 + 0.0) / 3, rel=1e-12)
    assert out[M.FRAC_TRAJ_DECREASED_CORRECT] == 1 / 3  # strict: row 4's D_traj = 0 is not < 0
    assert (
        measure_step(**hand_inputs(success_threshold=0.5, eps=0.25)).metrics[M.FRAC_TRAJ_DECREASED_CORRECT]
        == 2 / 3
    )
    # all-correct groups leave pos but stay correct
    zero_adv = measure_step(**hand_inputs(success_threshold=1.0, advantages=torch.zeros(5))).metrics
    assert M.LOGP_POS not in zero_adv and zero_adv[M.LOGP_CORRECT] == -8 / 7
    # NaN reward: not correct (row 1 leaves: row 0 alone)
    nan_rw = measure_step(**hand_inputs(success_threshold=1.0, rewards=t64([1.0, NAN, 0.0, 1.0, 0.5])))
    assert nan_rw.metrics[M.LOGP_CORRECT] == -0.5 and nan_rw.metrics[M.DELTA_TRAJ_CORRECT] == -0.625
    # empty population (only the empty row 3 is correct), no threshold, no rewards: omitted
    correct_names = {M.LOGP_CORRECT, M.DELTA_TRAJ_CORRECT, M.FRAC_TRAJ_DECREASED_CORRECT}
    for kw in (
        {"success_threshold": 1.0, "rewards": t64([0.0, 0.0, 0.0, 1.0, 0.5])},
        {"success_threshold": 2.0},
        {"success_threshold": None},
        {"success_threshold": 1.0, "rewards": None},
    ):
        assert not correct_names & set(measure_step(**hand_inputs(**kw)).metrics), kw


def test_correct_population_nan_logp_propagates() -> None:
    new = t64(OLD) + t64(DELTA)
    new[4, 1] = NAN  # row 4: correct at threshold .5, not pos
    out = measure_step(**hand_inputs(new_logp=new, success_threshold=0.5)).metrics
    assert math.isnan(out[M.DELTA_TRAJ_CORRECT]) and math.isnan(out[M.FRAC_TRAJ_DECREASED_CORRECT])
    assert out[M.LOGP_CORRECT] == -24 / 11  # old log-probs are intact
    assert out[M.DELTA_TRAJ_POS] == HAND_METRICS[M.DELTA_TRAJ_POS]


def test_correct_rows() -> None:
    got = correct_rows(t64([1.0, 0.5, NAN, 2.0, -INF, INF]), 1.0)
    assert got.dtype == torch.bool
    assert got.tolist() == [True, False, False, True, False, True]
    assert correct_rows(torch.tensor([0, 1, 2]), 1.0).tolist() == [False, True, True]


def test_empty_batch() -> None:
    empty = torch.zeros(0, 16)
    out = measure_step(old_logp=empty, new_logp=empty, mask=empty, advantages=torch.zeros(0))
    assert out == StepMeasurement()
    assert out.metrics == {}
    assert out.actions == {name: [] for name in ACTION_COLUMNS}


@pytest.mark.parametrize("tokens", [0, 4])
def test_no_mask_tokens(tokens: int) -> None:
    z = torch.zeros(3, tokens)
    out = measure_step(
        old_logp=z,
        new_logp=z,
        mask=z,
        advantages=torch.tensor([1.0, -1.0, 0.0]),
        rewards=torch.tensor([1.0, 0.0, 0.0]),
        entropy=z,
        answer_mask=z,
        group_size=2,
    )
    assert out.metrics == {
        M.RESPONSE_LENGTH_MEAN: 0.0,
        M.TURNS_MEAN: 0.0,
        M.GARBLED_FRAC: 0.0,
        M.REWARD_MEAN: 1 / 3,
        M.REWARD_STD: pytest.approx(math.sqrt(2) / 3),
        M.ADV_FRAC_ZERO_STD_GROUPS: 0.5,  # groups (1, 0) and (0)
    }
    assert out.actions == {name: [] for name in ACTION_COLUMNS}


def test_optional_inputs_absent() -> None:
    out = measure_step(**hand_inputs(rewards=None, entropy=None, answer_mask=None, valid_searches=None))
    absent = {
        M.ADV_POS_NEG_MASS_RATIO_ANSWER,
        M.REWARD_MEAN,
        M.REWARD_STD,
        M.ENTROPY_MEAN,
        M.SEARCH_VALID_PER_TRAJ,
        M.ADV_FRAC_ZERO_STD_GROUPS,
    }
    assert set(out.metrics) == set(HAND_METRICS) - absent
    assert all(math.isnan(r) for r in out.actions["reward"])
    assert out.actions["is_answer"] == [False] * 6


def test_groups() -> None:
    def share(**kw: Any) -> float | None:
        return measure_step(**hand_inputs(**{"group_ids": None, **kw})).metrics.get(
            M.ADV_FRAC_ZERO_STD_GROUPS
        )

    assert share() is None  # no grouping given
    assert share(group_ids=torch.tensor([7, 7, -3, -3, 100])) == 2 / 3  # any labels
    assert share(group_ids=torch.tensor([5, 1, 5, 1, 1])) == 0.0  # (1 0) (1 1 .5): interleaved
    assert share(group_size=5) == 0.0
    assert share(group_size=2) == 2 / 3  # trailing partial block (row 4) is its own group
    assert share(group_size=1) == 1.0
    assert share(group_size=2, group_ids=torch.tensor([0, 0, 0, 0, 0])) == 0.0  # ids win
    nan_reward = share(group_size=2, rewards=t64([1.0, 1.0, NAN, 1.0, 0.5]))
    assert nan_reward is not None and math.isnan(nan_reward)


def test_nan_on_mask_token_propagates() -> None:
    old = t64(OLD)
    old[1, 2] = NAN  # row 1 (A > 0), a mask token
    out = measure_step(**hand_inputs(old_logp=old, new_logp=t64(OLD) + t64(DELTA)))
    nan_metrics = {
        M.LOGP_POS,
        M.DELTA_TRAJ_POS,
        M.DELTA_ACTION_POS,
        M.FRAC_TRAJ_DECREASED_POS,
        M.FRAC_ACTION_DECREASED_POS,
        M.RATIO_POS_MEAN,
        M.RATIO_POS_MIN,
        M.RATIO_POS_FRAC_LOW,
        M.GARBLED_FRAC,
    }
    for name, value in out.metrics.items():
        assert math.isnan(value) == (name in nan_metrics), name
    assert out.metrics[M.LOGP_NEG] == -2.0
    assert math.isnan(out.actions["delta"][2]) and math.isnan(out.actions["old_logp_mean"][2])
    assert out.actions["delta"][:2] == [-0.25, -0.375]


def test_nan_in_inputs_other_than_logp_propagates() -> None:
    ent = t64(ENTROPY)
    ent[4, 0] = NAN
    assert math.isnan(measure_step(**hand_inputs(entropy=ent)).metrics[M.ENTROPY_MEAN])
    out = measure_step(**hand_inputs(rewards=t64([1.0, NAN, 0.0, 1.0, 0.5])))
    assert math.isnan(out.metrics[M.REWARD_MEAN]) and math.isnan(out.metrics[M.REWARD_STD])
    assert math.isnan(out.metrics[M.ADV_FRAC_ZERO_STD_GROUPS])
    out = measure_step(**hand_inputs(advantages=t64([1.0, NAN, -1.0, -0.5, 0.0])))
    assert math.isnan(out.metrics[M.ADV_POS_NEG_MASS_RATIO])
    assert out.metrics[M.DELTA_TRAJ_POS] == -0.625  # a NaN advantage is neither pos nor neg
    vs = measure_step(**hand_inputs(valid_searches=t64([NAN, 1.0, 0.0, 0.0, 3.0])))
    assert math.isnan(vs.metrics[M.SEARCH_VALID_PER_TRAJ])


def test_infinite_logp() -> None:
    new = t64(OLD) + t64(DELTA)
    new[0, 0] = -INF  # the updated policy gives a token of a correct response zero probability
    out = measure_step(**hand_inputs(new_logp=new))
    assert out.metrics[M.DELTA_TRAJ_POS] == -INF
    assert out.metrics[M.FRAC_TRAJ_DECREASED_POS] == 0.5
    assert out.metrics[M.RATIO_POS_MIN] == 0.0
    assert out.metrics[M.RATIO_POS_FRAC_LOW] == 2 / 7
    assert out.actions["delta"][0] == -INF


def test_inputs_requiring_grad_are_not_tracked() -> None:
    kw = hand_inputs()
    new = kw["new_logp"].clone().requires_grad_(True)
    out = measure_step(**hand_inputs(new_logp=new))
    assert out.metrics[M.DELTA_TRAJ_POS] == pytest.approx(HAND_METRICS[M.DELTA_TRAJ_POS])
    assert new.grad is None


def test_action_record_subsample() -> None:
    full = measure_step(**hand_inputs()).actions
    rows = list(zip(*full.values(), strict=True))
    for cap in (0, 1, 4, 6, 100):
        sub = measure_step(**hand_inputs(max_action_records=cap, seed=3)).actions
        assert tuple(sub) == ACTION_COLUMNS
        picked = list(zip(*sub.values(), strict=True))
        assert len(picked) == min(cap, 6)
        assert all(r in rows for r in picked)  # original traj_index and values kept
        assert picked == sorted(picked, key=rows.index)  # original order kept
        again = measure_step(**hand_inputs(max_action_records=cap, seed=3)).actions
        assert again == sub  # deterministic for a seed
    subsets = {
        tuple(measure_step(**hand_inputs(max_action_records=2, seed=s)).actions["delta"]) for s in range(20)
    }
    assert len(subsets) > 3  # different seeds draw different subsets


def test_invalid_inputs_raise() -> None:
    kw = hand_inputs()
    with pytest.raises(ValueError, match="new_logp"):
        measure_step(**hand_inputs(new_logp=kw["new_logp"][:, :4]))
    with pytest.raises(ValueError, match="rewards"):
        measure_step(**hand_inputs(rewards=t64([1.0])))
    with pytest.raises(ValueError, match="advantages"):
        measure_step(**hand_inputs(advantages=t64([1.0, 2.0])))
    with pytest.raises(ValueError, match="source"):
        measure_step(**hand_inputs(source="elsewhere"))
    with pytest.raises(ValueError, match="group_size"):
        measure_step(**hand_inputs(group_ids=None, group_size=0))
    with pytest.raises(ValueError, match="mask"):
        measure_step(**hand_inputs(mask=torch.ones(5)))
    with pytest.raises(ValueError, match="max_action_records"):
        measure_step(**hand_inputs(max_action_records=-1))


def test_metric_names_are_canonical() -> None:
    assert set(measure_step(**hand_inputs()).metrics) <= set(M.CANONICAL_METRICS)


def test_response_advantages() -> None:
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [0, 1, 0, 1]])
    adv = t64([[2.0, 4.0, X, X], [X, X, X, X], [X, -1.0, X, -1.0]])
    assert torch.equal(response_advantages(adv, mask), t64([3.0, 0.0, -1.0]))
    assert torch.equal(response_advantages(t64([1.0, 2.0, 3.0]), mask), t64([1.0, 2.0, 3.0]))
    assert response_advantages(torch.tensor([1, 2, 3]), mask).dtype == torch.float32
    with pytest.raises(ValueError):
        response_advantages(t64([1.0, 2.0]), mask)
    with pytest.raises(ValueError):
        response_advantages(adv[:, :2], mask)


# ----------------------------------------------------------------------------------------------
# naive reference: plain Python over rows and tokens, written from the documented semantics


def _runs(mask_row: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for t, v in enumerate(mask_row):
        if v:
            if runs and runs[-1][-1] == t - 1:
                runs[-1].append(t)
            else:
                runs.append([t])
    return runs


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _share(xs: list[float], hit: Any) -> float | None:
    if not xs:
        return None
    if any(math.isnan(x) for x in xs):
        return NAN
    return sum(1 for x in xs if hit(x)) / len(xs)


def naive_measure(
    *,
    old: list[list[float]],
    new: list[list[float]],
    mask: list[list[int]],
    adv: list[float] | list[list[float]],
    rewards: list[float] | None,
    entropy: list[list[float]] | None,
    answer: list[list[int]] | None,
    valid_searches: list[float] | None,
    groups: list[int] | None,
    success_threshold: float | None,
    eps: float,
    clip_eps: float,
    garbled_ppl: float,
    step: int,
    source: str,
) -> tuple[dict[str, float], dict[str, list[Any]]]:
    batch = len(mask)
    out: dict[str, float | None] = {}
    if batch == 0:
        return {}, {k: [] for k in ACTION_COLUMNS}
    a_resp: list[float] = []
    for b in range(batch):
        if isinstance(adv[b], list):
            vals = [adv[b][t] for t in range(len(mask[b])) if mask[b][t]]  # type: ignore[index]
            a_resp.append(sum(vals) / len(vals) if vals else 0.0)
        else:
            a_resp.append(float(adv[b]))  # type: ignore[arg-type]
    runs = [_runs(row) for row in mask]
    d_tok = [[new[b][t] - old[b][t] for t in range(len(mask[b]))] for b in range(batch)]
    d_act = [[sum(d_tok[b][t] for t in run) for run in runs[b]] for b in range(batch)]
    d_traj = [sum(ds) for ds in d_act]
    pos = [b for b in range(batch) if runs[b] and a_resp[b] > 0]
    neg = [b for b in range(batch) if runs[b] and a_resp[b] < 0]
    for name, rows in ((M.LOGP_POS, pos), (M.LOGP_NEG, neg)):
        out[name] = _mean([old[b][t] for b in rows for run in runs[b] for t in run])
    out[M.DELTA_TRAJ_POS] = _mean([d_traj[b] for b in pos])
    out[M.DELTA_TRAJ_NEG] = _mean([d_traj[b] for b in neg])
    pos_actions = [d for b in pos for d in d_act[b]]
    out[M.DELTA_ACTION_POS] = _mean(pos_actions)
    out[M.FRAC_TRAJ_DECREASED_POS] = _share([d_traj[b] for b in pos], lambda x: x < eps)
    out[M.FRAC_ACTION_DECREASED_POS] = _share(pos_actions, lambda x: x < eps)
    out[M.RESPONSE_LENGTH_MEAN] = _mean([float(sum(1 for v in row if v)) for row in mask])
    out[M.TURNS_MEAN] = _mean([float(len(r)) for r in runs])
    ratios = [math.exp(d_tok[b][t]) for b in pos for run in runs[b] for t in run]
    out[M.RATIO_POS_MEAN] = _mean(ratios)
    if ratios:
        out[M.RATIO_POS_MIN] = NAN if any(math.isnan(r) for r in ratios) else min(ratios)
    out[M.RATIO_POS_FRAC_LOW] = _share(ratios, lambda r: r < 1 - clip_eps)
    if rewards is not None and success_threshold is not None:
        correct = [b for b in range(batch) if runs[b] and rewards[b] >= success_threshold]
        out[M.LOGP_CORRECT] = _mean([old[b][t] for b in correct for run in runs[b] for t in run])
        out[M.DELTA_TRAJ_CORRECT] = _mean([d_traj[b] for b in correct])
        out[M.FRAC_TRAJ_DECREASED_CORRECT] = _share([d_traj[b] for b in correct], lambda x: x < eps)

    def tok_adv(b: int, t: int) -> float:
        return float(adv[b][t]) if isinstance(adv[b], list) else float(adv[b])  # type: ignore[index,arg-type]

    def mass_ratio(tokens: list[tuple[int, int]]) -> float | None:
        if not tokens:
            return None
        values = [tok_adv(b, t) for b, t in tokens]
        pmass = sum(a for a in values if not a <= 0)
        nmass = sum(-a for a in values if not a >= 0)
        if nmass == 0:
            return INF if pmass > 0 else NAN
        return pmass / nmass

    mask_tokens = [(b, t) for b in range(batch) for run in runs[b] for t in run]
    out[M.ADV_POS_NEG_MASS_RATIO] = mass_ratio(mask_tokens)
    if answer is not None:
        out[M.ADV_POS_NEG_MASS_RATIO_ANSWER] = mass_ratio([(b, t) for b, t in mask_tokens if answer[b][t]])
    old_mean = [[sum(old[b][t] for t in run) / len(run) for run in runs[b]] for b in range(batch)]
    garbled: list[float] = []
    for b in range(batch):
        ppl = [math.exp(-m) for m in old_mean[b]]
        garbled.append(NAN if any(math.isnan(p) for p in ppl) else float(any(p >= garbled_ppl for p in ppl)))
    out[M.GARBLED_FRAC] = _mean(garbled)
    if entropy is not None:
        out[M.ENTROPY_MEAN] = _mean([entropy[b][t] for b in range(batch) for run in runs[b] for t in run])
    if rewards is not None:
        mu = sum(rewards) / batch
        out[M.REWARD_MEAN] = mu
        out[M.REWARD_STD] = math.sqrt(sum((r - mu) ** 2 for r in rewards) / batch)
        if groups is not None:
            members: dict[int, list[float]] = {}
            for g, r in zip(groups, rewards, strict=True):
                members.setdefault(g, []).append(r)
            flags = [
                NAN if any(math.isnan(r) for r in rs) else float(max(rs) == min(rs))
                for rs in members.values()
            ]
            out[M.ADV_FRAC_ZERO_STD_GROUPS] = _mean(flags)
    if valid_searches is not None:
        out[M.SEARCH_VALID_PER_TRAJ] = _mean(valid_searches)
    records: dict[str, list[Any]] = {k: [] for k in ACTION_COLUMNS}
    for b in range(batch):
        for k, run in enumerate(runs[b]):
            row = {
                "step": step,
                "traj_index": b,
                "action_index": k,
                "n_tokens": len(run),
                "delta": d_act[b][k],
                "old_logp_mean": old_mean[b][k],
                "advantage": a_resp[b],
                "reward": rewards[b] if rewards is not None else NAN,
                "is_answer": answer is not None and any(answer[b][t] for t in run),
                "source": source,
            }
            for key, value in row.items():
                records[key].append(value)
    return {k: v for k, v in out.items() if v is not None}, records


@dataclass
class Case:
    kwargs: dict[str, Any]
    groups: list[int] | None


@st.composite
def cases(draw: st.DrawFn) -> Case:
    batch = draw(st.integers(0, 7))
    tokens = draw(st.integers(0, 12))
    bits = st.lists(st.sampled_from([0, 1]), min_size=tokens, max_size=tokens)
    mask = draw(st.lists(bits, min_size=batch, max_size=batch))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    dyadic = draw(st.booleans())  # dyadic values: every sum exact, so thresholds are exact too
    dtype = draw(st.sampled_from([torch.float32, torch.float64])) if dyadic else torch.float64
    if dyadic:
        old = -torch.randint(0, 40, (batch, tokens), generator=gen).to(dtype) / 8
        new = old + torch.randint(-4, 5, (batch, tokens), generator=gen).to(dtype) / 8
    else:
        old = -torch.rand(batch, tokens, generator=gen, dtype=dtype) * 5
        new = old + torch.randn(batch, tokens, generator=gen, dtype=dtype) * 0.3
    if draw(st.booleans()) and batch * tokens:  # NaN/inf anywhere (padding included)
        flat = torch.randint(0, batch * tokens, (2,), generator=gen)
        new.view(-1)[flat[0]] = draw(st.sampled_from([NAN, -INF]))
        old.view(-1)[flat[1]] = draw(st.sampled_from([NAN, -INF]))
    if draw(st.integers(0, 9)) == 0:  # first mini-batch of a rollout batch: the very same tensor
        new = old
    adv_vals = st.sampled_from([-1.5, -0.5, 0.0, 0.0, 0.5, 1.0])
    adv = torch.tensor(draw(st.lists(adv_vals, min_size=batch, max_size=batch)), dtype=torch.float64)
    if draw(st.booleans()):
        adv = (
            adv.unsqueeze(1).expand(batch, tokens) + torch.randint(-1, 2, (batch, tokens), generator=gen) / 4
        )
    rewards = torch.randint(0, 3, (batch,), generator=gen).to(torch.float64) / 2
    if batch and draw(st.integers(0, 4)) == 0:  # a NaN reward: not correct
        rewards[draw(st.integers(0, batch - 1))] = NAN
    group_mode = draw(st.sampled_from(["none", "ids", "size"]))
    group_ids = torch.randint(-2, 3, (batch,), generator=gen)
    group_size = draw(st.integers(1, 4))
    groups = {
        "none": None,
        "ids": group_ids.tolist(),
        "size": [b // group_size for b in range(batch)],
    }[group_mode]
    kwargs: dict[str, Any] = {
        "old_logp": old,
        "new_logp": new,
        "mask": torch.tensor(mask, dtype=torch.int64).reshape(batch, tokens),
        "advantages": adv,
        "rewards": rewards if draw(st.booleans()) else None,
        "entropy": torch.rand(batch, tokens, generator=gen) if draw(st.booleans()) else None,
        "answer_mask": torch.randint(0, 2, (batch, tokens), generator=gen) if draw(st.booleans()) else None,
        "valid_searches": torch.randint(0, 4, (batch,), generator=gen).float()
        if draw(st.booleans())
        else None,
        "group_ids": group_ids if group_mode == "ids" else None,
        "group_size": group_size if group_mode == "size" else None,
        "success_threshold": draw(st.sampled_from([None, 0.5, 1.0])),
        "eps": draw(st.sampled_from([0.0, 0.25, -0.125])),
        "clip_eps": draw(st.sampled_from([0.2, 0.5])),
        "garbled_ppl": draw(st.sampled_from([50.0, 4.0])),
        "step": draw(st.integers(0, 10)),
        "source": draw(st.sampled_from(["loss", "probe"])),
    }
    return Case(kwargs, groups if kwargs["rewards"] is not None else None)


def _as_lists(x: Tensor | None) -> Any:
    return None if x is None else x.to(torch.float64).tolist() if x.is_floating_point() else x.tolist()


@settings(max_examples=100, deadline=None)
@given(cases())
def test_matches_naive_reference(case: Case) -> None:
    kw = case.kwargs
    got = measure_step(**kw)
    want_metrics, want_actions = naive_measure(
        old=_as_lists(kw["old_logp"]),
        new=_as_lists(kw["new_logp"]),
        mask=kw["mask"].tolist(),
        adv=_as_lists(kw["advantages"]),
        rewards=_as_lists(kw["rewards"]),
        entropy=_as_lists(kw["entropy"]),
        answer=_as_lists(kw["answer_mask"]),
        valid_searches=_as_lists(kw["valid_searches"]),
        groups=case.groups,
        success_threshold=kw["success_threshold"],
        eps=kw["eps"],
        clip_eps=kw["clip_eps"],
        garbled_ppl=kw["garbled_ppl"],
        step=kw["step"],
        source=kw["source"],
    )
    rtol, atol = (1e-5, 1e-5) if kw["old_logp"].dtype == torch.float32 else (1e-10, 1e-10)
    assert set(got.metrics) == set(want_metrics)
    names = sorted(want_metrics)
    torch.testing.assert_close(
        t64([got.metrics[n] for n in names]),
        t64([want_metrics[n] for n in names]),
        rtol=rtol,
        atol=atol,
        equal_nan=True,
        msg=lambda m: f"{m}\nnames {names}",
    )
    assert tuple(got.actions) == ACTION_COLUMNS
    for key in ("step", "traj_index", "action_index", "n_tokens", "is_answer", "source"):
        assert got.actions[key] == want_actions[key], key
    for key in ("delta", "old_logp_mean", "advantage", "reward"):
        torch.testing.assert_close(
            t64(got.actions[key]), t64(want_actions[key]), rtol=rtol, atol=atol, equal_nan=True, msg=key
        )


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 6).flatmap(
        lambda b: st.lists(st.lists(st.sampled_from([0, 1]), min_size=9, max_size=9), min_size=b, max_size=b)
    )
)
def test_segments_agree_with_actions_module(mask_rows: list[list[int]]) -> None:
    """The compact segmentation is the `trainer_hooks.actions` definition of an action."""
    mask = torch.tensor(mask_rows)
    seg = _segments(mask != 0)
    ids = action_ids(mask)
    assert torch.equal(seg.n_act, num_actions(ids))
    n_max = int(num_actions(ids).max())
    valid = torch.arange(n_max) < seg.n_act.unsqueeze(1)
    lengths = action_sums(mask.to(torch.float64), ids, n_max)
    assert torch.equal(seg.act_row, valid.nonzero()[:, 0])
    assert torch.equal(seg.act_index, valid.nonzero()[:, 1])
    assert torch.equal(seg.act_len, lengths[valid].to(torch.int64))
    assert torch.equal(seg.flat, (ids.reshape(-1) >= 0).nonzero().squeeze(1))


def test_same_tensor_shortcut_keeps_nan_semantics() -> None:
    old = t64(OLD)
    old[0, 0] = -INF  # -inf - -inf is NaN whether or not new_logp is the same object
    for new in (old, old.clone()):
        out = measure_step(**hand_inputs(old_logp=old, new_logp=new))
        assert math.isnan(out.metrics[M.DELTA_TRAJ_POS])
        assert out.metrics[M.LOGP_POS] == -INF

"""The scenario generator: labels, phase shapes, degraded variants, controls."""

from __future__ import annotations

import numpy as np
import pytest

from contracts import metrics as M
from lldmon_lab.labels import collapse_step
from lldmon_lab.scenarios import (
    HOOK_ONLY_METRICS,
    collapse_scenario,
    healthy_scenario,
    noisy_stagnant_scenario,
    scenario_suite,
)
from monitor.detector.stats import median, theil_sen

SEEDS = range(12)


def test_scenario_labels_use_the_one_rule() -> None:
    """Generated scenarios are labelled by `labels.collapse_step` (the rule the lab uses too): a sudden
    drop is labelled once the 10-step mean is below 20 % of its peak, and only if it lasts."""
    steps = np.arange(100)
    reward = np.r_[np.full(50, 0.5), np.zeros(50)]
    assert collapse_step(steps, reward) == 58  # the mean of 10 falls below 0.1 with < 2 good points
    assert collapse_step(steps, np.r_[np.full(50, 0.5), np.zeros(20), np.full(30, 0.5)]) is None
    assert collapse_step(steps, np.full(100, np.nan)) is None
    assert collapse_step(steps, np.r_[np.zeros(50), np.full(50, -1.0)]) is None  # never rose


@pytest.mark.parametrize("seed", SEEDS)
def test_collapse_scenarios_follow_the_paper_shapes(seed: int) -> None:
    s = collapse_scenario(seed)
    v = s.values
    t1, t2 = s.onsets["decay"], s.onsets["collapse"]
    label = s.collapse_step
    assert 45 <= t1 <= 80 and 45 <= t2 - t1 <= 75  # [LLD] ~60 and ~120, randomised
    assert label is not None and label == collapse_step(s.steps, v[M.REWARD_MEAN])
    assert t2 < label <= t2 + 45  # the reward turns down after the collapse onset, then crashes
    x = s.steps.astype(float)
    # phase I flat, phase II declining, phase III accelerating
    assert abs(theil_sen(x[10:t1], v[M.LOGP_POS][10:t1]).slope) < 0.001
    slope2 = theil_sen(x[t1:t2], v[M.LOGP_POS][t1:t2]).slope
    assert -0.005 < slope2 < -0.001
    assert theil_sen(x[t2 : t2 + 20], v[M.LOGP_POS][t2 : t2 + 20]).slope < 2 * slope2
    # reward still rising in phases I-II
    assert theil_sen(x[: t2 - 5], v[M.REWARD_MEAN][: t2 - 5]).slope > 0
    # grad norm and entropy surge vs their own baseline
    assert median(v[M.GRAD_NORM][label : label + 10]) > 5 * median(v[M.GRAD_NORM][:t1])
    assert median(v[M.ENTROPY_MEAN][label : label + 10]) > 1.5 * median(v[M.ENTROPY_MEAN][:t1])
    # > 50 % of correct samples lose likelihood near the collapse, not before phase II
    assert median(v[M.FRAC_TRAJ_DECREASED_POS][label - 5 : label + 15]) > 0.5
    assert median(v[M.FRAC_TRAJ_DECREASED_POS][:t1]) < 0.45
    # response length stays flat
    assert 0.8 < median(v[M.RESPONSE_LENGTH_MEAN][label:]) / median(v[M.RESPONSE_LENGTH_MEAN][:t1]) < 1.2


def test_scenarios_are_deterministic_and_varied() -> None:
    a, b, c = collapse_scenario(7), collapse_scenario(7), collapse_scenario(8)
    assert a.onsets == b.onsets and all(
        np.array_equal(a.values[k], b.values[k], equal_nan=True) for k in a.values
    )
    assert a.onsets != c.onsets or a.collapse_step != c.collapse_step
    onsets = {collapse_scenario(s).onsets["collapse"] for s in SEEDS}
    assert len(onsets) > 6


def test_degraded_variant_has_no_hook_metrics() -> None:
    s = collapse_scenario(1)
    d = s.without_hooks()
    assert s.hooks and not d.hooks and d.name.endswith("-degraded")
    assert not set(d.values) & set(HOOK_ONLY_METRICS)
    assert {M.REWARD_MEAN, M.GRAD_NORM, M.ENTROPY_MEAN, M.KL_OLD, M.CLIP_FRAC, M.RESPONSE_LENGTH_MEAN} <= set(
        d.values
    )
    assert d.collapse_step == s.collapse_step and set(d.present) == set(d.values)


@pytest.mark.parametrize("seed", SEEDS)
def test_controls_do_not_collapse(seed: int) -> None:
    h = healthy_scenario(seed)
    assert h.collapse_step is None and not h.collapses
    g = h.values[M.GRAD_NORM]
    assert g.max() > 3 * median(g)  # isolated spikes
    assert median(h.values[M.REWARD_MEAN][-30:]) > median(h.values[M.REWARD_MEAN][:10])
    noisy = noisy_stagnant_scenario(seed)
    r = noisy.values[M.REWARD_MEAN]
    assert noisy.collapse_step is None
    assert (noisy.values[M.GRAD_NORM] < 0.005).any()  # idle steps (no advantage)
    assert 0.3 < float(np.mean(noisy.values[M.ADV_FRAC_ZERO_STD_GROUPS])) < 0.85
    no_correct = r == 0
    assert np.array_equal(~noisy.present[M.LOGP_POS], no_correct)


def test_suite_composition() -> None:
    runs = scenario_suite(n_collapse=3, n_controls=2, seed=5)
    kinds = [(r.kind, r.hooks) for r in runs]
    assert kinds.count(("collapse", True)) == kinds.count(("collapse", False)) == 3
    assert kinds.count(("healthy", True)) == kinds.count(("noisy_stagnant", False)) == 2
    assert len({r.name for r in runs}) == len(runs)
    long = healthy_scenario(0, n_steps=1000)
    assert long.steps.size == 1000

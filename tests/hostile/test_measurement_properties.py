"""Invariances of the measurement and of LLDS that the naive-reference tests
(tests/trainer_hooks/test_likelihood.py, test_regularizers.py) do not state: the order of the
responses in a batch does not matter, and neither do the values at tokens the mask excludes."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.trainer_hooks.test_likelihood import Case, cases
from trainer_hooks.likelihood import measure_step
from trainer_hooks.regularizers import llds_loss

ROW_ARGS = (
    "old_logp",
    "new_logp",
    "mask",
    "advantages",
    "rewards",
    "entropy",
    "answer_mask",
    "valid_searches",
)


def close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def assert_same_metrics(a: dict[str, float], b: dict[str, float]) -> None:
    assert a.keys() == b.keys()
    bad = {k: (a[k], b[k]) for k in a if not close(a[k], b[k])}
    assert not bad, bad


def permuted(kwargs: dict[str, Any], order: torch.Tensor) -> dict[str, Any]:
    out = dict(kwargs)
    for name in (*ROW_ARGS, "group_ids"):
        if out.get(name) is not None:
            out[name] = out[name][order]
    if kwargs["new_logp"] is kwargs["old_logp"]:
        out["new_logp"] = out["old_logp"]  # keep the "same tensor" shortcut
    return out


@settings(max_examples=40, deadline=None)
@given(cases(), st.randoms(use_true_random=False))
def test_step_metrics_do_not_depend_on_the_order_of_responses(case: Case, rnd: Any) -> None:
    kwargs = dict(case.kwargs)
    if kwargs["group_size"] is not None:  # groups by position: a permutation would regroup
        kwargs["group_size"] = None
    batch = kwargs["old_logp"].shape[0]
    order = list(range(batch))
    rnd.shuffle(order)
    base = measure_step(**kwargs).metrics
    assert_same_metrics(base, measure_step(**permuted(kwargs, torch.tensor(order, dtype=torch.long))).metrics)


@settings(max_examples=40, deadline=None)
@given(cases(), st.floats(-30.0, 0.0))
def test_step_metrics_ignore_tokens_outside_the_mask(case: Case, filler: float) -> None:
    kwargs = dict(case.kwargs)
    off = kwargs["mask"] == 0
    changed = dict(kwargs)
    changed["old_logp"] = kwargs["old_logp"].masked_fill(off, filler)
    changed["new_logp"] = (
        changed["old_logp"]
        if kwargs["new_logp"] is kwargs["old_logp"]
        else kwargs["new_logp"].masked_fill(off, filler - 1.0)
    )
    if kwargs["entropy"] is not None:
        changed["entropy"] = kwargs["entropy"].masked_fill(off, 99.0)
    base = dict(kwargs)  # the same inputs with a fixed filler, so that NaN padding is compared too
    base["old_logp"] = kwargs["old_logp"].masked_fill(off, -1.0)
    base["new_logp"] = (
        base["old_logp"]
        if kwargs["new_logp"] is kwargs["old_logp"]
        else kwargs["new_logp"].masked_fill(off, -2.0)
    )
    if kwargs["entropy"] is not None:
        base["entropy"] = kwargs["entropy"].masked_fill(off, 0.5)
    assert_same_metrics(measure_step(**base).metrics, measure_step(**changed).metrics)


@pytest.mark.parametrize("gate", ["action", "response", "token"])
@settings(max_examples=25, deadline=None)
@given(case=cases(), rnd=st.randoms(use_true_random=False))
def test_llds_loss_is_invariant_to_response_order_and_masked_tokens(gate: str, case: Case, rnd: Any) -> None:
    k = case.kwargs
    old = torch.nan_to_num(k["old_logp"], nan=-1.0, neginf=-50.0)  # LLDS sees finite log-probs
    new = torch.nan_to_num(k["new_logp"], nan=-1.0, neginf=-50.0)
    mask, adv = k["mask"], k["advantages"]
    loss, _ = llds_loss(new, old, mask, adv, gate=gate)  # type: ignore[arg-type]
    order = list(range(old.shape[0]))
    rnd.shuffle(order)
    idx = torch.tensor(order, dtype=torch.long)
    shuffled, _ = llds_loss(new[idx], old[idx], mask[idx], adv[idx], gate=gate)  # type: ignore[arg-type]
    off = mask == 0
    masked, _ = llds_loss(new.masked_fill(off, -7.0), old.masked_fill(off, -3.0), mask, adv, gate=gate)  # type: ignore[arg-type]
    assert close(float(loss), float(shuffled)) and close(float(loss), float(masked))

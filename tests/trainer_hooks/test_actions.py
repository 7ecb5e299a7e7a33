"""Tests of trainer_hooks.actions: an action is a maximal run of mask == 1 inside one row."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_hooks.actions import action_ids, action_sums, num_actions

# row 0: two actions split by tool feedback, then padding; row 1: empty; row 2: action at both ends;
# row 3: one action filling the row.
MASK = torch.tensor(
    [
        [1, 1, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 0],
        [1, 0, 1, 1, 0, 1],
        [1, 1, 1, 1, 1, 1],
    ]
)
IDS = torch.tensor(
    [
        [0, 0, -1, -1, 1, -1],
        [-1, -1, -1, -1, -1, -1],
        [0, -1, 1, 1, -1, 2],
        [0, 0, 0, 0, 0, 0],
    ]
)


def test_action_ids_hand_case() -> None:
    assert torch.equal(action_ids(MASK), IDS)
    assert action_ids(MASK).dtype == torch.int64


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.float32, torch.float64])
def test_action_ids_any_mask_dtype(dtype: torch.dtype) -> None:
    assert torch.equal(action_ids(MASK.to(dtype)), IDS)


def test_num_actions_hand_case() -> None:
    assert num_actions(IDS).tolist() == [2, 0, 3, 1]


def test_action_sums_hand_case() -> None:
    nan = float("nan")
    values = torch.tensor(
        [
            [1.0, 2.0, nan, nan, 4.0, nan],  # NaN off the mask is never read
            [nan] * 6,
            [1.0, 100.0, 2.0, 3.0, 100.0, -1.0],
            [0.5] * 6,
        ]
    )
    expected = torch.tensor([[3.0, 4.0, 0.0], [0.0, 0.0, 0.0], [1.0, 5.0, -1.0], [3.0, 0.0, 0.0]])
    assert torch.equal(action_sums(values, IDS), expected)
    assert torch.equal(action_sums(values, IDS, n_max=5)[:, :3], expected)
    assert action_sums(values, IDS, n_max=5).shape == (4, 5)


def test_action_sums_nan_on_mask_propagates_to_its_action_only() -> None:
    values = torch.ones(4, 6)
    values[2, 3] = float("nan")
    out = action_sums(values, IDS)
    assert out[2, 1].isnan()
    assert out.isnan().sum() == 1


def test_empty_batch() -> None:
    ids = action_ids(torch.zeros(0, 5))
    assert ids.shape == (0, 5)
    assert num_actions(ids).shape == (0,)
    assert action_sums(torch.zeros(0, 5), ids).shape == (0, 0)


def naive_ids(mask: list[list[int]]) -> list[list[int]]:
    out = []
    for row in mask:
        ids, count, prev = [], 0, 0
        for v in row:
            if v and not prev:
                count += 1
            ids.append(count - 1 if v else -1)
            prev = v
        out.append(ids)
    return out


masks = st.integers(1, 8).flatmap(
    lambda t: st.lists(st.lists(st.sampled_from([0, 1]), min_size=t, max_size=t), min_size=0, max_size=6)
)


@settings(max_examples=100, deadline=None)
@given(masks, st.integers(0, 2**31))
def test_against_naive_loop(rows: list[list[int]], seed: int) -> None:
    width = len(rows[0]) if rows else 3
    mask = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), width)
    ids = action_ids(mask)
    want_ids = naive_ids(mask.tolist())
    assert ids.tolist() == want_ids
    want_n = [max(r, default=-1) + 1 for r in want_ids]
    assert num_actions(ids).tolist() == want_n
    values = torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    sums = action_sums(values, ids)
    n_max = max(want_n, default=0)
    assert sums.shape == (len(rows), n_max)
    want = [[0.0] * n_max for _ in rows]
    for b, row in enumerate(want_ids):
        for t, a in enumerate(row):
            if a >= 0:
                want[b][a] += float(values[b, t])
    torch.testing.assert_close(sums, torch.tensor(want, dtype=torch.float64).reshape(len(rows), n_max))


def test_rows_without_tokens_have_no_actions() -> None:
    """Regression: num_actions raised IndexError for T == 0 (max over an empty dimension)."""
    ids = action_ids(torch.zeros(3, 0))
    assert num_actions(ids).tolist() == [0, 0, 0]
    assert action_sums(torch.zeros(3, 0), ids).shape == (3, 0)

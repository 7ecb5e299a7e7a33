"""The probe's rows: sign-stratified round-robin over one uniform permutation, checked against a naive
loop, with the per-sign coverage and within-sign uniformity it promises."""

from __future__ import annotations

from collections import Counter

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_hooks.probe_rows import probe_rows


def naive_probe_rows(advantages: torch.Tensor, mask: torch.Tensor, size: int, seed: int) -> list[int]:
    """Walk the same permutation; deal rows to A > 0, A < 0 and other queues; take them in turns."""
    order = torch.randperm(mask.shape[0], generator=torch.Generator().manual_seed(seed)).tolist()
    queues: list[list[int]] = [[], [], []]
    for row in order:
        has_tokens = bool(mask[row].any())
        a = float(advantages[row]) if advantages.dim() == 1 else float(advantages[row][mask[row] != 0].mean())
        stratum = 0 if has_tokens and a > 0 else 1 if has_tokens and a < 0 else 2
        queues[stratum].append(row)
    picked: list[int] = []
    turn = 0
    while len(picked) < min(size, mask.shape[0]):
        for queue in queues:
            if turn < len(queue) and len(picked) < size:
                picked.append(queue[turn])
        turn += 1
    return sorted(picked)


@settings(max_examples=200, deadline=None)
@given(
    signs=st.lists(st.sampled_from([-1.0, 0.0, 1.0, float("nan")]), min_size=1, max_size=40),
    empty=st.lists(st.booleans(), min_size=40, max_size=40),
    size=st.integers(0, 45),
    seed=st.integers(0, 2**31),
    per_token=st.booleans(),
)
def test_matches_the_naive_round_robin(
    signs: list[float], empty: list[bool], size: int, seed: int, per_token: bool
) -> None:
    batch, width = len(signs), 3
    mask = torch.ones(batch, width)
    mask[torch.tensor(empty[:batch]), :] = 0  # rows without a loss token are "other"
    adv = torch.tensor(signs) * torch.rand(batch, generator=torch.Generator().manual_seed(seed)).add(0.1)
    advantages = adv[:, None].expand(batch, width).clone() if per_token else adv
    got = probe_rows(advantages, mask, size, torch.Generator().manual_seed(seed))
    assert got.dtype == torch.int64
    assert got.tolist() == naive_probe_rows(advantages, mask, size, seed)


def test_two_rows_hold_both_signs_whenever_the_batch_has_them() -> None:
    # 16 rows, one A > 0 and one A < 0 response: a uniform pair would hold both 1 time in 120.
    adv = torch.zeros(16)
    adv[3], adv[11] = 0.7, -0.7
    mask = torch.ones(16, 4)
    for seed in range(50):
        assert probe_rows(adv, mask, 2, torch.Generator().manual_seed(seed)).tolist() == [3, 11]


def test_rows_of_one_sign_are_drawn_uniformly() -> None:
    # 6 A > 0 rows, 2 A < 0 rows, 8 others; 2 rows per draw: one of the six each time, each equally often.
    adv = torch.tensor([1.0] * 6 + [-1.0] * 2 + [0.0] * 8)
    mask = torch.ones(16, 2)
    gen = torch.Generator().manual_seed(7)
    draws = 6000
    counts: Counter[int] = Counter()
    for _ in range(draws):
        rows = probe_rows(adv, mask, 2, gen).tolist()
        assert sum(r < 6 for r in rows) == 1 and sum(6 <= r < 8 for r in rows) == 1
        counts.update(r for r in rows if r < 6)
    expected = draws / 6
    chi2 = sum((counts[r] - expected) ** 2 / expected for r in range(6))
    assert chi2 < 20.5  # chi-square, 5 degrees of freedom: p ~ 0.001


def test_a_stratum_that_runs_out_leaves_its_turns_to_the_others() -> None:
    adv = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])
    rows = probe_rows(adv, torch.ones(5, 2), 3, torch.Generator().manual_seed(0)).tolist()
    assert 0 in rows and len(rows) == 3
    assert probe_rows(adv, torch.ones(5, 2), 9, torch.Generator().manual_seed(0)).tolist() == [0, 1, 2, 3, 4]

"""Which rows of a rollout batch the post-update probe re-scores.

The probe re-scores only a few rows (TRL's default is 2), and its exact deltas are reported per
advantage sign (`lld/delta_traj_pos`, `lld/delta_traj_neg`, ...). Drawn uniformly, two rows of a
batch whose responses are mostly A = 0 (all-correct or all-wrong groups) often hold no A > 0 or no
A < 0 response, and that step gets no delta for the missing sign. Drawing the rows stratified by
sign fixes that without biasing any per-sign metric:

- the rows are taken round-robin from three strata, A > 0, A < 0 and the rest (A = 0, NaN, or no
  loss-mask token), in that order, so 2 rows hold one A > 0 and one A < 0 response whenever the
  batch has both; a stratum that runs out leaves its turns to the others;
- inside a stratum the rows come in the order of one uniform random permutation, so each per-sign
  mean is the mean of a uniform sample of that sign's responses.

Pooled populations (`correct`: reward >= threshold, any sign) mix the strata in the proportions
drawn, not those of the batch: with 2 rows they come from A > 0 responses whenever the batch has any.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainer_hooks.likelihood import response_advantages

STRATA = 3  # A > 0, A < 0, other


def probe_rows(advantages: Tensor, loss_mask: Tensor, size: int, generator: torch.Generator) -> Tensor:
    """Sorted indices of `min(size, B)` rows, stratified by advantage sign (see the module docstring).

    Args:
        advantages: (B,) per-response or (B, T) per-token advantages.
        loss_mask: (B, T) loss mask; a row without a mask token counts as "other".
        size: rows wanted.
        generator: CPU generator for the permutation, so the trainer's own RNG streams are untouched.

    Returns:
        (n,) int64 row indices on `advantages`' device, ascending. No host synchronisation.
    """
    batch = int(loss_mask.shape[0])
    device = loss_mask.device
    n = max(min(size, batch), 0)
    order = torch.randperm(batch, generator=generator).to(device)
    adv = response_advantages(advantages.detach(), loss_mask)
    has_tokens = (loss_mask != 0).any(dim=1)
    stratum = torch.full((batch,), STRATA - 1, dtype=torch.int64, device=device)
    stratum = torch.where(has_tokens & (adv < 0), torch.ones_like(stratum), stratum)
    stratum = torch.where(has_tokens & (adv > 0), torch.zeros_like(stratum), stratum)
    in_order = stratum[order]
    # Rank of each permuted row inside its stratum, then interleave the strata by that rank.
    counts = torch.nn.functional.one_hot(in_order, STRATA).cumsum(dim=0)
    rank = counts.gather(1, in_order[:, None]).squeeze(1) - 1
    key = rank * STRATA + in_order
    chosen = order[torch.argsort(key, stable=True)[:n]]
    return chosen.sort().values

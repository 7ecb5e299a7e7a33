"""Action segmentation: an action is a maximal run of loss-mask == 1 tokens inside one row.

Tool feedback and padding have mask 0 (docs/science.md section 1), so the runs between them are
the model's actions y_0, y_1, ..., y_T. Everything here is vectorised over (batch, tokens).
"""

from __future__ import annotations

import torch
from torch import Tensor


def action_ids(mask: Tensor) -> Tensor:
    """Index of the action each token belongs to.

    Args:
        mask: (B, T) loss mask, any dtype; non-zero = model-generated token.

    Returns:
        (B, T) int64: 0-based action index within the row for mask tokens, -1 elsewhere.
    """
    m = mask != 0
    starts = m.clone()
    starts[:, 1:] &= ~m[:, :-1]
    ids = torch.cumsum(starts, dim=1, dtype=torch.int64) - 1
    return torch.where(m, ids, torch.full_like(ids, -1))


def num_actions(ids: Tensor) -> Tensor:
    """(B,) number of actions per row, from `action_ids` output."""
    if ids.shape[1] == 0:  # max over an empty dim raises
        return torch.zeros(ids.shape[0], dtype=torch.int64, device=ids.device)
    return ids.max(dim=1).values.clamp(min=-1) + 1


def action_sums(values: Tensor, ids: Tensor, n_max: int | None = None) -> Tensor:
    """Sum `values` over the tokens of each action.

    Args:
        values: (B, T) per-token values (floating).
        ids: (B, T) output of `action_ids`.
        n_max: width of the result; defaults to the largest action count in the batch.

    Returns:
        (B, n_max) sums; slots of actions a row does not have are 0.
    """
    if n_max is None:
        n_max = int(num_actions(ids).max().item()) if ids.numel() else 0
    batch = ids.shape[0]
    # Non-action tokens go to an extra trailing slot that is dropped afterwards.
    slot = torch.where(ids >= 0, ids, torch.full_like(ids, n_max))
    out = torch.zeros(batch, n_max + 1, dtype=values.dtype, device=values.device)
    out.scatter_add_(1, slot, torch.where(ids >= 0, values, torch.zeros_like(values)))
    return out[:, :n_max]

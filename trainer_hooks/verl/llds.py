"""The LLDS term the lldmon policy loss adds (docs/science.md section 4): `llds_loss` of the
micro-batch with LLDS-MA's answer span and V_s (from the probe actor, else the last-action fallback),
scaled the way verl normalises its loss (docs/hooks-verl.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import torch
from torch import Tensor

from contracts import metrics as M
from trainer_hooks.actions import action_ids, num_actions
from trainer_hooks.regularizers import llds_loss, ma_beta
from trainer_hooks.verl.config import LossSettings, config_value
from trainer_hooks.verl.loss_extras import LossExtras, usable
from trainer_hooks.verl.names import LLDS_METRICS

__all__ = ["LLDS_OFF", "answer_span", "last_action_mask", "llds_term"]


def last_action_mask(mask: Tensor) -> tuple[Tensor, Tensor]:
    """(B, T) bool mask of each row's last action, and (B,) number of actions per row."""
    ids = action_ids(mask)
    n_act = num_actions(ids)
    return (ids >= 0) & (ids == (n_act - 1)[:, None]), n_act


def answer_span(mask: Tensor, extras: LossExtras | None) -> tuple[Tensor, float]:
    """LLDS-MA's answer mask and V_s for one micro-batch.

    With the probe actor: its `<answer>...</answer>` mask and the rollout's valid-search mean. Without
    (plain `register()` use; verl passes the loss no token ids and no search count): the last action
    of each row as the answer span, and V_s = mean(actions - 1) over rows with an action (every tool
    call counts, valid or not).
    """
    answer = None if extras is None else usable(extras.answer_mask, tuple(mask.shape))
    v_s = None if extras is None else extras.valid_searches_mean
    if answer is not None and v_s is not None:
        return answer, v_s
    last, n_act = last_action_mask(mask)
    if v_s is None:
        rows = n_act > 0
        calls = (n_act - 1).clamp(min=0).double()
        v_s = (calls.sum() / rows.sum().clamp(min=1)).item() if bool(rows.any()) else math.nan
    return (answer if answer is not None else last), v_s


def llds_term(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    lam: float,
    settings: LossSettings,
    config: Any,
    extras: LossExtras | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """`lam * llds_loss(...)` of one micro-batch, scaled like verl's loss (its share of the mini-batch's
    loss tokens, times dp_size, when `global_batch_info` is there), and the `LLDS_METRICS`."""
    answer_mask: Tensor | None = None
    beta = 1.0
    if settings.llds_answer_weight != 1.0:
        answer_mask, v_s = answer_span(mask, extras)
        if settings.llds_answer_weight == "ma":
            beta = ma_beta(v_s, settings.llds_ma_schedule)
        else:
            beta = float(settings.llds_answer_weight)
    reg, stats = llds_loss(
        log_prob,
        old_log_prob,
        mask,
        advantages,
        gate=settings.llds_gate,
        answer_mask=answer_mask,
        answer_weight=beta,
        normalize=settings.llds_normalize,
    )
    info = config_value(config, "global_batch_info", None)
    global_tokens = config_value(info, "batch_num_tokens", None)
    if global_tokens is not None and float(global_tokens) > 0:
        # verl sums micro-batch losses normalised by the mini-batch's token count (times dp_size):
        # weight this micro-batch's term by its share of those tokens, the same way.
        dp_size = float(config_value(info, "dp_size", 1) or 1)
        share = (mask != 0).sum().to(reg.dtype) * (dp_size / float(global_tokens))
        term = (lam * share) * reg
    else:
        term = lam * reg
    loss_value, gated = torch.stack([reg.detach(), stats.gated_action_frac.to(reg.dtype)]).tolist()
    metrics = {
        M.LLDS_ACTIVE: 1.0,
        M.LLDS_LAMBDA: float(lam),
        M.LLDS_LOSS: loss_value,
        M.LLDS_GATED_ACTION_FRAC: gated,
    }
    return term, metrics


LLDS_OFF: Final[Mapping[str, float]] = {name: 0.0 for name in LLDS_METRICS}
"""The LLDS metrics of a call without the term (LLDS off, or failed)."""

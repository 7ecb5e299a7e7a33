"""The measurement inside the lldmon policy loss: one micro-batch's `measure_step` on detached
tensors, returned as verl metrics with 0/1 weights (the same keys on every call, so verl's
data-parallel aggregation accepts them; docs/hooks-verl.md)."""

from __future__ import annotations

import torch
from torch import Tensor

from trainer_hooks.likelihood import measure_step
from trainer_hooks.verl.config import LossSettings
from trainer_hooks.verl.loss_extras import LossExtras, usable
from trainer_hooks.verl.names import (
    ADV_NEG_MASS,
    ADV_NEG_MASS_ANSWER,
    ADV_POS_MASS,
    ADV_POS_MASS_ANSWER,
    DELTA_METRICS,
    LOSS_METRICS,
    XMB_TO_EXACT,
    weight_key,
)

__all__ = ["advantage_masses", "empty_measurement", "measure_loss"]


def measure_loss(
    old: Tensor,
    new: Tensor,
    mask: Tensor,
    advantages: Tensor,
    *,
    drifted: bool,
    settings: LossSettings,
    clip_eps: float,
    extras: LossExtras | None = None,
) -> dict[str, float]:
    """The loss metrics of one micro-batch: each of `LOSS_METRICS` with its 0/1 weight (in-loss deltas
    only where it `drifted`), and the advantage masses (with the answer-span ones when `extras`)."""
    answer_mask = rewards = None
    if extras is not None:
        answer_mask = usable(extras.answer_mask, tuple(mask.shape))
        rewards = usable(extras.rewards, (mask.shape[0],))
    result = measure_step(
        old_logp=old,
        new_logp=new,
        mask=mask,
        advantages=advantages,
        rewards=rewards,
        success_threshold=settings.success_threshold if rewards is not None else None,
        eps=settings.eps,
        clip_eps=clip_eps,
        max_action_records=0,
    ).metrics
    out: dict[str, float] = {}
    for name in LOSS_METRICS:
        # in-loss deltas are the cross-mini-batch proxy: measured as "lld/delta_*", published "lld/xmb/*"
        value = result.get(XMB_TO_EXACT.get(name, name))
        defined = value is not None and (drifted or name not in DELTA_METRICS)
        out[name] = float(value) if defined and value is not None else 0.0
        out[weight_key(name)] = 1.0 if defined else 0.0
    # [CalibAdv] advantage masses per loss-mask token (as measure_step's adv/pos_neg_mass_ratio; a
    # NaN advantage lands in both sums); the mapping derives the ratios from their means.
    out.update(advantage_masses(advantages, mask, answer_mask, with_answer=extras is not None))
    return out


def advantage_masses(
    advantages: Tensor, mask: Tensor, answer_mask: Tensor | None, *, with_answer: bool
) -> dict[str, float]:
    """[CalibAdv] advantage masses over loss-mask tokens (`ADV_POS_MASS`, ...), per micro-batch."""
    valid = mask != 0
    adv = advantages.double()
    adv = adv if adv.dim() == 2 else adv[:, None].expand(valid.shape)
    zero = torch.zeros((), dtype=torch.float64, device=adv.device)
    pos_tok = ~(adv <= 0)
    neg_tok = ~(adv >= 0)
    sums = [
        torch.where(valid & pos_tok, adv, zero).sum(),
        torch.where(valid & neg_tok, -adv, zero).sum(),
    ]
    keys = [ADV_POS_MASS, ADV_NEG_MASS]
    if with_answer:  # the probe actor is in use: the same keys on every call, 0 without a mask
        answer = valid & (answer_mask != 0) if answer_mask is not None else torch.zeros_like(valid)
        sums += [
            torch.where(answer & pos_tok, adv, zero).sum(),
            torch.where(answer & neg_tok, -adv, zero).sum(),
        ]
        keys += [ADV_POS_MASS_ANSWER, ADV_NEG_MASS_ANSWER]
    return dict(zip(keys, torch.stack(sums).tolist(), strict=True))


def empty_measurement(*, with_answer: bool = False) -> dict[str, float]:
    """The keys of `measure_loss`, all 0 (weights too): what a failed measurement returns."""
    out = {name: 0.0 for name in LOSS_METRICS}
    out.update({weight_key(name): 0.0 for name in LOSS_METRICS})
    out[ADV_POS_MASS] = 0.0
    out[ADV_NEG_MASS] = 0.0
    if with_answer:
        out[ADV_POS_MASS_ANSWER] = 0.0
        out[ADV_NEG_MASS_ANSWER] = 0.0
    return out

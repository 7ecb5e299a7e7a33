"""What the probe actor passes to the policy loss per micro-batch: the data verl's policy-loss
interface does not carry (answer spans, rewards, the valid-search count), set around the loss call."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from torch import Tensor

__all__ = ["LossExtras", "current_loss_extras", "loss_extras", "usable"]


@dataclass(frozen=True)
class LossExtras:
    """Per-micro-batch data that verl's policy-loss interface does not carry, set around the loss
    call by the probe actor (`trainer_hooks.verl.actor`) with `loss_extras`.

    Attributes:
        answer_mask: (b, T) like the loss's `response_mask`, non-zero on the tokens of the final
            `<answer>...</answer>` span (LLDS-MA's answer weighting; the CalibAdv answer masses).
        rewards: (b,) scalar reward per row (verl's `token_level_scores` summed): the "correct"
            population (`lld/logp_correct`, `lld/xmb/*_correct`).
        valid_searches_mean: V_s of LLDS-MA: mean valid searches per trajectory over the step's
            batch (all data-parallel ranks), from the rollout's per-row count; None: not known.
    """

    answer_mask: Tensor | None = None
    rewards: Tensor | None = None
    valid_searches_mean: float | None = None


_LOSS_EXTRAS: ContextVar[LossExtras | None] = ContextVar("lldmon_verl_loss_extras", default=None)


@contextlib.contextmanager
def loss_extras(extras: LossExtras | None) -> Iterator[None]:
    """Make `extras` visible to the lldmon policy loss for calls made inside this block."""
    token = _LOSS_EXTRAS.set(extras)
    try:
        yield
    finally:
        _LOSS_EXTRAS.reset(token)


def current_loss_extras() -> LossExtras | None:
    """The `LossExtras` set by the enclosing `loss_extras` block, or None."""
    return _LOSS_EXTRAS.get()


def usable(t: Tensor | None, shape: tuple[int, ...]) -> Tensor | None:
    """`t` if it has `shape`, else None (extras that do not fit the micro-batch are ignored)."""
    return t if t is not None and tuple(t.shape) == shape else None

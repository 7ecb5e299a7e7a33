"""The "lldmon" policy loss for verl: the base policy loss unchanged, the in-loss measurement
(`trainer_hooks.verl.measurement`) and, when switched on, the LLDS term (`trainer_hooks.verl.llds`).
What it returns and why: docs/hooks-verl.md.

Measurement and LLDS failures never crash training: the exception is logged once (logger
`lldmon.verl`) and the step goes on with the base loss. Invalid configuration values raise
(`ValueError`) on the first call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

import torch
from torch import Tensor

from trainer_hooks._warn import WarnOnce
from trainer_hooks.verl.config import LOSS_NAME, LossSettings, config_value
from trainer_hooks.verl.directive import LLDSSwitch
from trainer_hooks.verl.llds import LLDS_OFF, llds_term
from trainer_hooks.verl.loss_extras import current_loss_extras
from trainer_hooks.verl.measurement import empty_measurement, measure_loss

__all__ = ["LOSS_NAME", "register"]

logger = logging.getLogger("lldmon.verl")

_SAME_LOGP_WARNING: Final = (
    "lldmon: old and current log-probs are identical (mean |delta| <= %g) on every micro-batch of "
    "the first %d mini-batches: one policy update per rollout batch. In-loss likelihood deltas are "
    "structurally 0 (no lld/xmb/* metric) and LLDS is a no-op. Fix: more than one update per "
    "rollout batch, actor_rollout_ref.actor.ppo_mini_batch_size < data.train_batch_size "
    "(Search-R1: 256 of 512) or ppo_epochs > 1."
)


class _LossState:
    """Per-registration state: warnings, drift detection, the LLDS switch (with its directive file)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.warn = WarnOnce(logger)
        self.llds = LLDSSwitch(self.warn)
        self.drift_seen = False
        self.minibatches = 0
        self.last_minibatch_key: object = object()

    def drifted(self, old: Tensor, new: Tensor, mask: Tensor, config: Any, atol: float) -> bool:
        """Whether this micro-batch's log-probs moved (mean |new - old| over mask tokens > atol)."""
        m = mask != 0
        count = m.sum()
        diff = torch.where(m, (new.double() - old.double()).abs(), torch.zeros((), dtype=torch.float64))
        mean_abs, n = torch.stack([diff.sum() / count.clamp(min=1).double(), count.double()]).tolist()
        info = config_value(config, "global_batch_info", None)
        key = config_value(info, "batch_num_tokens", None)
        if key is None or key != self.last_minibatch_key:
            self.minibatches += 1
        self.last_minibatch_key = key if key is not None else object()
        if n == 0:
            return False
        moved = not mean_abs <= atol  # NaN counts as moved: NaN deltas are collapse signals
        if moved:
            self.drift_seen = True
        elif not self.drift_seen and self.minibatches >= 2:
            self.warn("same-logp", _SAME_LOGP_WARNING, atol, self.minibatches)
        return moved


def _clip_eps(config: Any) -> float:
    low = config_value(config, "clip_ratio_low", None)
    if low is None:
        low = config_value(config, "clip_ratio", None)
    try:
        return float(low) if low is not None else 0.2
    except (TypeError, ValueError):
        return 0.2


def register(name: str = LOSS_NAME) -> Callable[..., tuple[Any, dict[str, Any]]]:
    """Register the lldmon policy loss with verl under `name` and return it.

    Registration is per process (verl's registry is a module-level dict): in verl's Ray workers it
    happens when `LLDMonPolicyLossConfig` is built, so a driver-side call is only needed for
    checks or single-process use. Registering again replaces the loss (and its warn-once state).
    """
    from verl.trainer.ppo import core_algos

    state = _LossState(name)

    def compute_policy_loss_lldmon(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[Any, dict[str, Any]]:
        settings = LossSettings.from_config(config)
        if settings.base == name:
            raise ValueError(f"policy_loss.lldmon_base must name another policy loss than {name!r}")
        base_fn = core_algos.get_policy_loss_fn(settings.base)
        loss, base_metrics = base_fn(
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=advantages,
            response_mask=response_mask,
            loss_agg_mode=loss_agg_mode,
            config=config,
            rollout_is_weights=rollout_is_weights,
            **kwargs,
        )
        metrics: dict[str, Any] = dict(base_metrics)

        drifted = True
        extras = current_loss_extras()
        try:
            with torch.no_grad():
                old, new = old_log_prob.detach(), log_prob.detach()
                mask, adv = response_mask.detach(), advantages.detach()
                drifted = state.drifted(old, new, mask, config, settings.drift_atol)
                if settings.measure:
                    metrics.update(
                        measure_loss(
                            old,
                            new,
                            mask,
                            adv,
                            drifted=drifted,
                            settings=settings,
                            clip_eps=_clip_eps(config),
                            extras=extras,
                        )
                    )
        except Exception as exc:
            state.warn(
                ("measure", type(exc).__name__),
                "lldmon: likelihood measurement failed, training goes on without it: %r",
                exc,
            )
            if settings.measure:
                metrics.update(empty_measurement(with_answer=extras is not None))

        llds_metrics: Mapping[str, float] = LLDS_OFF
        try:
            lam = state.llds.weight(settings)
            if lam > 0:
                # Only real displacement opens LLDS's gates: on a micro-batch that has not drifted
                # (recomputed old log-probs differ from the current ones by kernel noise only) the
                # reference is the current log-prob itself, so d = 0 and the term is exactly 0.
                term, llds_metrics = llds_term(
                    log_prob,
                    old_log_prob if drifted else log_prob.detach(),
                    advantages,
                    response_mask,
                    lam=lam,
                    settings=settings,
                    config=config,
                    extras=extras,
                )
                loss = loss + term
        except Exception as exc:
            llds_metrics = LLDS_OFF
            state.warn(
                ("llds", type(exc).__name__),
                "lldmon: LLDS failed, training goes on with the %s loss alone: %r",
                settings.base,
                exc,
            )
        metrics.update(llds_metrics)
        return loss, metrics

    compute_policy_loss_lldmon.__qualname__ = compute_policy_loss_lldmon.__name__
    core_algos.register_policy_loss(name)(compute_policy_loss_lldmon)
    return compute_policy_loss_lldmon

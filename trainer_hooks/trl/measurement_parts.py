"""Trainer-agnostic bookkeeping behind `trainer_hooks.trl`: per-step accumulation and the probe store.

Pure torch (no trl/transformers import), so it is unit-testable on its own. `trainer_hooks.trl` feeds
it the tensors TRL's GRPOTrainer already has; the measurement itself is `likelihood.measure_step`.

Vocabulary used here:

- *rollout batch*: the output of one generation (TRL `_generate_and_score_completions`), later
  shuffled and split into micro-batches. Each row carries a run-unique trajectory id (`traj_id`).
- *drift*: a micro-batch drifts when the model has taken at least one optimizer step since its
  rollout batch was generated; only then can log pi_current differ from log pi_old. Micro-batches
  without drift have D == 0 by construction (the first mini-batch of a rollout, docs/science.md section 2), so
  they feed the likelihood *level* metrics but never the delta metrics or the action records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch
from torch import Tensor

from contracts import metrics as M
from trainer_hooks.likelihood import Source, measure_step, response_advantages
from trainer_hooks.probe_rows import probe_rows

__all__ = [
    "EXACT_DELTA_METRICS",
    "RATIO_METRICS",
    "TRL_PROVIDED_METRICS",
    "MicroBatch",
    "ProbeBatch",
    "StepAccumulator",
    "StepResult",
    "in_loss_deltas_structurally_zero",
    "loss_mask",
]

EXACT_DELTA_METRICS: Final = frozenset(M.EXACT_TO_XMB)
"""Delta metrics of `measure_step` (they depend on log pi_new). Published under these names only by
the probe (the exact delta of Def. 4.1); in-loss values go out as `M.EXACT_TO_XMB[name]`."""

RATIO_METRICS: Final = frozenset({M.RATIO_POS_MEAN, M.RATIO_POS_MIN, M.RATIO_POS_FRAC_LOW})
"""Importance ratios pi_theta / pi_old on A > 0 tokens: what the loss itself sees, so in-loss only."""

_NEW_LOGP_METRICS: Final = EXACT_DELTA_METRICS | RATIO_METRICS
"""Metrics of `measure_step` that depend on log pi_new (all others depend on log pi_old only)."""

TRL_PROVIDED_METRICS: Final = frozenset(
    {M.REWARD_MEAN, M.REWARD_STD, M.ADV_FRAC_ZERO_STD_GROUPS, M.ENTROPY_MEAN, M.RESPONSE_LENGTH_MEAN}
)
"""Canonical metrics TRL itself logs every step (mapped by `trainer_hooks.trl.TRL_TO_CANONICAL`).

The in-loss measurement drops them: TRL's values are gathered over all processes and are what the
user also sees in W&B, so one series never mixes two estimators."""


def loss_mask(batch: Mapping[str, Any]) -> Tensor:
    """TRL's loss mask of a rollout batch or micro-batch: `completion_mask * tool_mask` (0 on
    tool-output tokens)."""
    mask: Tensor = batch["completion_mask"]
    return mask * batch["tool_mask"] if "tool_mask" in batch else mask


def in_loss_deltas_structurally_zero(
    gradient_accumulation_steps: int, steps_per_generation: int, num_iterations: int
) -> bool:
    """True when every micro-batch is trained before the first update after its rollout.

    TRL (`GRPOTrainer._generate_and_score_completions`) then skips `old_per_token_logps` and uses
    the current log-probs detached as "old", so every in-loss D is exactly 0. It is the case iff
    the generation period `steps_per_generation * num_iterations` divides the accumulation steps
    (e.g. TRL's default `steps_per_generation == gradient_accumulation_steps`, `num_iterations == 1`).
    """
    return gradient_accumulation_steps % (steps_per_generation * num_iterations) == 0


def _pad_cat(parts: Sequence[Tensor], width: int, value: float) -> Tensor:
    """Concatenate (b_i, T_i) tensors along dim 0, right-padding each to `width` with `value`."""
    padded = [
        p if p.shape[1] == width else torch.nn.functional.pad(p, (0, width - p.shape[1]), value=value)
        for p in parts
    ]
    return torch.cat(padded, dim=0)


@dataclass(frozen=True)
class MicroBatch:
    """Detached tensors of one micro-batch, as seen inside the loss.

    Attributes:
        new_logp: (b, T) log pi_current of the taken tokens (the loss's own forward pass).
        old_logp: (b, T) log pi_old (rollout-time); `new_logp` itself when TRL has no separate old.
        mask: (b, T) loss mask (completion_mask * tool_mask).
        advantages: (b,) or (b, T).
        rewards: (b,) or None.
        traj_id: (b,) int64 run-unique trajectory ids.
        drift: whether an optimizer step happened since the rollout (see module docstring).
    """

    new_logp: Tensor
    old_logp: Tensor
    mask: Tensor
    advantages: Tensor
    rewards: Tensor | None
    traj_id: Tensor
    drift: bool


@dataclass
class StepResult:
    """Metrics (canonical names) and action-record columns (or None) of one optimizer step."""

    metrics: dict[str, float]
    actions: dict[str, list[Any]] | None


def _remap_traj(actions: dict[str, list[Any]], traj_id: Tensor) -> dict[str, list[Any]]:
    """Replace row positions in `traj_index` by the rows' run-unique trajectory ids."""
    if actions["traj_index"]:
        ids = traj_id.cpu().tolist()
        actions["traj_index"] = [ids[i] for i in actions["traj_index"]]
    return actions


class StepAccumulator:
    """Collects the micro-batches of one optimizer step and measures them in one go.

    One `measure_step` call over all rows gives the level metrics (log pi_old of pos/neg/correct
    responses, advantage mass, garbled share, turns); the cross-mini-batch deltas (published as
    `lld/xmb/*`, never under the exact names), the importance ratios and the `source="loss"` action
    records come from the drifted rows only (a second call when the step mixes both kinds).
    """

    def __init__(
        self,
        *,
        eps: float = 0.0,
        clip_eps: float = 0.2,
        max_action_records: int | None = 256,
        success_threshold: float | None = M.DEFAULT_SUCCESS_THRESHOLD,
    ) -> None:
        self.eps = eps
        self.clip_eps = clip_eps
        self.max_action_records = max_action_records
        self.success_threshold = success_threshold
        self._parts: list[MicroBatch] = []

    def __len__(self) -> int:
        return len(self._parts)

    def add(self, part: MicroBatch) -> None:
        self._parts.append(part)

    def clear(self) -> None:
        self._parts.clear()

    def finish(self, step: int) -> StepResult | None:
        """Measure and clear the collected micro-batches; None if there were none."""
        parts, self._parts = self._parts, []
        if not parts:
            return None
        all_rows = self._measure(parts, step)
        metrics = {k: v for k, v in all_rows.metrics.items() if k not in _NEW_LOGP_METRICS}
        drifted = [p for p in parts if p.drift]
        actions = None
        if drifted:
            result = all_rows if len(drifted) == len(parts) else self._measure(drifted, step)
            for k, v in result.metrics.items():
                if k in RATIO_METRICS:
                    metrics[k] = v
                elif k in EXACT_DELTA_METRICS:
                    metrics[M.EXACT_TO_XMB[k]] = v
            actions = result.actions
        for name in TRL_PROVIDED_METRICS:
            metrics.pop(name, None)
        return StepResult(metrics=metrics, actions=actions)

    def _measure(self, parts: Sequence[MicroBatch], step: int) -> StepResult:
        """One `measure_step` call; deltas and records are meaningful (and kept) only if all rows drift."""
        width = max(p.mask.shape[1] for p in parts)
        mask = _pad_cat([p.mask for p in parts], width, 0)
        old = _pad_cat([p.old_logp for p in parts], width, 0.0)
        drift_all = all(p.drift for p in parts)
        new = _pad_cat([p.new_logp for p in parts], width, 0.0) if drift_all else old
        adv = torch.cat([response_advantages(p.advantages, p.mask) for p in parts])
        rewards = None
        if all(p.rewards is not None for p in parts):
            rewards = torch.cat([p.rewards for p in parts if p.rewards is not None])
        traj_id = torch.cat([p.traj_id for p in parts])
        out = measure_step(
            old_logp=old,
            new_logp=new,
            mask=mask,
            advantages=adv,
            rewards=rewards,
            eps=self.eps,
            clip_eps=self.clip_eps,
            max_action_records=self.max_action_records if drift_all else 0,
            seed=step,
            source="loss",
            step=step,
            success_threshold=self.success_threshold,
        )
        return StepResult(
            metrics=out.metrics, actions=_remap_traj(out.actions, traj_id) if drift_all else None
        )


@dataclass
class ProbeBatch:
    """A sign-stratified random subset of one rollout batch, kept for exact post-update re-scoring.

    Attributes:
        input_ids, attention_mask: (n, P + T) prompt + completion, as TRL scores them.
        logits_to_keep: T, the completion width.
        mask: (n, T) loss mask.
        advantages: (n,) per-response advantages.
        rewards: (n,) or None.
        traj_id: (n,) run-unique trajectory ids.
        old_logp: (n + 1, T) rollout-time log-probs; the extra last row is a scratch slot for
            sync-free scatter from micro-batches (see `capture`).
        known: (n + 1,) bool, rows whose `old_logp` is filled.
        lookup: (B,) probe position of each row of the rollout batch (by `traj_id - first_id`),
            n for rows that are not probed.
        first_id: traj id of the rollout batch's row 0.
    """

    input_ids: Tensor
    attention_mask: Tensor
    logits_to_keep: int
    mask: Tensor
    advantages: Tensor
    rewards: Tensor | None
    traj_id: Tensor
    old_logp: Tensor
    known: Tensor
    lookup: Tensor
    first_id: int

    @classmethod
    def select(
        cls,
        *,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        completion_ids: Tensor,
        completion_mask: Tensor,
        loss_mask: Tensor,
        advantages: Tensor,
        rewards: Tensor | None,
        traj_id: Tensor,
        old_logp: Tensor | None,
        size: int,
        generator: torch.Generator,
    ) -> ProbeBatch:
        """Pick `size` rows stratified by advantage sign (`trainer_hooks.probe_rows`: one A > 0 and
        one A < 0 response whenever the batch has both), uniformly within each sign.

        With `old_logp` (TRL computed it at rollout time) every probe row is known at once; without
        it the rows are filled by `capture` from the loss's own forward pass, which for such batches
        runs before any update and therefore *is* the rollout-time log-prob.
        """
        batch, width = completion_ids.shape
        device = completion_ids.device
        rows = probe_rows(advantages, loss_mask, size, generator)
        n = rows.shape[0]
        old = torch.zeros(n + 1, width, dtype=torch.float32, device=device)
        known = torch.zeros(n + 1, dtype=torch.bool, device=device)
        if old_logp is not None:
            old[:n] = old_logp[rows].detach().float()
            known[:n] = True
        lookup = torch.full((batch,), n, dtype=torch.int64, device=device)
        lookup[rows] = torch.arange(n, device=device)
        return cls(
            input_ids=torch.cat([prompt_ids[rows], completion_ids[rows]], dim=1),
            attention_mask=torch.cat([prompt_mask[rows], completion_mask[rows]], dim=1),
            logits_to_keep=width,
            mask=loss_mask[rows],
            advantages=response_advantages(advantages[rows], loss_mask[rows]),
            rewards=rewards[rows] if rewards is not None else None,
            traj_id=traj_id[rows],
            old_logp=old,
            known=known,
            lookup=lookup,
            first_id=int(traj_id[0].item()) if batch else 0,
        )

    @property
    def size(self) -> int:
        return int(self.traj_id.shape[0])

    def capture(self, traj_id: Tensor, logp: Tensor) -> None:
        """Store rollout-time log-probs of the probe rows among a micro-batch (no host sync)."""
        pos = self.lookup[traj_id - self.first_id]
        self.old_logp.index_copy_(0, pos, logp.detach().to(self.old_logp.dtype))
        self.known.index_fill_(0, pos, True)

    def measure(
        self,
        new_logp: Tensor,
        *,
        step: int,
        eps: float = 0.0,
        clip_eps: float = 0.2,
        max_action_records: int | None = 256,
        success_threshold: float | None = M.DEFAULT_SUCCESS_THRESHOLD,
        source: Source = "probe",
    ) -> StepResult:
        """Exact deltas (Def. 4.1) of the known rows: `new_logp` (n, T) from the updated model vs
        rollout time, under the canonical `lld/delta_*` / `lld/frac_*_decreased_*` names."""
        n = self.size
        mask = self.mask * self.known[:n, None].to(self.mask.dtype)
        out = measure_step(
            old_logp=self.old_logp[:n],
            new_logp=new_logp,
            mask=mask,
            advantages=self.advantages,
            rewards=self.rewards,
            eps=eps,
            clip_eps=clip_eps,
            max_action_records=max_action_records,
            seed=step,
            source=source,
            step=step,
            success_threshold=success_threshold,
        )
        metrics = {k: v for k, v in out.metrics.items() if k in EXACT_DELTA_METRICS}
        return StepResult(metrics=metrics, actions=_remap_traj(out.actions, self.traj_id))

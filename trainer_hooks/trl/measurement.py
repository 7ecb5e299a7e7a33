"""The measurement driver of `MonitoredGRPOTrainer`: what it measures at each TRL seam, when, and
what it queues for the sink (docs/science.md section 2; design notes in docs/hooks-trl.md).

Owned by the trainer, which calls it from its overrides (rollout, loss, after the optimizer step,
before TRL logs); `LLDMonitorCallback` drains its queues. Every part runs under its own `Guard`:
a failure is logged once and switches that part off, never training.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import torch
from torch import Tensor

from trainer_hooks._guard import Guard
from trainer_hooks.anchors import AnchorSet
from trainer_hooks.trl.config import MonitorSettings
from trainer_hooks.trl.measurement_parts import (
    MicroBatch,
    ProbeBatch,
    StepAccumulator,
    StepResult,
    in_loss_deltas_structurally_zero,
    loss_mask,
)

__all__ = ["MULTIMODAL_KEYS", "MeasurementDriver"]

logger = logging.getLogger("lldmon.trl")

MULTIMODAL_KEYS: Final = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)
"""Rollout columns of multimodal batches: such rollouts are neither probed nor anchored."""

Score = Callable[[Tensor, Tensor, int], Tensor]
"""(input_ids, attention_mask, logits_to_keep) -> (n, logits_to_keep) float log-probs, no grad."""


class MeasurementDriver:
    """Likelihood measurement of one `MonitoredGRPOTrainer` (see the module docstring).

    Args:
        trainer: the GRPOTrainer (its state, accelerator, metric buffers, reward weights, clip eps).
        settings: validated options.
        score: re-scores rows with the current model (GRPOTrainer's own per-token log-probs, no grad).
    """

    def __init__(self, trainer: Any, settings: MonitorSettings, score: Score) -> None:
        self.trainer = trainer
        self.settings = settings
        self._score = score
        self.measure_guard = Guard("lldmon likelihood measurement", logger)
        self.probe_guard = Guard("lldmon post-update probe", logger)
        self.anchor_guard = Guard("lldmon anchor set", logger)
        self.scalar_guard = Guard("lldmon per-step TRL scalars", logger)
        self._warned_probe_off = False
        self.accumulator = StepAccumulator(
            eps=settings.eps,
            clip_eps=float(trainer.epsilon_low),
            max_action_records=settings.max_action_records,
            success_threshold=settings.success_threshold,
        )
        self.anchors: AnchorSet | None = None
        if (
            settings.success_threshold is not None
            and settings.anchor_size > 0
            and settings.anchor_interval > 0
        ):
            if int(trainer.accelerator.num_processes) == 1:
                self.anchors = AnchorSet(
                    capacity=settings.anchor_size,
                    success_threshold=settings.success_threshold,
                    eps=settings.eps,
                )
            else:
                logger.warning(
                    "lldmon: the anchor set (lld/anchor/*) is single-process only for now; it is off in "
                    "this %d-process job",
                    int(trainer.accelerator.num_processes),
                )
        self._rollouts = 0
        self.probe: ProbeBatch | None = None
        self._probe_gen = torch.Generator(device="cpu").manual_seed(settings.probe_seed)
        self._metrics: dict[int, dict[str, float]] = {}
        self._actions: list[tuple[int, dict[str, list[Any]]]] = []
        # per-step TRL scalars
        self._metric_counts: dict[str, int] = {}
        self._step_keys: set[str] = set()
        self._loss_seen = 0.0
        self._last_step_sent = -1

    # ------------------------------------------------------------------------------------------
    # state

    @property
    def active(self) -> bool:
        """Whether the in-loss measurement is on (no failure switched it off)."""
        return self.measure_guard.enabled

    @property
    def probe_enabled(self) -> bool:
        s = self.settings
        return s.probe_size > 0 and s.probe_interval > 0 and self.probe_guard.enabled

    @property
    def in_loss_deltas_zero(self) -> bool:
        """True when TRL's schedule makes every in-loss delta exactly 0 (docs/hooks-trl.md)."""
        args: Any = self.trainer.args  # a GRPOConfig
        return in_loss_deltas_structurally_zero(
            int(args.gradient_accumulation_steps),
            int(args.steps_per_generation),
            int(self.trainer.num_iterations),
        )

    def _is_main(self) -> bool:
        return bool(self.trainer.accelerator.is_main_process)

    def train_begin(self) -> None:
        """Warn once when no exact delta will ever arrive (the probe is off)."""
        if self.probe_enabled or self._warned_probe_off:
            return
        self._warned_probe_off = True
        logger.warning(
            "lldmon: the post-update probe is off (probe_size=%d, probe_interval=%d): no exact "
            "lld/delta_* metric (Def. 4.1) will be reported%s. Set probe_size and probe_interval > 0.",
            self.settings.probe_size,
            self.settings.probe_interval,
            "" if self.in_loss_deltas_zero else " (only the cross-mini-batch proxy lld/xmb/*)",
        )

    # ------------------------------------------------------------------------------------------
    # rollout (GRPOTrainer._generate_and_score_completions)

    def tag_rollout(self, output: dict[str, Any], rewards_per_func: Tensor | None) -> None:
        """Tag each row with a run-unique trajectory id and its reward, offer correct rows to the
        anchor set, and draw the probe subset."""
        if not (self.measure_guard.enabled or self.probe_enabled):
            return
        with self.measure_guard():
            self._tag_rollout(output, rewards_per_func)

    def _tag_rollout(self, output: dict[str, Any], rewards_per_func: Tensor | None) -> None:
        trainer = self.trainer
        completion_ids: Tensor = output["completion_ids"]
        batch, device = completion_ids.shape[0], completion_ids.device
        world, rank = int(trainer.accelerator.num_processes), int(trainer.accelerator.process_index)
        first = (self._rollouts * world + rank) * batch
        self._rollouts += 1
        traj_id = torch.arange(first, first + batch, dtype=torch.int64, device=device)
        output["lldmon_traj_id"] = traj_id
        rewards = self._local_rewards(rewards_per_func, batch, rank)
        if rewards is not None:
            output["lldmon_rewards"] = rewards
        mask = loss_mask(output)
        multimodal = any(key in output for key in MULTIMODAL_KEYS)
        anchors = self.anchors
        if (
            anchors is not None
            and rewards is not None
            and not anchors.full
            and not multimodal
            and self.anchor_guard.enabled
        ):
            with self.anchor_guard():
                anchors.offer(
                    prompt_ids=output["prompt_ids"],
                    prompt_mask=output["prompt_mask"],
                    completion_ids=completion_ids,
                    completion_mask=output["completion_mask"],
                    loss_mask=mask,
                    rewards=rewards,
                    step=int(trainer.state.global_step),
                )
        self.probe = None
        if self.probe_enabled and not multimodal:
            with self.probe_guard():
                self.probe = ProbeBatch.select(
                    prompt_ids=output["prompt_ids"],
                    prompt_mask=output["prompt_mask"],
                    completion_ids=completion_ids,
                    completion_mask=output["completion_mask"],
                    loss_mask=mask,
                    advantages=output["advantages"],
                    rewards=rewards,
                    traj_id=traj_id,
                    old_logp=output.get("old_per_token_logps"),
                    size=self.settings.probe_size,
                    generator=self._probe_gen,
                )

    def _local_rewards(self, rewards_per_func: Tensor | None, batch: int, rank: int) -> Tensor | None:
        """This process's rewards, weighted and summed over reward functions as TRL logs them."""
        if rewards_per_func is None or rewards_per_func.dim() != 2:
            return None
        weights = self.trainer.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards = torch.where(
            torch.isnan(rewards_per_func).all(dim=1), torch.full_like(rewards, math.nan), rewards
        )
        local = rewards[rank * batch : (rank + 1) * batch]
        return local if local.shape[0] == batch else None

    # ------------------------------------------------------------------------------------------
    # loss (GRPOTrainer._compute_loss)

    def wants_loss(self, inputs: Mapping[str, Any]) -> bool:
        """Whether this micro-batch's log-probs are needed (in-loss measurement or probe capture)."""
        return (self.active or self.probe is not None) and "lldmon_traj_id" in inputs

    def collect(self, inputs: Mapping[str, Any], logp: Tensor, drifted: bool) -> None:
        """Fill the probe's rollout-time log-probs, and queue the micro-batch (main process)."""
        new = logp.detach()
        traj_id: Tensor = inputs["lldmon_traj_id"]
        old_in: Tensor | None = inputs.get("old_per_token_logps")
        probe = self.probe
        if old_in is None and probe is not None and self.probe_guard.enabled:
            with self.probe_guard():
                probe.capture(traj_id, new)
        if self.measure_guard.enabled and self._is_main():
            with self.measure_guard():
                new_copy = new.clone()
                self.accumulator.add(
                    MicroBatch(
                        new_logp=new_copy,
                        old_logp=old_in.detach() if old_in is not None else new_copy,
                        mask=loss_mask(inputs).detach(),
                        advantages=inputs["advantages"].detach(),
                        rewards=inputs.get("lldmon_rewards"),
                        traj_id=traj_id,
                        drift=old_in is not None and drifted,
                    )
                )

    # ------------------------------------------------------------------------------------------
    # after the optimizer step (callback on_step_end, every process)

    def step_end(self, step: int) -> None:
        """Measure the step's micro-batches, run the probe and (at its interval) the anchor set."""
        if self.measure_guard.enabled and self._is_main():
            with self.measure_guard():
                self._queue(step, self.accumulator.finish(step))
        self.accumulator.clear()
        s = self.settings
        if self.probe_enabled and step % s.probe_interval == 0 and self.probe is not None:
            with self.probe_guard():
                self._run_probe(step, self.probe)
        anchors = self.anchors
        if (
            anchors is not None
            and len(anchors) > 0
            and step % s.anchor_interval == 0
            and self.anchor_guard.enabled
        ):
            with self.anchor_guard():
                batch = anchors.batch(self.trainer.accelerator.device)
                metrics = anchors.measure(
                    self._score(batch.input_ids, batch.attention_mask, batch.logits_to_keep), step
                )
                self.queue_metrics(step, metrics)

    def _run_probe(self, step: int, probe: ProbeBatch) -> None:
        new = self._score(probe.input_ids, probe.attention_mask, probe.logits_to_keep)
        if self._is_main():
            result = probe.measure(
                new,
                step=step,
                eps=self.settings.eps,
                clip_eps=float(self.trainer.epsilon_low),
                max_action_records=self.settings.max_action_records,
                success_threshold=self.settings.success_threshold,
            )
            self._queue(step, result)

    # ------------------------------------------------------------------------------------------
    # queues (drained by LLDMonitorCallback.send)

    def queue_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        if metrics:
            self._metrics.setdefault(step, {}).update(metrics)

    def _queue(self, step: int, result: StepResult | None) -> None:
        if result is None:
            return
        self.queue_metrics(step, result.metrics)
        if result.actions is not None and result.actions["step"]:
            self._actions.append((step, result.actions))

    def drain_metrics(self, step: int, final: bool) -> dict[int, dict[str, float]]:
        ready = {s: m for s, m in self._metrics.items() if final or s <= step}
        for s in ready:
            del self._metrics[s]
        return ready

    def drain_actions(self, step: int, final: bool) -> list[tuple[int, dict[str, list[Any]]]]:
        ready = [(s, a) for s, a in self._actions if final or s <= step]
        self._actions = [(s, a) for s, a in self._actions if not (final or s <= step)]
        return ready

    # ------------------------------------------------------------------------------------------
    # per-step TRL scalars (Trainer._maybe_log_save_evaluate, before and after)

    def keys_sent_per_step(self) -> set[str]:
        return self._step_keys

    def step_scalars(
        self, step: int, tr_loss: Any, grad_norm: Any, learning_rate: Any
    ) -> dict[str, object] | None:
        """TRL's scalars of the optimizer step that just ended, under TRL's own log keys; None when
        they were already taken for this step (transformers calls its hook again at an epoch's end).

        `GRPOTrainer._metrics["train"]` entries appended since the last step, averaged as TRL's
        `log` averages them (NaN entries skipped; all NaN -> NaN), plus the step's loss (the growth
        of transformers' running `tr_loss`: this process's), grad norm, learning rate and epoch.
        """
        if step == self._last_step_sent or not self.scalar_guard.enabled or not self._is_main():
            return None
        self._last_step_sent = step
        logs: dict[str, object] = {}
        with self.scalar_guard():
            buffers: Any = self.trainer._metrics["train"]
            for key, values in buffers.items():
                new = values[self._metric_counts.get(key, 0) :]
                if not new:
                    continue
                valid = [float(v) for v in new if not math.isnan(float(v))]
                logs[key] = sum(valid) / len(valid) if valid else math.nan
            if isinstance(tr_loss, Tensor):
                logs["loss"] = float(tr_loss.item()) - self._loss_seen
            if grad_norm is not None:
                logs["grad_norm"] = grad_norm
            if learning_rate is not None:
                logs["learning_rate"] = learning_rate
            epoch = self.trainer.state.epoch
            if epoch is not None:
                logs["epoch"] = epoch
            self._step_keys.update(logs)
            return logs
        return None

    def after_log_save_evaluate(self, tr_loss: Any) -> None:
        """Remember where transformers' running loss and TRL's buffers stand after the step."""
        if self.scalar_guard.enabled:
            with self.scalar_guard():
                self._loss_seen = float(tr_loss.item()) if isinstance(tr_loss, Tensor) else 0.0
                self.snapshot_metric_counts()

    def snapshot_metric_counts(self) -> None:
        """Called after TRL's `log`, which clears the buffers it averaged."""
        buffers: Any = self.trainer._metrics["train"]
        self._metric_counts = {key: len(values) for key, values in buffers.items()}

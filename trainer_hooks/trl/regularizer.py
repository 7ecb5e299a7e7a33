"""The LLDS / SAPO driver of `MonitoredGRPOTrainer`: which term is in force for each optimizer step
(static or from the service's directive), the term added to TRL's loss, and its per-step metrics
(docs/science.md sections 4-5; options and scaling in docs/hooks-trl.md).

Owned by the trainer: it calls `tag_rollout` and `add` from its overrides; `RegularizerCallback`
calls `check_config`, `step_begin` and `step_end` on every process.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import torch
from torch import Tensor

from trainer_hooks._guard import Guard
from trainer_hooks._warn import WarnOnce
from trainer_hooks.regularizers import LLDSStats, SAPOStats, llds_loss, sapo_kl_loss
from trainer_hooks.trl.measurement_parts import in_loss_deltas_structurally_zero, loss_mask
from trainer_hooks.trl.regularizer_parts import (
    LLDSMode,
    LLDSSwitch,
    RegularizerSettings,
    RegularizerStep,
    answer_token_mask,
    ma_answer_weight,
    read_directive,
    term_scale,
)

__all__ = ["ANSWER_MASK_KEY", "RegularizerDriver"]

logger = logging.getLogger("lldmon.trl")

ANSWER_MASK_KEY: Final = "lldmon_answer_mask"
"""Rollout-batch column: (B, T) bool answer-span tokens (LLDS-MA), split and shuffled by TRL."""


class RegularizerDriver:
    """LLDS / SAPO of one `MonitoredGRPOTrainer` (see the module docstring).

    Args:
        trainer: the GRPOTrainer (accelerator, args, loss type, metric buffers, tokenizer, state).
        settings: validated options (`RegularizerSettings.build`).
        sink: the metric sink, or None; its `directive` drives llds="auto".
        queue_metrics: where the step's `llds/*`, `sapo/*` metrics go (None: not reported).
        drifted: whether an optimizer step happened since the current rollout batch was generated.
    """

    def __init__(
        self,
        trainer: Any,
        settings: RegularizerSettings,
        sink: object,
        queue_metrics: Callable[[int, Mapping[str, float]], None] | None,
        drifted: Callable[[], bool],
    ) -> None:
        self.trainer = trainer
        self.sink = sink
        self._queue_metrics = queue_metrics
        self._drifted = drifted
        self.warn = WarnOnce(logger)
        self.guard = Guard("the LLDS/SAPO regulariser", logger)
        self.settings = self._agree_mode(settings)
        self.switch: LLDSSwitch | None = None  # in force for the current optimizer step
        if self.settings.mode == "on":
            self.switch = LLDSSwitch(enabled=True, lam=self.settings.lam, reason="llds='on'")
        elif self.settings.mode == "auto":
            self.switch = LLDSSwitch(enabled=False, lam=0.0, reason="no directive read yet")
        self.directive_seen = False
        self._warned_noop = False
        self.step_stats = RegularizerStep()
        self.beta = self.settings.answer_weight if isinstance(self.settings.answer_weight, float) else 1.0
        self.valid_searches = math.nan

    # ------------------------------------------------------------------------------------------
    # state

    @property
    def active(self) -> bool:
        """Whether the LLDS term is added in the current optimizer step."""
        return self.switch is not None and self.switch.active and self.guard.enabled

    def adding(self) -> bool:
        """Whether any term (LLDS or SAPO) is added in the current optimizer step."""
        return self.guard.enabled and (
            (self.switch is not None and self.switch.active) or self.settings.sapo_weight > 0
        )

    def _is_main(self) -> bool:
        return bool(self.trainer.accelerator.is_main_process)

    def _agree_mode(self, settings: RegularizerSettings) -> RegularizerSettings:
        """With several processes, every rank takes the main process's LLDS mode.

        llds="auto" broadcasts the directive at every optimizer step, a collective that every rank
        must join; the default mode depends on the sink, which a job may pass on the main process
        only. One broadcast here (every rank constructs the trainer) makes the modes agree.
        """
        accelerator = self.trainer.accelerator
        if int(accelerator.num_processes) <= 1:
            return settings
        from accelerate.utils import broadcast

        modes: tuple[LLDSMode, ...] = ("off", "on", "auto")
        try:
            local = torch.tensor([modes.index(settings.mode)], device=accelerator.device)
            main = modes[int(broadcast(local, from_process=0).item())]
        except Exception as exc:
            self.warn(
                ("mode-broadcast", type(exc).__name__),
                "lldmon: cannot broadcast the LLDS mode to all processes; each keeps its own: %r",
                exc,
            )
            return settings
        if main == settings.mode:
            return settings
        logger.warning(
            "lldmon: llds=%r on this process, %r on the main process: using the main process's mode",
            settings.mode,
            main,
        )
        return dataclasses.replace(settings, mode=main)

    def check_config(self) -> None:
        """Warn once when TRL's schedule leaves nothing for the term to act on."""
        trainer = self.trainer
        args: Any = trainer.args
        zero = in_loss_deltas_structurally_zero(
            int(args.gradient_accumulation_steps), int(args.steps_per_generation), int(trainer.num_iterations)
        )
        if self._warned_noop or not self.settings.any_on or not zero:
            return
        self._warned_noop = True
        terms = [f"LLDS (llds={self.settings.mode!r})"] if self.settings.mode != "off" else []
        if self.settings.sapo_weight > 0:
            terms.append("SAPO's term")
        logger.warning(
            "lldmon: %s is a no-op in this configuration: with gradient_accumulation_steps=%d, "
            "steps_per_generation=%d and num_iterations=%d TRL trains every micro-batch before the first "
            "optimizer step after its rollout, so nothing is displaced yet and the term is always 0. Fix: "
            "steps_per_generation > gradient_accumulation_steps (e.g. steps_per_generation = 2 * "
            "gradient_accumulation_steps: two optimizer steps per rollout batch) or num_iterations > 1.",
            " and ".join(terms),
            args.gradient_accumulation_steps,
            args.steps_per_generation,
            trainer.num_iterations,
        )

    # ------------------------------------------------------------------------------------------
    # rollout

    def tool_metric_counts(self) -> tuple[int, int]:
        """Lengths of TRL's tool-metric buffers, taken before a rollout (to find its new entries)."""
        metrics: Any = self.trainer._metrics["train"]
        return len(metrics.get("tools/call_frequency", ())), len(metrics.get("tools/failure_frequency", ()))

    def _new_tool_metric(self, key: str, before: int) -> float | None:
        values: Any = self.trainer._metrics["train"].get(key, ())
        return float(values[-1]) if len(values) > before else None

    def _tokenizer(self) -> Any:
        tokenizer = getattr(self.trainer, "_tokenizer", None)
        return tokenizer if tokenizer is not None else self.trainer.processing_class

    def tag_rollout(self, output: dict[str, Any], tool_metrics_before: tuple[int, int]) -> None:
        """Per rollout batch: LLDS-MA's beta and the answer-span mask column (when beta != 1)."""
        if not (self.settings.needs_answer_mask and self.guard.enabled):
            return
        with self.guard():
            settings = self.settings
            completion_mask: Tensor = output["completion_mask"]
            if settings.answer_weight == "ma":
                self.valid_searches, self.beta = ma_answer_weight(
                    self._new_tool_metric("tools/call_frequency", tool_metrics_before[0]),
                    self._new_tool_metric("tools/failure_frequency", tool_metrics_before[1]),
                    loss_mask(output),
                    schedule=settings.ma_schedule,
                )
            if self.beta != 1.0:
                output[ANSWER_MASK_KEY] = answer_token_mask(
                    self._tokenizer(), output["completion_ids"], completion_mask, settings.answer_pattern
                )

    # ------------------------------------------------------------------------------------------
    # loss

    def add(self, loss: Tensor, inputs: Mapping[str, Any], logp: Tensor) -> Tensor:
        """`loss` plus the scaled LLDS/SAPO term; `loss` unchanged if computing the term fails."""
        out = loss
        with self.guard():
            out = loss + self._term(inputs, logp)
        return out

    # ------------------------------------------------------------------------------------------
    # the term, and optimizer-step boundaries

    def _term(self, inputs: Mapping[str, Any], logp: Tensor) -> Tensor:
        settings, switch = self.settings, self.switch
        mask = loss_mask(inputs)
        old: Tensor | None = inputs.get("old_per_token_logps")
        if old is None or not self._drifted():
            # No optimizer step since the rollout: no displacement, whatever a recomputed
            # old_per_token_logps (vLLM importance-sampling correction) says. Term = 0, still attached.
            old = logp.detach()
        advantages: Tensor = inputs["advantages"]
        terms: list[Tensor] = []
        llds_part: tuple[Tensor, LLDSStats] | None = None
        sapo_part: tuple[Tensor, SAPOStats] | None = None
        if switch is not None and switch.active:
            answer_mask: Tensor | None = inputs.get(ANSWER_MASK_KEY)
            llds_part = llds_loss(
                logp,
                old,
                mask,
                advantages,
                gate=settings.gate,
                answer_mask=answer_mask,
                answer_weight=self.beta if answer_mask is not None else 1.0,
                normalize=settings.normalize,
            )
        if settings.sapo_weight > 0 and settings.sapo_threshold is not None:
            sapo_part = sapo_kl_loss(
                logp,
                old,
                mask,
                advantages,
                threshold=settings.sapo_threshold,
                normalize=settings.sapo_normalize,
            )
        if llds_part is None and sapo_part is None:
            return logp.new_zeros(())
        trainer = self.trainer
        args: Any = trainer.args

        def scale(normalize: Any) -> Tensor | float:
            return term_scale(
                loss_type=str(trainer.loss_type),
                normalize=normalize,
                grad_accum=int(
                    getattr(trainer, "current_gradient_accumulation_steps", args.gradient_accumulation_steps)
                ),
                n_loss_tokens=(mask != 0).sum(),
                num_items_in_batch=inputs.get("num_items_in_batch"),
                num_processes=int(self.trainer.accelerator.num_processes),
                steps_per_generation=int(args.steps_per_generation),
            )

        if llds_part is not None and switch is not None:
            terms.append(switch.lam * llds_part[0] * scale(settings.normalize))
        if sapo_part is not None:
            terms.append(settings.sapo_weight * sapo_part[0] * scale(settings.sapo_normalize))
        term = terms[0] if len(terms) == 1 else terms[0] + terms[1]
        if llds_part is not None:
            self.step_stats.add_llds(*llds_part)
        if sapo_part is not None:
            self.step_stats.add_sapo(*sapo_part)
        return term

    def step_begin(self, step: int) -> None:
        """Fix the LLDS setting of optimizer step `step` (auto: the sink's directive, read once here)."""
        self.step_stats.clear()
        if self.settings.mode != "auto":
            return
        switch: LLDSSwitch | None = None
        if self._is_main():
            try:
                switch = read_directive(self.sink)
            except Exception as exc:
                self.warn(
                    ("directive", type(exc).__name__),
                    "lldmon: cannot read the sink's directive; LLDS keeps its current setting: %r",
                    exc,
                )
        if int(self.trainer.accelerator.num_processes) > 1:
            switch = self._broadcast(switch)
        if switch is not None:
            self._apply(switch, step)

    def _broadcast(self, switch: LLDSSwitch | None) -> LLDSSwitch | None:
        """The main process's directive on every rank, so all ranks add the same term."""
        from accelerate.utils import broadcast

        device = self.trainer.accelerator.device
        dtype = torch.float32 if device.type == "mps" else torch.float64
        values = [0.0, 0.0, 0.0, -1.0]
        if switch is not None:
            version = switch.version if switch.version is not None else -1
            values = [1.0, float(switch.enabled), switch.lam, float(version)]
        try:
            has, enabled, lam, version_f = broadcast(
                torch.tensor(values, dtype=dtype, device=device), from_process=0
            ).tolist()
        except Exception as exc:
            self.warn(
                ("broadcast", type(exc).__name__),
                "lldmon: cannot broadcast the LLDS directive to all processes; each keeps its own: %r",
                exc,
            )
            return switch
        if not has:
            return None
        reason = switch.reason if switch is not None else ""
        return LLDSSwitch(
            enabled=bool(enabled), lam=lam, version=int(version_f) if version_f >= 0 else None, reason=reason
        )

    def _apply(self, switch: LLDSSwitch, step: int) -> None:
        current = self.switch
        changed = (
            not self.directive_seen
            or current is None
            or (switch.enabled, switch.lam, switch.version) != (current.enabled, current.lam, current.version)
        )
        self.directive_seen = True
        self.switch = switch
        if changed and self._is_main():
            logger.info(
                "lldmon: LLDS %s from optimizer step %d by the service's directive (version %s, reason: %s)%s",
                "on" if switch.active else "off",
                step,
                switch.version,
                switch.reason or "-",
                f", lambda={switch.lam:g}" if switch.enabled else "",
            )

    def step_end(self, step: int) -> None:
        """Queue the step's llds/* (and sapo/*) metrics for the sink (main process)."""
        if self._queue_metrics is None or not self._is_main():
            self.step_stats.clear()
            return
        switch = self.switch
        if switch is not None and not self.guard.enabled:  # switched off by a failure
            switch = LLDSSwitch(enabled=False, lam=0.0)
        sapo = self.settings.sapo_weight if self.guard.enabled else 0.0
        try:
            metrics = self.step_stats.finish(llds=switch, sapo_weight=sapo)
        except Exception as exc:
            self.step_stats.clear()
            self.warn(("llds-metrics", type(exc).__name__), "lldmon: llds/* metrics failed: %r", exc)
            return
        if metrics:
            self._queue_metrics(step, metrics)

"""`MonitoredGRPOTrainer`: TRL's `GRPOTrainer` with lldmon's measurement and LLDS/SAPO.

A thin subclass: each override lets TRL run first, unguarded, then hands the tensors TRL already has
to its measurement driver (`trainer_hooks.trl.measurement`) and its regulariser driver
(`trainer_hooks.trl.regularizer`). Which TRL seam is used, and why: docs/hooks-trl.md.
"""

from __future__ import annotations

import re
from typing import Any, cast

import torch
from torch import Tensor
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.grpo_trainer import GRPOTrainer

from contracts import metrics as M
from contracts.directive import DEFAULT_LLDS_LAMBDA
from trainer_hooks import rollback
from trainer_hooks._sink import MetricSink
from trainer_hooks.anchors import AnchorSet
from trainer_hooks.trl.callback import LLDMonitorCallback, RegularizerCallback
from trainer_hooks.trl.config import (
    FROM_ENV,
    FromEnv,
    MonitorSettings,
    env_configured,
    has_directive,
    sink_from_env,
)
from trainer_hooks.trl.measurement import MeasurementDriver
from trainer_hooks.trl.regularizer import RegularizerDriver
from trainer_hooks.trl.regularizer_parts import DEFAULT_ANSWER_PATTERN, LLDSSwitch, RegularizerSettings

__all__ = ["MonitoredGRPOTrainer"]


class MonitoredGRPOTrainer(GRPOTrainer):
    """`trl.GRPOTrainer` that measures likelihood displacement from the loss's own log-probs.

    Takes every `GRPOTrainer` argument, plus (keyword-only):

    Args:
        lldmon_sink: where to send metrics and action records (`MonitorClient` or any
            `MetricSink`); None switches all monitoring off (plain GRPOTrainer, no overhead).
        probe_size: rows of the last rollout batch re-scored after an update (0: probe off). None
            (default): `auto_probe_size(R)` = R / 4 clamped to [2, 8], R = rows trained per
            optimizer step on this process (per_device_train_batch_size * gradient_accumulation_steps),
            so the probe's no-grad forward stays a small share of a step that generates, scores and
            trains R rows (`benchmarks/hooks.py` measures it).
        probe_interval: probe every this many optimizer steps (0: probe off; default: every step).
        success_threshold: a response is "correct" when its reward (weighted sum over reward
            functions, as TRL logs it) is >= this; None switches the `correct` metrics and the
            anchor set off.
        anchor_size: K, correct responses frozen into the anchor set (0: off). None (default):
            `auto_anchor_size(R)` = R clamped to [8, 32] (32 from 32 rows per step on).
        anchor_interval: N, re-score the anchor set every N optimizer steps (0: off).
        max_action_records: cap on action records per step and source (uniform subsample).
        lld_eps: decrease threshold: an action/trajectory counts as decreased when D < lld_eps.
        probe_seed: seed of the probe's row sampling (its own CPU generator; TRL's RNG is untouched).
        flush_timeout: seconds to wait for the sink at the end of training.
        llds: "off" | "on" | "auto" (docs/hooks-trl.md, "LLDS and SAPO"); None (default):
            "auto" if `lldmon_sink` has a `directive` property, else "off".
        llds_lambda: LLDS weight lambda of llds="on" (paper: 0.2; 0.3 for Qwen2.5-7B-Instruct).
        llds_gate: "action" (Eq. 4) | "response" (Eq. 10) | "token" (Eq. 9).
        llds_answer_weight: weight beta of answer-span tokens (LLDS-MA, Eq. 5): a number >= 0, or
            "ma" for beta = `ma_beta(V_s, llds_ma_schedule)` of each rollout batch's valid searches per trajectory.
        llds_normalize: "loss_tokens" (authors' code, default) | "preserving_tokens" (paper).
        llds_ma_schedule: beta schedule of llds_answer_weight="ma": "paper" | "code".
        answer_pattern: regex (str, compiled with re.DOTALL, or a compiled pattern) whose FINAL
            match in the decoded completion is the answer span.
        sapo_weight: weight w of SAPO's term (`regularizers.sapo_kl_loss`); 0 = off.
        sapo_threshold: its ratio threshold t (required when sapo_weight > 0; unpublished).
        sapo_normalize: SAPO's normalisation, "preserving_tokens" (default, the reported form) |
            "loss_tokens".

    Without `lldmon_sink`, the sink is `MonitorClient.from_env()` when `LLDMON_URL` is set (run name
    from `args.run_name`, config from `args.to_dict()`), else monitoring is off (one line on stderr);
    `lldmon_sink=None` switches it off silently.

    Raises:
        ValueError: invalid probe or LLDS/SAPO arguments (the message names the argument), before
            anything of GRPOTrainer is built.

    The measurement's cost: per micro-batch, a detached copy of the (b, T) log-probs; per
    optimizer step, one or two vectorised `measure_step` calls with a constant number of host
    syncs; per probe step, one no-grad forward over `probe_size` rows.
    """

    def __init__(
        self,
        *args: Any,
        lldmon_sink: MetricSink | FromEnv | None = FROM_ENV,
        probe_size: int | None = None,
        probe_interval: int = 1,
        max_action_records: int = 256,
        lld_eps: float = 0.0,
        probe_seed: int = 0,
        success_threshold: float | None = M.DEFAULT_SUCCESS_THRESHOLD,
        anchor_size: int | None = None,
        anchor_interval: int = M.DEFAULT_ANCHOR_INTERVAL,
        flush_timeout: float = 30.0,
        llds: str | None = None,
        llds_lambda: float = DEFAULT_LLDS_LAMBDA,
        llds_gate: str = "action",
        llds_answer_weight: float | str = 1.0,
        llds_normalize: str = "loss_tokens",
        llds_ma_schedule: str = "paper",
        answer_pattern: str | re.Pattern[str] = DEFAULT_ANSWER_PATTERN,
        sapo_weight: float = 0.0,
        sapo_threshold: float | None = None,
        sapo_normalize: str = "preserving_tokens",
        **kwargs: Any,
    ) -> None:
        # GRPOTrainer(model, reward_funcs, args, ...): the GRPOConfig, by keyword or position
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        monitor_settings = MonitorSettings.build(
            args=config,
            probe_size=probe_size,
            probe_interval=probe_interval,
            max_action_records=max_action_records,
            lld_eps=lld_eps,
            probe_seed=probe_seed,
            success_threshold=success_threshold,
            anchor_size=anchor_size,
            anchor_interval=anchor_interval,
            flush_timeout=flush_timeout,
        )
        from_env = isinstance(lldmon_sink, FromEnv)
        llds_settings = RegularizerSettings.build(
            llds=llds,
            llds_lambda=llds_lambda,
            llds_gate=llds_gate,
            llds_answer_weight=llds_answer_weight,
            llds_normalize=llds_normalize,
            llds_ma_schedule=llds_ma_schedule,
            answer_pattern=answer_pattern,
            sapo_weight=sapo_weight,
            sapo_threshold=sapo_threshold,
            sapo_normalize=sapo_normalize,
            # a client from the environment has a directive; validate before starting one
            sink_has_directive=env_configured() if from_env else has_directive(lldmon_sink),
        )
        sink = sink_from_env(config) if from_env else cast("MetricSink | None", lldmon_sink)
        super().__init__(*args, **kwargs)
        self.lldmon_sink: MetricSink | None = sink
        self.lldmon_settings = monitor_settings
        self._rollout_version = -1  # global_step when the current rollout batch was generated
        self._rewards_per_func: Tensor | None = None
        self._capture: list[Tensor] | None = None
        self.lldmon_measurement: MeasurementDriver | None = None
        self.lldmon_callback: LLDMonitorCallback | None = None
        if sink is not None:
            self.lldmon_measurement = MeasurementDriver(self, monitor_settings, self._score)
            self.lldmon_callback = LLDMonitorCallback(
                sink, flush_timeout=monitor_settings.flush_timeout, feed=self.lldmon_measurement
            )
            self.add_callback(self.lldmon_callback)
        measurement = self.lldmon_measurement
        self.llds = RegularizerDriver(
            self,
            llds_settings,
            sink,
            measurement.queue_metrics if measurement is not None else None,
            self.rollout_drifted,
        )
        if self.llds.settings.any_on:
            self.add_callback(RegularizerCallback(self.llds))

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """`GRPOTrainer.train`; a job `lldmon supervise` restarted for a rollback resumes from the
        checkpoint it names (`trainer_hooks.rollback`) unless the caller names one."""
        if resume_from_checkpoint is None:
            resume_from_checkpoint = rollback.resume_checkpoint()
        return super().train(resume_from_checkpoint, *args, **kwargs)

    # ------------------------------------------------------------------------------------------
    # state

    @property
    def lldmon_active(self) -> bool:
        """Whether the in-loss measurement is on (a sink is set and no failure switched it off)."""
        return self.lldmon_measurement is not None and self.lldmon_measurement.active

    @property
    def lldmon_probe_enabled(self) -> bool:
        return self.lldmon_measurement is not None and self.lldmon_measurement.probe_enabled

    @property
    def lldmon_anchors(self) -> AnchorSet | None:
        return self.lldmon_measurement.anchors if self.lldmon_measurement is not None else None

    @property
    def llds_settings(self) -> RegularizerSettings:
        return self.llds.settings

    @property
    def llds_switch(self) -> LLDSSwitch | None:
        """The LLDS setting in force for the current optimizer step (None: llds="off")."""
        return self.llds.switch

    @property
    def llds_active(self) -> bool:
        """Whether the LLDS term is added in the current optimizer step."""
        return self.llds.active

    def rollout_drifted(self) -> bool:
        """Whether an optimizer step happened since the current rollout batch was generated."""
        return int(self.state.global_step) > self._rollout_version

    def _training(self) -> bool:
        model: Any = self.model
        return bool(model.training)

    def _score(self, input_ids: Tensor, attention_mask: Tensor, logits_to_keep: int) -> Tensor:
        """Per-token log-probs of the last `logits_to_keep` tokens under the current model (no grad)."""
        model: Any = self.model
        args: Any = self.args
        with torch.no_grad(), disable_gradient_checkpointing(model, args.gradient_checkpointing_kwargs):
            new, _, _ = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=args.per_device_train_batch_size
            )
        out: Tensor = new.float()
        return out

    # ------------------------------------------------------------------------------------------
    # TRL seams (TRL's own code always runs first and unguarded; docs/hooks-trl.md says why each)

    def _calculate_rewards(
        self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any
    ) -> Any:
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rewards_per_func = rewards_per_func if isinstance(rewards_per_func, Tensor) else None
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: Any) -> Any:
        tool_metrics_before = self.llds.tool_metric_counts()
        output = super()._generate_and_score_completions(inputs)
        rewards_per_func, self._rewards_per_func = self._rewards_per_func, None
        if not self._training():
            return output
        self._rollout_version = int(self.state.global_step)
        self.llds.tag_rollout(output, tool_metrics_before)
        if self.lldmon_measurement is not None:
            self.lldmon_measurement.tag_rollout(output, rewards_per_func)
        return output

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._capture is not None and isinstance(result, tuple) and isinstance(result[0], Tensor):
            self._capture.append(result[0])
        return result

    def _compute_loss(self, model: Any, inputs: Any) -> Any:
        training = self._training()
        measurement = self.lldmon_measurement
        measure = training and measurement is not None and measurement.wants_loss(inputs)
        regularise = training and self.llds.adding()
        if not (measure or regularise):
            return super()._compute_loss(model, inputs)  # type: ignore[no-untyped-call]
        captured: list[Tensor] = []
        self._capture = captured
        try:
            loss = super()._compute_loss(model, inputs)  # type: ignore[no-untyped-call]
        finally:
            self._capture = None
        if captured:
            if regularise:
                loss = self.llds.add(loss, inputs, captured[0])
            if measure and measurement is not None:
                measurement.collect(inputs, captured[0], self.rollout_drifted())
        elif regularise:
            self.llds.warn(
                "no-logp",
                "lldmon: the loss's log-probs could not be captured (TRL internals changed?); "
                "the LLDS/SAPO term is not added",
            )
        return loss

    def _maybe_log_save_evaluate(self, tr_loss: Any, grad_norm: Any, *args: Any, **kwargs: Any) -> None:
        measurement, callback = self.lldmon_measurement, self.lldmon_callback
        if measurement is not None and callback is not None:
            logs = measurement.step_scalars(
                int(self.state.global_step), tr_loss, grad_norm, kwargs.get("learning_rate")
            )
            if logs is not None:
                callback.send(int(self.state.global_step), logs, final=False, per_step=True)
        super()._maybe_log_save_evaluate(tr_loss, grad_norm, *args, **kwargs)
        if measurement is not None:
            measurement.after_log_save_evaluate(tr_loss)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        super().log(logs, start_time)
        if self.lldmon_measurement is not None:
            self.lldmon_measurement.snapshot_metric_counts()  # TRL cleared what it averaged

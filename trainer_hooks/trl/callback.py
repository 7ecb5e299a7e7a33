"""`LLDMonitorCallback`: TRL's logged scalars to an lldmon sink, for any transformers Trainer, and the
directive's checkpoint/rollback/stop requests to the Trainer's `control`; and the callbacks through which
`MonitoredGRPOTrainer`'s drivers see optimizer-step boundaries."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from contracts.directive import ROLLBACK_METRIC, LeverTracker, parse_directive
from trainer_hooks import rollback
from trainer_hooks._guard import Guard
from trainer_hooks._sink import MetricSink
from trainer_hooks.trl.names import map_trl_logs

__all__ = ["LLDMonitorCallback", "RegularizerCallback", "StepFeed"]

logger = logging.getLogger("lldmon.trl")

Actions = list[tuple[int, dict[str, list[Any]]]]


class StepFeed(Protocol):
    """Measured data a `LLDMonitorCallback` sends along (`trainer_hooks.trl.measurement`)."""

    def train_begin(self) -> None: ...

    def step_end(self, step: int) -> None: ...

    def keys_sent_per_step(self) -> set[str]:
        """TRL log keys already sent at every optimizer step (dropped from TRL's window logs)."""
        ...

    def drain_metrics(self, step: int, final: bool) -> dict[int, dict[str, float]]: ...

    def drain_actions(self, step: int, final: bool) -> Actions: ...


class LLDMonitorCallback(TrainerCallback):
    """Send TRL's logged scalars, under canonical names, to a `MetricSink` (main process only).

    On every log event it maps TRL's scalars (`map_trl_logs`) and calls `sink.log(global_step, ...)`:
    degraded mode, no `lld/*` metrics, at TRL's `logging_steps` cadence. `MonitoredGRPOTrainer` adds
    its measurement driver as `feed`: its data goes out with the same sends.

    If the sink has a `directive` (a `MonitorClient`), each optimizer step's end honours its requests,
    each once: a checkpoint request sets `control.should_save` (the Trainer saves `checkpoint-<step>`
    right after), a stop request sets `should_save` and `should_training_stop` (save, then end
    training), a rollback request ends training for `lldmon supervise` to restart it from the newest
    checkpoint at or before the requested step (`trainer_hooks.rollback`; without a supervisor or such
    a checkpoint it stops instead); the directive's version is acknowledged with that step's metrics.
    A job the supervisor restarted for a rollback scales its learning rate on `on_train_begin` and
    logs `ROLLBACK_METRIC` with its first step. Main process only: in a multi-process job every rank
    would have to see the same request (not handled here).

    Args:
        sink: a `trainer_hooks.client.MonitorClient` or any `MetricSink`.
        flush_timeout: seconds `on_train_end` waits in `sink.flush`; the sink is not closed (the
            caller owns it).
        feed: measured data to send along (used by `MonitoredGRPOTrainer`).
    """

    def __init__(
        self, sink: MetricSink, *, flush_timeout: float = 30.0, feed: StepFeed | None = None
    ) -> None:
        self.sink = sink
        self.flush_timeout = flush_timeout
        self.feed = feed
        self._send_guard = Guard("sending metrics to the lldmon sink", logger)
        self._lever_guard = Guard("acting on the lldmon directive", logger)
        self._levers = LeverTracker()

    def apply_directive(self, step: int, control: TrainerControl, output_dir: str | None = None) -> None:
        """Set `control` for the sink's directive requests not acted upon yet; acknowledge its version."""
        if not self._lever_guard.enabled:
            return
        with self._lever_guard():
            directive = getattr(self.sink, "directive", None)
            if directive is None:
                return
            levers = self._levers.take(directive)
            if levers.rollback:
                parsed = parse_directive(directive)
                levers = rollback.hand_over(
                    levers,
                    step=step,
                    checkpoint_dir=output_dir or None,
                    rollback_id=parsed.rollback if parsed is not None else 0,
                    logger=logger,
                )
            if levers.rollback:  # handed to the supervisor: end now, without saving
                control.should_training_stop = True
            if levers.checkpoint or levers.stop:
                control.should_save = True
            if levers.stop:
                control.should_training_stop = True
                logger.warning(
                    "lldmon: stopping training after step %d as requested: %s", step, levers.stop_reason
                )
            elif levers.checkpoint:
                logger.info("lldmon: saving a checkpoint at step %d as requested", step)
            if levers.acknowledge is not None:
                self.sink.log(step, levers.metrics())

    def resume_rollback(self, state: TrainerState, optimizer: Any, lr_scheduler: Any, base_lr: float) -> None:
        """In a job restarted for a rollback: the learning rate becomes `base_lr` (the job's configured
        one) times the rollback's factor, and the first step it trains again carries `ROLLBACK_METRIC`
        (the restored step)."""
        resumed = rollback.resumed()
        if resumed is None:
            return
        rollback.scale_learning_rate(optimizer, lr_scheduler, base_lr * resumed.lr_scale)
        logger.warning(
            "lldmon: resumed from %s (step %d) for a rollback, learning rate %g",
            resumed.checkpoint,
            state.global_step,
            base_lr * resumed.lr_scale,
        )
        if self._send_guard.enabled:
            with self._send_guard():
                self.sink.log(state.global_step + 1, {ROLLBACK_METRIC: float(state.global_step)})

    def send(
        self, step: int, logs: Mapping[str, object] | None, final: bool, *, per_step: bool = False
    ) -> None:
        """Send `logs` (TRL keys) and the feed's pending data at `step`; TRL's window logs lose the
        keys the feed already sent per step (`per_step=True` marks such a per-step send)."""
        if not self._send_guard.enabled:
            return
        with self._send_guard():
            feed = self.feed
            by_step = feed.drain_metrics(step, final) if feed is not None else {}
            current = by_step.pop(step, {})
            if logs is not None:
                streamed = feed.keys_sent_per_step() if feed is not None and not per_step else set()
                window = {k: v for k, v in logs.items() if k not in streamed} if streamed else logs
                current.update(map_trl_logs(window))  # TRL's names never collide with the measured ones
            for s in sorted(by_step):
                if by_step[s]:
                    self.sink.log(s, by_step[s])
            if current:
                self.sink.log(step, current)
            for s, columns in feed.drain_actions(step, final) if feed is not None else ():
                if columns["step"]:
                    self.sink.log_actions(s, columns)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.feed is not None:
            self.feed.train_begin()
        if state.is_world_process_zero and self._lever_guard.enabled:
            with self._lever_guard():
                self.resume_rollback(
                    state, kwargs.get("optimizer"), kwargs.get("lr_scheduler"), float(args.learning_rate)
                )

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.feed is not None:
            self.feed.step_end(state.global_step)
        if state.is_world_process_zero:
            self.apply_directive(state.global_step, control, args.output_dir)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, object] | None = None,
        **kwargs: Any,
    ) -> None:
        if state.is_world_process_zero:
            self.send(state.global_step, logs or {}, final=False)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not state.is_world_process_zero:
            return
        self.send(state.global_step, None, final=True)
        if self._send_guard.enabled:
            with self._send_guard():
                self.sink.flush(self.flush_timeout)


class _RegularizerHooks(Protocol):
    def check_config(self) -> None: ...

    def step_begin(self, step: int) -> None: ...

    def step_end(self, step: int) -> None: ...


class RegularizerCallback(TrainerCallback):
    """Drives the LLDS/SAPO term at optimizer-step boundaries (every process)."""

    def __init__(self, driver: _RegularizerHooks) -> None:
        self._driver = driver

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._driver.check_config()

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._driver.step_begin(state.global_step + 1)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._driver.step_end(state.global_step)

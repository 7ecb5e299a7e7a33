"""TRL integration: stream GRPO metrics and in-loss likelihood displacement to lldmon.

Usage::

    client = MonitorClient("http://lldmon:8000", "grpo-3b-nq", project="nq")
    trainer = MonitoredGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...),
                                   train_dataset=..., tools=[search], lldmon_sink=client)
    # LLDS follows the service's directive (llds="auto", the default with a MonitorClient);
    # llds="on", llds_lambda=0.2 switches it on statically (needs steps_per_generation >
    # gradient_accumulation_steps or num_iterations > 1 to have any effect).
    trainer.train()
    client.close()

Two entry points:

- `LLDMonitorCallback(sink)`: a `transformers.TrainerCallback` for any (GRPO)Trainer. On every log
  event of the main process it maps TRL's scalars to canonical names (`TRL_TO_CANONICAL`, the one
  mapping table) and passes every other scalar through under its own name, via
  `sink.log(state.global_step, metrics)`. Degraded mode: no `lld/*` metrics.
- `MonitoredGRPOTrainer(GRPOTrainer, lldmon_sink=..., probe_size=..., probe_interval=...)`: adds the
  likelihood-displacement measurement (`trainer_hooks.likelihood.measure_step`) and the callback,
  and optionally the LLDS / SAPO regulariser (`llds=...`, see "LLDS and SAPO" below).

What MonitoredGRPOTrainer hooks in TRL 1.16 (`trl/trainer/grpo_trainer.py`), and why:

- `GRPOTrainer._get_per_token_logps_and_entropies`: wrapped; while `_compute_loss` runs, its result
  (the per-token log-probs the loss itself uses) is kept: detached for the measurement, with its
  graph for the LLDS/SAPO term. No second forward pass.
- `GRPOTrainer._compute_loss`: wrapped; after TRL computed the loss, the micro-batch's log-probs,
  `old_per_token_logps` (absent when TRL runs on-policy: then old = current, as in TRL), the loss
  mask `completion_mask * tool_mask` (TRL's multi-turn tool mask: 0 on tool-output tokens; it is
  built by `_tool_call_loop` for `tools=`/`environment_factory`, and a `rollout_func`'s `env_mask`
  is renamed to it by `_generate`) and the advantages are queued. The measurement depends only on
  log-probs, masks and advantages, so every `loss_type` (grpo, dapo, dr_grpo, bnpo, cispo, sapo,
  ...) and `importance_sampling_level` works alike. With LLDS/SAPO on, the scaled term is added to
  the returned loss (see "LLDS and SAPO").
- `GRPOTrainer._calculate_rewards`: wrapped to keep the per-function rewards; the weighted sum (as
  TRL logs it) goes into the action records.
- `GRPOTrainer._generate_and_score_completions`: wrapped; tags each row of the rollout batch with a
  run-unique trajectory id (`lldmon_traj_id`) and its reward (`lldmon_rewards`), which TRL shuffles
  and splits together with its own columns, and draws the probe subset.
- A private `TrainerCallback.on_step_end` (after `optimizer.step()`, `global_step` already
  incremented): measures the queued micro-batches of the step (one `measure_step` call, or two if
  the step mixes drifted and non-drifted micro-batches), runs the probe and the anchor re-scoring,
  and queues the results; `_maybe_log_save_evaluate` sends them with TRL's scalars of the step.

Steps: everything measured for optimizer step k (its micro-batches, its probe) is logged at step k,
the value of `state.global_step` right after that update, i.e. the step TRL logs its own metrics at.

Estimators (lld-reference.md section 2; one name each, `contracts.metrics`):

- Exact delta (Def. 4.1), `lld/delta_*`, `lld/frac_*_decreased_*`, `lld/delta_traj_correct`: the
  post-update probe. After every `probe_interval` optimizer steps (default: every step),
  `probe_size` rows of the LAST rollout batch are re-scored under `torch.no_grad` with the
  just-updated model (one forward, no backward) and compared with their rollout-time log-probs
  (TRL's `old_per_token_logps`, or, when TRL has none, the loss's own log-probs of those rows,
  captured before any update). Also sent as action records with `source="probe"`.
- Cross-mini-batch drift, `lld/xmb/*`: a micro-batch *drifts* when an optimizer step happened since
  its rollout batch was generated (only if `steps_per_generation * num_iterations` does not divide
  `gradient_accumulation_steps`). Its in-loss deltas are a free proxy (rows scored after updates on
  *other* rows), never published under the exact names; `ratio/pos_*` (the loss's importance
  ratios) and `source="loss"` action records come from drifted micro-batches only. Non-drifted
  micro-batches have D == 0 by construction: they feed only the level metrics.
- Levels at rollout, `lld/logp_pos|neg|correct`: per-token log pi_old of each population.
- Anchor set, `lld/anchor/*` (`trainer_hooks.anchors`): the first `anchor_size` correct responses
  (reward >= `success_threshold`) are frozen, and re-scored every `anchor_interval` steps: [LLD]
  Fig. 2's curve on a population that cannot shift. Single-process jobs only (for now).

Per-step delivery: whatever `logging_steps` is, every optimizer step's measured metrics *and* TRL's
own scalars (reward, entropy, grad norm, loss, clip ratios, tool counts: the new entries of
`GRPOTrainer._metrics` of that step, averaged as TRL averages them) are sent at that step, from an
override of `Trainer._maybe_log_save_evaluate` (which runs after the optimizer step and before TRL
logs). TRL's own log events then only add keys that are not streamed per step (`train_runtime`,
`eval_*`, ...), so a series never mixes per-step values with TRL's window means. The per-step loss
is this process's (TRL's logged loss is a mean over processes).

Metrics the in-loss measurement would duplicate from TRL's own log (reward mean/std, zero-std
group share, entropy, response length: `trl_measure.TRL_PROVIDED_METRICS`) are taken from TRL only.

Multi-process: the in-loss measurement runs on the main process only and covers its shard of the
batch (a uniform subsample, no collective ops, so a monitoring failure can never deadlock ranks).
The probe forward runs on every rank (sharded ZeRO-3/FSDP models need all ranks for a forward),
only the main process measures and sends. Multimodal rollouts are not probed.

Safety: monitoring never crashes training. Every hook runs TRL's code first and outside any guard;
the monitoring part runs under a guard that logs the first exception once (logger `lldmon.trl`)
and switches that part off for the rest of the run (measurement and sending are guarded apart).

LLDS and SAPO (lld-reference.md sections 4-5)
=============================================
`MonitoredGRPOTrainer` can add `lambda * llds_loss(...)` (`trainer_hooks.regularizers`) and/or
`w * sapo_kl_loss(...)` to TRL's loss. Keyword arguments (names and semantics as in
`trainer_hooks.verl`'s `llds_*` keys; validated at construction, an invalid value raises
`ValueError` naming the argument, before GRPOTrainer builds anything):

=====================  ================  ========================================================
argument               default           meaning
=====================  ================  ========================================================
llds                   None              "off" | "on" | "auto"; None = "auto" if `lldmon_sink` has
                                         a `directive` property (MonitorClient), else "off"
llds_lambda            0.2               lambda of llds="on" (paper: 0.2, 0.3 for Qwen2.5-7B-Instr.)
llds_gate              "action"          "action" (Eq. 4) | "response" (Eq. 10) | "token" (Eq. 9)
llds_answer_weight     1.0               beta of answer-span tokens (LLDS-MA, Eq. 5): a number >= 0
                                         or "ma" (beta = `ma_beta(V_s)` per rollout batch)
llds_normalize         "loss_tokens"     "loss_tokens" (authors' code) | "preserving_tokens" (paper)
llds_ma_schedule       "paper"           beta of "ma": "paper" min(V_s/2, 1) | "code" (authors' code)
answer_pattern         <answer>.*?</answer>  regex (re.DOTALL); its FINAL match is the answer span
sapo_weight            0.0               w of SAPO's term (0 = off), independent of `llds`
sapo_threshold         None              its ratio threshold t; required when sapo_weight > 0
sapo_normalize         "preserving_tokens"  SAPO's own normalisation (the reported form)
=====================  ================  ========================================================

- llds="on": the term is added at every training micro-batch with `llds_lambda`.
- llds="auto": the sink's `directive` (duck-typed: `.llds.enabled`, `.llds.lam`, `.version`,
  `.reason`, or the service's JSON shape) is read once per optimizer step, in `on_step_begin`, so
  one optimizer step never mixes settings; a directive the service sent with step k's metrics takes
  effect at step k + 1. Lambda is the directive's (`llds_lambda` is not used). Every change (and
  the first directive read) is logged at INFO on `lldmon.trl` with its version and reason. With
  several processes the main process reads it and broadcasts it (a 4-float tensor per step), so
  all ranks add the same term.
- The term uses the log-probs the loss itself computed (captured with their graph in the
  `_get_per_token_logps_and_entropies` wrapper, no second forward pass), the loss mask
  `completion_mask * tool_mask` and TRL's advantages. "old" is TRL's `old_per_token_logps` only on
  micro-batches that drifted (an optimizer step since their rollout); otherwise it is the loss's own
  log-probs detached, so the term is exactly 0 there. That matters with vLLM's importance-sampling
  correction, where TRL computes `old_per_token_logps` in a separate forward even on-policy: its
  recompute noise would otherwise open LLDS gates on ~half the actions with no displacement at all.
  Gates and selections carry no gradient.
- Scaling (`trl_llds.term_scale`): TRL 1.16 scales its loss for gradient accumulation inside
  `_compute_loss` (`loss_is_scaled_for_ga`), per loss type, and the term is scaled the same way,
  so its effective weight per optimizer step is lambda whatever the micro-batch split:
  grpo/sapo/bnpo/dr_grpo/luspo divide a per-micro-batch value by
  `current_gradient_accumulation_steps`, and so does the term (lambda * llds_loss / GA, exactly the
  authors' `dp_actor.py`, which adds the term per micro-batch inside `policy_loss` and divides by
  the accumulation count; also how TRL scales its entropy bonus and aux loss); dapo/cispo/vespo
  divide the token sum by the window's loss-token count `num_items_in_batch / num_processes *
  GA / steps_per_generation`, and with llds_normalize="loss_tokens" the term's token sum is divided
  by that same count (lambda * llds_loss * micro-batch loss tokens / window loss tokens, as
  `trainer_hooks.verl` does under verl's global token normalisation); with "preserving_tokens" it
  is lambda * llds_loss / GA. The micro-batch normalisation itself is LLDS's (`llds_normalize`).
  Evaluation never adds the term. TRL's logged `loss` includes it.
- LLDS-MA: the answer mask is computed once per rollout batch (`trl_llds.answer_token_mask`: one
  batched decode, the final regex match, char span -> tokens by bisection on decoded prefixes) and
  travels with the rows as column `lldmon_answer_mask`; skipped while beta == 1. "ma" takes V_s =
  TRL's `tools/call_frequency * (1 - tools/failure_frequency)` of the rollout (the
  `search/valid_per_traj` metric), or, without TRL tool metrics, tool calls counted from the mask.
- Metrics per optimizer step k, sent at step k through the sink (main process, its shard):
  `llds/active` (0/1), `llds/lambda` (0 when off), and while on `llds/loss` (mean `llds_loss` of the
  step's micro-batches, before lambda and scaling) and `llds/gated_action_frac` (over all their
  preserving actions); with SAPO `sapo/weight`, `sapo/loss`, `sapo/selected_token_frac`. None with
  llds="off" (and no SAPO), none without a sink.
- When the schedule makes old == current log-probs (`in_loss_deltas_structurally_zero`: TRL's
  default steps_per_generation == gradient_accumulation_steps, num_iterations == 1) the term is a
  no-op: a warning is logged once per trainer at train start, with the fix.
- A failure while computing the term is logged once and switches the term off for the rest of the
  run (training continues with TRL's loss; `llds/active` then reads 0).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, Protocol

import torch
from torch import Tensor
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.grpo_trainer import GRPOTrainer

from contracts import metrics as M
from contracts.directive import DEFAULT_LLDS_LAMBDA
from contracts.metrics import MAX_METRIC_NAME_LENGTH
from contracts.trainer_keys import TRL_TO_CANONICAL as _TRL_TO_CANONICAL
from contracts.trainer_keys import canonical_trl
from trainer_hooks._warn import WarnOnce
from trainer_hooks.anchors import AnchorSet
from trainer_hooks.regularizers import LLDSStats, SAPOStats, llds_loss, sapo_kl_loss
from trainer_hooks.trl_llds import (
    DEFAULT_ANSWER_PATTERN,
    LLDSMode,
    LLDSSwitch,
    RegularizerSettings,
    RegularizerStep,
    answer_token_mask,
    ma_answer_weight,
    read_directive,
    term_scale,
)
from trainer_hooks.trl_measure import (
    MicroBatch,
    ProbeBatch,
    StepAccumulator,
    StepResult,
    in_loss_deltas_structurally_zero,
)

__all__ = [
    "TRL_TO_CANONICAL",
    "LLDMonitorCallback",
    "MetricSink",
    "MonitoredGRPOTrainer",
    "auto_anchor_size",
    "auto_probe_size",
    "map_trl_logs",
]

logger = logging.getLogger("lldmon.trl")


class MetricSink(Protocol):
    """What the hooks send to: `trainer_hooks.client.MonitorClient`, or any object with these methods.

    Parameters are positional-only here so implementations may name them freely. An optional
    `directive` property (the client's) is duck-typed by `MonitoredGRPOTrainer`'s llds="auto"
    mode, so it is not part of the protocol.
    """

    def log(self, step: int, metrics: Mapping[str, float], /) -> object:
        """Queue scalar metrics (canonical or pass-through names) of one step."""

    def log_actions(self, step: int, columns: Mapping[str, Sequence[Any]], /) -> object:
        """Queue columnar action records (keys `contracts.wire.ACTION_COLUMNS`) of one step."""

    def flush(self, timeout: float, /) -> object:
        """Block until queued data is sent or `timeout` seconds passed."""

    def close(self) -> object:
        """Flush and release resources."""


if TYPE_CHECKING:
    from trainer_hooks.client import MonitorClient

    def _client_is_a_sink(client: MonitorClient) -> MetricSink:  # checked by mypy only
        return client


TRL_TO_CANONICAL: Final[Mapping[str, str]] = _TRL_TO_CANONICAL
"""TRL GRPOTrainer log key -> canonical metric name: `contracts.trainer_keys.TRL_TO_CANONICAL` (the one
table, with its precedence rule), re-exported. Every other scalar (learning_rate, epoch,
clip_ratio/low_mean, rewards/<func>/mean, tools/*, eval_* keys, train_runtime, ...) passes through under
its own name. One metric is derived: `search/valid_per_traj` = `tools/call_frequency` *
(1 - `tools/failure_frequency`), the mean number of tool calls per trajectory that did not fail.
"""


def map_trl_logs(logs: Mapping[str, object]) -> dict[str, float]:
    """Canonical-name metrics from one TRL/transformers `logs` dict.

    `contracts.trainer_keys.canonical_trl` (the importers use it too): keys in `TRL_TO_CANONICAL`
    are renamed, other scalar keys pass through unchanged, `search/valid_per_traj` is derived;
    non-scalars (None, strings, lists) and names longer than `MAX_METRIC_NAME_LENGTH` are dropped.
    NaN and inf are kept (they are collapse signals).
    """
    return {k: v for k, v in canonical_trl(logs).items() if len(k) <= MAX_METRIC_NAME_LENGTH}


class _Guard:
    """Runs monitoring code; the first exception is logged once and switches the guarded part off."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.enabled = True

    @contextmanager
    def __call__(self) -> Iterator[None]:
        try:
            yield
        except Exception:
            if self.enabled:
                logger.warning(
                    "lldmon: %s failed; it is switched off for the rest of this run (training continues)",
                    self.what,
                    exc_info=True,
                )
            self.enabled = False


class LLDMonitorCallback(TrainerCallback):
    """Send TRL's logged scalars, under canonical names, to a `MetricSink` (main process only).

    Args:
        sink: a `trainer_hooks.client.MonitorClient` or any `MetricSink`.
        flush_timeout: seconds `on_train_end` waits in `sink.flush`; the sink is not closed (the
            caller owns it).
    """

    def __init__(self, sink: MetricSink, *, flush_timeout: float = 30.0) -> None:
        self.sink = sink
        self.flush_timeout = flush_timeout
        self._send_guard = _Guard("sending metrics to the lldmon sink")

    # Extra data to send with a log event; MonitoredGRPOTrainer's callback overrides these.
    def _log_keys_sent_per_step(self) -> set[str]:
        """TRL log keys already sent at every optimizer step (dropped from TRL's window logs)."""
        return set()

    def _pending_metrics(self, step: int, final: bool) -> dict[int, dict[str, float]]:
        return {}

    def _pending_actions(self, step: int, final: bool) -> list[tuple[int, dict[str, list[Any]]]]:
        return []

    def _send(
        self, step: int, logs: Mapping[str, object] | None, final: bool, *, per_step: bool = False
    ) -> None:
        """Send `logs` (TRL keys) and the pending measured data at `step`; TRL's window logs lose the
        keys already sent per step (`per_step=True` marks such a per-step send)."""
        if not self._send_guard.enabled:
            return
        with self._send_guard():
            by_step = self._pending_metrics(step, final)
            current = by_step.pop(step, {})
            if logs is not None:
                streamed = set() if per_step else self._log_keys_sent_per_step()
                window = {k: v for k, v in logs.items() if k not in streamed} if streamed else logs
                current.update(map_trl_logs(window))  # TRL's names never collide with the measured ones
            for s in sorted(by_step):
                if by_step[s]:
                    self.sink.log(s, by_step[s])
            if current:
                self.sink.log(step, current)
            for s, columns in self._pending_actions(step, final):
                if columns["step"]:
                    self.sink.log_actions(s, columns)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, object] | None = None,
        **kwargs: Any,
    ) -> None:
        if state.is_world_process_zero:
            self._send(state.global_step, logs or {}, final=False)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not state.is_world_process_zero:
            return
        self._send(state.global_step, None, final=True)
        if self._send_guard.enabled:
            with self._send_guard():
                self.sink.flush(self.flush_timeout)


class _MonitoredCallback(LLDMonitorCallback):
    """LLDMonitorCallback that also drives and drains a MonitoredGRPOTrainer's measurement."""

    def __init__(self, trainer: MonitoredGRPOTrainer, sink: MetricSink, *, flush_timeout: float) -> None:
        super().__init__(sink, flush_timeout=flush_timeout)
        self._trainer = trainer

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._trainer._lldmon_check_config()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._trainer._lldmon_step_end(state.global_step)

    def _log_keys_sent_per_step(self) -> set[str]:
        return self._trainer._lldmon_step_keys

    def _pending_metrics(self, step: int, final: bool) -> dict[int, dict[str, float]]:
        return self._trainer._lldmon_drain_metrics(step, final)

    def _pending_actions(self, step: int, final: bool) -> list[tuple[int, dict[str, list[Any]]]]:
        return self._trainer._lldmon_drain_actions(step, final)


class _RegularizerCallback(TrainerCallback):
    """Drives a MonitoredGRPOTrainer's LLDS/SAPO term at optimizer-step boundaries (every process)."""

    def __init__(self, trainer: MonitoredGRPOTrainer) -> None:
        self._trainer = trainer

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._trainer._llds_check_config()

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._trainer._llds_step_begin(state.global_step + 1)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._trainer._llds_step_end(state.global_step)


_ANSWER_MASK_KEY: Final = "lldmon_answer_mask"
"""Rollout-batch column: (B, T) bool answer-span tokens (LLDS-MA), split and shuffled by TRL."""

_MULTIMODAL_KEYS: Final = (
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


def _rows_per_step(args: Any) -> int:
    """Rows trained per optimizer step on this process (8 when `args` is not a GRPOConfig yet)."""
    try:
        return int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps)
    except (AttributeError, TypeError, ValueError):
        return 8


def auto_probe_size(rows_per_step: int) -> int:
    """Default probe size: a quarter of the rows trained per optimizer step, clamped to [2, 8]."""
    return min(max(rows_per_step // 4, 2), 8)


def auto_anchor_size(rows_per_step: int) -> int:
    """Default anchor-set size K: the rows trained per optimizer step, clamped to [8, 32]."""
    return min(max(rows_per_step, 8), M.DEFAULT_ANCHOR_SIZE)


class _FromEnv:
    """Sentinel default of `lldmon_sink`: build the sink from the environment (`LLDMON_URL`, ...)."""

    def __repr__(self) -> str:
        return "<from environment>"


_FROM_ENV: Final = _FromEnv()


def _sink_from_env(args: Any) -> MetricSink | None:
    """`MonitorClient.from_env()` named after `args.run_name` with `args.to_dict()` as its config, or
    None (logged once) when `LLDMON_URL` is not set."""
    from trainer_hooks.client import MonitorClient

    if not os.environ.get("LLDMON_URL"):
        logger.info(
            "lldmon: no lldmon_sink and LLDMON_URL is not set: monitoring is off (set LLDMON_URL, or pass "
            "lldmon_sink=MonitorClient(...))"
        )
        return None
    run_name = getattr(args, "run_name", None)
    config: dict[str, Any] | None = None
    to_dict = getattr(args, "to_dict", None)
    if callable(to_dict):
        try:
            config = to_dict()
        except Exception:  # a config that cannot be serialised must not stop training
            config = None
    return MonitorClient.from_env(run=run_name or None, config=config)


def _has_directive(sink: object) -> bool:
    """Whether `sink` offers a `directive` (duck-typed; a failing property counts as none)."""
    if sink is None:
        return False
    try:
        return getattr(sink, "directive", None) is not None
    except Exception:
        return False


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
        llds: "off" | "on" | "auto" (see the module docstring, "LLDS and SAPO"); None (default):
            "auto" if `lldmon_sink` has a `directive` property, else "off".
        llds_lambda: LLDS weight lambda of llds="on" (paper: 0.2; 0.3 for Qwen2.5-7B-Instruct).
        llds_gate: "action" (Eq. 4) | "response" (Eq. 10) | "token" (Eq. 9).
        llds_answer_weight: weight beta of answer-span tokens (LLDS-MA, Eq. 5): a number >= 0, or
            "ma" for beta = `ma_beta(V_s)` of each rollout batch's valid searches per trajectory.
        llds_normalize: "loss_tokens" (authors' code, default) | "preserving_tokens" (paper).
        llds_ma_schedule: beta schedule of llds_answer_weight="ma": "paper" | "code".
        answer_pattern: regex (str, compiled with re.DOTALL, or a compiled pattern) whose FINAL
            match in the decoded completion is the answer span.
        sapo_weight: weight w of SAPO's term (`regularizers.sapo_kl_loss`); 0 = off.
        sapo_threshold: its ratio threshold t (required when sapo_weight > 0; unpublished).
        sapo_normalize: SAPO's normalisation, "preserving_tokens" (default, the reported form) |
            "loss_tokens".

    Without `lldmon_sink`, the sink is `MonitorClient.from_env()` when `LLDMON_URL` is set (run name
    from `args.run_name`, config from `args.to_dict()`), else monitoring is off (logged once);
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
        lldmon_sink: MetricSink | _FromEnv | None = _FROM_ENV,
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
        config = kwargs.get(
            "args", args[2] if len(args) > 2 else None
        )  # GRPOTrainer(model, reward_funcs, args)
        rows = _rows_per_step(config)
        probe_size = auto_probe_size(rows) if probe_size is None else probe_size
        anchor_size = auto_anchor_size(rows) if anchor_size is None else anchor_size
        for name, value in (
            ("probe_size", probe_size),
            ("probe_interval", probe_interval),
            ("max_action_records", max_action_records),
            ("anchor_size", anchor_size),
            ("anchor_interval", anchor_interval),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if success_threshold is not None and not math.isfinite(float(success_threshold)):
            raise ValueError(f"success_threshold must be a finite number or None, got {success_threshold!r}")
        if isinstance(lldmon_sink, _FromEnv):
            lldmon_sink = _sink_from_env(config)
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
            sink_has_directive=_has_directive(lldmon_sink),
        )
        super().__init__(*args, **kwargs)
        self.lldmon_sink = lldmon_sink
        self.lldmon_probe_size = probe_size
        self.lldmon_probe_interval = probe_interval
        self.lldmon_max_action_records = max_action_records
        self.lldmon_eps = lld_eps
        self.lldmon_success_threshold = success_threshold
        self._lldmon_measure_guard = _Guard("lldmon likelihood measurement")
        self._lldmon_probe_guard = _Guard("lldmon post-update probe")
        self._lldmon_anchor_guard = _Guard("lldmon anchor set")
        self._lldmon_scalar_guard = _Guard("lldmon per-step TRL scalars")
        self._lldmon_warned_zero = False
        self._lldmon_acc = StepAccumulator(
            eps=lld_eps,
            clip_eps=float(self.epsilon_low),
            max_action_records=max_action_records,
            success_threshold=success_threshold,
        )
        self.lldmon_anchor_interval = anchor_interval
        self.lldmon_anchors: AnchorSet | None = None
        if (
            lldmon_sink is not None
            and success_threshold is not None
            and anchor_size > 0
            and anchor_interval > 0
        ):
            if int(self.accelerator.num_processes) == 1:
                self.lldmon_anchors = AnchorSet(
                    capacity=anchor_size, success_threshold=float(success_threshold), eps=lld_eps
                )
            else:
                logger.warning(
                    "lldmon: the anchor set (lld/anchor/*) is single-process only for now; it is off in "
                    "this %d-process job",
                    int(self.accelerator.num_processes),
                )
        self._lldmon_metric_counts: dict[str, int] = {}
        self._lldmon_step_keys: set[str] = set()
        self._lldmon_loss_seen = 0.0
        self._lldmon_last_step_sent = -1
        self._lldmon_capture: list[Tensor] | None = None
        self._lldmon_rewards_per_func: Tensor | None = None
        self._lldmon_rollout_version = -1  # global_step when the current rollout batch was generated
        self._lldmon_rollouts = 0
        self._lldmon_probe: ProbeBatch | None = None
        self._lldmon_probe_gen = torch.Generator(device="cpu").manual_seed(probe_seed)
        self._lldmon_metrics: dict[int, dict[str, float]] = {}
        self._lldmon_actions: list[tuple[int, dict[str, list[Any]]]] = []
        self._lldmon_callback: _MonitoredCallback | None = None
        if lldmon_sink is not None:
            self._lldmon_callback = _MonitoredCallback(self, lldmon_sink, flush_timeout=flush_timeout)
            self.add_callback(self._lldmon_callback)
        # LLDS / SAPO
        self._llds_warn = WarnOnce(logger)
        self.llds_settings = self._llds_agree_mode(llds_settings)
        llds_settings = self.llds_settings
        self._llds_switch: LLDSSwitch | None = None  # in force for the current optimizer step
        if llds_settings.mode == "on":
            self._llds_switch = LLDSSwitch(enabled=True, lam=llds_settings.lam, reason="llds='on'")
        elif llds_settings.mode == "auto":
            self._llds_switch = LLDSSwitch(enabled=False, lam=0.0, reason="no directive read yet")
        self._llds_directive_seen = False
        self._llds_guard = _Guard("the LLDS/SAPO regulariser")
        self._llds_warned_noop = False
        self._llds_step_stats = RegularizerStep()
        self._llds_beta = (
            llds_settings.answer_weight if isinstance(llds_settings.answer_weight, float) else 1.0
        )
        self._llds_valid_searches = math.nan
        if llds_settings.any_on:
            self.add_callback(_RegularizerCallback(self))

    # ------------------------------------------------------------------------------------------
    # configuration

    @property
    def lldmon_active(self) -> bool:
        """Whether the in-loss measurement is on (a sink is set and no failure switched it off)."""
        return self.lldmon_sink is not None and self._lldmon_measure_guard.enabled

    @property
    def lldmon_probe_enabled(self) -> bool:
        return (
            self.lldmon_sink is not None
            and self.lldmon_probe_size > 0
            and self.lldmon_probe_interval > 0
            and self._lldmon_probe_guard.enabled
        )

    @property
    def lldmon_in_loss_deltas_zero(self) -> bool:
        """True when TRL's schedule makes every in-loss delta exactly 0 (see the module docstring)."""
        args: Any = self.args  # a GRPOConfig
        return in_loss_deltas_structurally_zero(
            int(args.gradient_accumulation_steps), int(args.steps_per_generation), int(self.num_iterations)
        )

    def _lldmon_check_config(self) -> None:
        args: Any = self.args
        if self.lldmon_sink is not None and not self.lldmon_probe_enabled and not self._lldmon_warned_zero:
            self._lldmon_warned_zero = True
            logger.warning(
                "lldmon: the post-update probe is off (probe_size=%d, probe_interval=%d): no exact "
                "lld/delta_* metric (Def. 4.1) will be reported%s. Set probe_size and probe_interval > 0.",
                self.lldmon_probe_size,
                self.lldmon_probe_interval,
                "" if self.lldmon_in_loss_deltas_zero else " (only the cross-mini-batch proxy lld/xmb/*)",
            )
        del args

    def _lldmon_is_main(self) -> bool:
        return bool(self.accelerator.is_main_process)

    def _lldmon_drifted(self) -> bool:
        """Whether an optimizer step happened since the current rollout batch was generated."""
        return int(self.state.global_step) > self._lldmon_rollout_version

    def _lldmon_training(self) -> bool:
        model: Any = self.model
        return bool(model.training)

    # ------------------------------------------------------------------------------------------
    # TRL hooks (TRL's own code always runs first and unguarded)

    def _calculate_rewards(
        self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any
    ) -> Any:
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._lldmon_rewards_per_func = rewards_per_func if isinstance(rewards_per_func, Tensor) else None
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: Any) -> Any:
        tool_metrics_before = self._llds_tool_metric_counts()
        output = super()._generate_and_score_completions(inputs)
        rewards_per_func, self._lldmon_rewards_per_func = self._lldmon_rewards_per_func, None
        if not self._lldmon_training():
            return output
        self._lldmon_rollout_version = int(self.state.global_step)
        if self.llds_settings.needs_answer_mask and self._llds_guard.enabled:
            with self._llds_guard():
                self._llds_tag_rollout(output, tool_metrics_before)
        if self.lldmon_sink is None:
            return output
        if not (self._lldmon_measure_guard.enabled or self.lldmon_probe_enabled):
            return output
        with self._lldmon_measure_guard():
            self._lldmon_tag_rollout(output, rewards_per_func)
        return output

    def _lldmon_tag_rollout(self, output: dict[str, Any], rewards_per_func: Tensor | None) -> None:
        completion_ids: Tensor = output["completion_ids"]
        batch, device = completion_ids.shape[0], completion_ids.device
        world, rank = int(self.accelerator.num_processes), int(self.accelerator.process_index)
        first = (self._lldmon_rollouts * world + rank) * batch
        self._lldmon_rollouts += 1
        traj_id = torch.arange(first, first + batch, dtype=torch.int64, device=device)
        output["lldmon_traj_id"] = traj_id
        rewards = self._lldmon_local_rewards(rewards_per_func, batch, rank)
        if rewards is not None:
            output["lldmon_rewards"] = rewards
        mask = output["completion_mask"]
        if "tool_mask" in output:
            mask = mask * output["tool_mask"]
        anchors = self.lldmon_anchors
        if (
            anchors is not None
            and rewards is not None
            and not anchors.full
            and self._lldmon_anchor_guard.enabled
            and not any(key in output for key in _MULTIMODAL_KEYS)
        ):
            with self._lldmon_anchor_guard():
                anchors.offer(
                    prompt_ids=output["prompt_ids"],
                    prompt_mask=output["prompt_mask"],
                    completion_ids=completion_ids,
                    completion_mask=output["completion_mask"],
                    loss_mask=mask,
                    rewards=rewards,
                    step=int(self.state.global_step),
                )

        self._lldmon_probe = None
        if self.lldmon_probe_enabled and not any(key in output for key in _MULTIMODAL_KEYS):
            with self._lldmon_probe_guard():
                self._lldmon_probe = ProbeBatch.select(
                    prompt_ids=output["prompt_ids"],
                    prompt_mask=output["prompt_mask"],
                    completion_ids=completion_ids,
                    completion_mask=output["completion_mask"],
                    loss_mask=mask,
                    advantages=output["advantages"],
                    rewards=rewards,
                    traj_id=traj_id,
                    old_logp=output.get("old_per_token_logps"),
                    size=self.lldmon_probe_size,
                    generator=self._lldmon_probe_gen,
                )

    def _lldmon_local_rewards(self, rewards_per_func: Tensor | None, batch: int, rank: int) -> Tensor | None:
        """This process's rewards, weighted and summed over reward functions as TRL logs them."""
        if rewards_per_func is None or rewards_per_func.dim() != 2:
            return None
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards = torch.where(
            torch.isnan(rewards_per_func).all(dim=1), torch.full_like(rewards, math.nan), rewards
        )
        local = rewards[rank * batch : (rank + 1) * batch]
        return local if local.shape[0] == batch else None

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._lldmon_capture is not None and isinstance(result, tuple) and isinstance(result[0], Tensor):
            self._lldmon_capture.append(result[0])
        return result

    def _compute_loss(self, model: Any, inputs: Any) -> Any:
        training = self._lldmon_training()
        measure = (
            (self.lldmon_active or self._lldmon_probe is not None) and training and "lldmon_traj_id" in inputs
        )
        regularise = training and self._llds_adding()
        if not (measure or regularise):
            return super()._compute_loss(model, inputs)  # type: ignore[no-untyped-call]
        captured: list[Tensor] = []
        self._lldmon_capture = captured
        try:
            loss = super()._compute_loss(model, inputs)  # type: ignore[no-untyped-call]
        finally:
            self._lldmon_capture = None
        if captured:
            if regularise:
                loss = self._llds_add(loss, inputs, captured[0])
            if measure:
                self._lldmon_collect(inputs, captured[0])
        elif regularise:
            self._llds_warn(
                "no-logp",
                "lldmon: the loss's log-probs could not be captured (TRL internals changed?); "
                "the LLDS/SAPO term is not added",
            )
        return loss

    def _lldmon_collect(self, inputs: Mapping[str, Any], logp: Tensor) -> None:
        """Fill the probe's rollout-time log-probs, and queue the micro-batch (main process)."""
        new = logp.detach()
        traj_id: Tensor = inputs["lldmon_traj_id"]
        old_in: Tensor | None = inputs.get("old_per_token_logps")
        probe = self._lldmon_probe
        if old_in is None and probe is not None and self._lldmon_probe_guard.enabled:
            with self._lldmon_probe_guard():
                probe.capture(traj_id, new)
        if self._lldmon_measure_guard.enabled and self._lldmon_is_main():
            with self._lldmon_measure_guard():
                self._lldmon_accumulate(inputs, new, traj_id, old_in)

    def _lldmon_accumulate(
        self, inputs: Mapping[str, Any], new: Tensor, traj_id: Tensor, old_in: Tensor | None
    ) -> None:
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        drift = old_in is not None and self._lldmon_drifted()
        new_copy = new.clone()
        self._lldmon_acc.add(
            MicroBatch(
                new_logp=new_copy,
                old_logp=old_in.detach() if old_in is not None else new_copy,
                mask=mask.detach(),
                advantages=inputs["advantages"].detach(),
                rewards=inputs.get("lldmon_rewards"),
                traj_id=traj_id,
                drift=drift,
            )
        )

    # ------------------------------------------------------------------------------------------
    # per-step delivery of TRL's scalars (see "Per-step delivery" in the module docstring)

    def _maybe_log_save_evaluate(self, tr_loss: Any, grad_norm: Any, *args: Any, **kwargs: Any) -> None:
        callback = self._lldmon_callback
        step = int(self.state.global_step)
        if (
            callback is not None
            and self._lldmon_is_main()
            and self._lldmon_scalar_guard.enabled
            and step != self._lldmon_last_step_sent  # transformers calls this again at an epoch's end
        ):
            self._lldmon_last_step_sent = step
            with self._lldmon_scalar_guard():
                logs = self._lldmon_step_scalars(tr_loss, grad_norm, kwargs.get("learning_rate"))
                callback._send(step, logs, final=False, per_step=True)
        super()._maybe_log_save_evaluate(tr_loss, grad_norm, *args, **kwargs)
        if callback is not None and self._lldmon_scalar_guard.enabled:
            with self._lldmon_scalar_guard():
                self._lldmon_loss_seen = float(tr_loss.item()) if isinstance(tr_loss, Tensor) else 0.0
                self._lldmon_snapshot_metric_counts()

    def _lldmon_snapshot_metric_counts(self) -> None:
        metrics: Any = self._metrics["train"]
        self._lldmon_metric_counts = {key: len(values) for key, values in metrics.items()}

    def _lldmon_step_scalars(self, tr_loss: Any, grad_norm: Any, learning_rate: Any) -> dict[str, object]:
        """TRL's scalars of the optimizer step that just ended, under TRL's own log keys.

        `GRPOTrainer._metrics["train"]` entries appended since the last step, averaged as TRL's
        `log` averages them (NaN entries skipped; all NaN -> NaN), plus the step's loss (the growth
        of transformers' running `tr_loss`), grad norm, learning rate and epoch.
        """
        logs: dict[str, object] = {}
        metrics: Any = self._metrics["train"]
        for key, values in metrics.items():
            new = values[self._lldmon_metric_counts.get(key, 0) :]
            if not new:
                continue
            valid = [float(v) for v in new if not math.isnan(float(v))]
            logs[key] = sum(valid) / len(valid) if valid else math.nan
        if isinstance(tr_loss, Tensor):
            logs["loss"] = float(tr_loss.item()) - self._lldmon_loss_seen
        if grad_norm is not None:
            logs["grad_norm"] = grad_norm
        if learning_rate is not None:
            logs["learning_rate"] = learning_rate
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        self._lldmon_step_keys.update(logs)
        return logs

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        super().log(logs, start_time)
        if self._lldmon_callback is not None:
            self._lldmon_snapshot_metric_counts()  # TRL cleared what it averaged

    # ------------------------------------------------------------------------------------------
    # after the optimizer step (private callback, on every process)

    def _lldmon_step_end(self, step: int) -> None:
        if self.lldmon_sink is None:
            return
        if self._lldmon_measure_guard.enabled and self._lldmon_is_main():
            with self._lldmon_measure_guard():
                self._lldmon_queue(step, self._lldmon_acc.finish(step))
        self._lldmon_acc.clear()
        if (
            self.lldmon_probe_enabled
            and step % self.lldmon_probe_interval == 0
            and self._lldmon_probe is not None
        ):
            with self._lldmon_probe_guard():
                self._lldmon_run_probe(step, self._lldmon_probe)
        anchors = self.lldmon_anchors
        if (
            anchors is not None
            and len(anchors) > 0
            and step % self.lldmon_anchor_interval == 0
            and self._lldmon_anchor_guard.enabled
        ):
            with self._lldmon_anchor_guard():
                self._lldmon_score_anchors(step, anchors)

    def _lldmon_score(self, input_ids: Tensor, attention_mask: Tensor, logits_to_keep: int) -> Tensor:
        """Per-token log-probs of the last `logits_to_keep` tokens under the current model (no grad)."""
        model: Any = self.model
        args: Any = self.args
        with torch.no_grad(), disable_gradient_checkpointing(model, args.gradient_checkpointing_kwargs):
            new, _, _ = super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size=self.args.per_device_train_batch_size,
            )
        out: Tensor = new.float()
        return out

    def _lldmon_score_anchors(self, step: int, anchors: AnchorSet) -> None:
        batch = anchors.batch(self.accelerator.device)
        new = self._lldmon_score(batch.input_ids, batch.attention_mask, batch.logits_to_keep)
        metrics = anchors.measure(new, step)
        if metrics:
            self._lldmon_metrics.setdefault(step, {}).update(metrics)

    def _lldmon_run_probe(self, step: int, probe: ProbeBatch) -> None:
        new = self._lldmon_score(probe.input_ids, probe.attention_mask, probe.logits_to_keep)
        if self._lldmon_is_main():
            result = probe.measure(
                new,
                step=step,
                eps=self.lldmon_eps,
                clip_eps=float(self.epsilon_low),
                max_action_records=self.lldmon_max_action_records,
                success_threshold=self.lldmon_success_threshold,
            )
            self._lldmon_queue(step, result)

    def _lldmon_queue(self, step: int, result: StepResult | None) -> None:
        if result is None:
            return
        if result.metrics:
            self._lldmon_metrics.setdefault(step, {}).update(result.metrics)
        if result.actions is not None and result.actions["step"]:
            self._lldmon_actions.append((step, result.actions))

    def _lldmon_drain_metrics(self, step: int, final: bool) -> dict[int, dict[str, float]]:
        ready = {s: m for s, m in self._lldmon_metrics.items() if final or s <= step}
        for s in ready:
            del self._lldmon_metrics[s]
        return ready

    def _lldmon_drain_actions(self, step: int, final: bool) -> list[tuple[int, dict[str, list[Any]]]]:
        ready = [(s, a) for s, a in self._lldmon_actions if final or s <= step]
        self._lldmon_actions = [(s, a) for s, a in self._lldmon_actions if not (final or s <= step)]
        return ready

    # ------------------------------------------------------------------------------------------
    # LLDS / SAPO (see the module docstring)

    @property
    def llds_switch(self) -> LLDSSwitch | None:
        """The LLDS setting in force for the current optimizer step (None: llds="off")."""
        return self._llds_switch

    @property
    def llds_active(self) -> bool:
        """Whether the LLDS term is added in the current optimizer step."""
        return self._llds_switch is not None and self._llds_switch.active and self._llds_guard.enabled

    def _llds_agree_mode(self, settings: RegularizerSettings) -> RegularizerSettings:
        """With several processes, every rank takes the main process's LLDS mode.

        llds="auto" broadcasts the directive at every optimizer step, a collective that every rank
        must join; the default mode depends on the sink, which a job may pass on the main process
        only. One broadcast here (every rank constructs the trainer) makes the modes agree.
        """
        if int(self.accelerator.num_processes) <= 1:
            return settings
        from accelerate.utils import broadcast

        modes: tuple[LLDSMode, ...] = ("off", "on", "auto")
        try:
            local = torch.tensor([modes.index(settings.mode)], device=self.accelerator.device)
            main = modes[int(broadcast(local, from_process=0).item())]
        except Exception as exc:
            self._llds_warn(
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

    def _llds_adding(self) -> bool:
        return self._llds_guard.enabled and (
            (self._llds_switch is not None and self._llds_switch.active) or self.llds_settings.sapo_weight > 0
        )

    def _llds_check_config(self) -> None:
        if self._llds_warned_noop or not self.llds_settings.any_on or not self.lldmon_in_loss_deltas_zero:
            return
        self._llds_warned_noop = True
        args: Any = self.args
        terms = [f"LLDS (llds={self.llds_settings.mode!r})"] if self.llds_settings.mode != "off" else []
        if self.llds_settings.sapo_weight > 0:
            terms.append("SAPO's term")
        logger.warning(
            "lldmon: %s is a no-op in this configuration: with gradient_accumulation_steps=%d, "
            "steps_per_generation=%d and num_iterations=%d TRL trains every micro-batch before the first "
            "optimizer step after its rollout, so old == current log-probs and the term is always 0. Fix: "
            "steps_per_generation > gradient_accumulation_steps (e.g. steps_per_generation = 2 * "
            "gradient_accumulation_steps: two optimizer steps per rollout batch) or num_iterations > 1.",
            " and ".join(terms),
            args.gradient_accumulation_steps,
            args.steps_per_generation,
            self.num_iterations,
        )

    def _llds_tool_metric_counts(self) -> tuple[int, int]:
        metrics: Any = self._metrics["train"]
        return len(metrics.get("tools/call_frequency", ())), len(metrics.get("tools/failure_frequency", ()))

    def _llds_new_tool_metric(self, key: str, before: int) -> float | None:
        values: Any = self._metrics["train"].get(key, ())
        return float(values[-1]) if len(values) > before else None

    def _lldmon_tokenizer(self) -> Any:
        tokenizer = getattr(self, "_tokenizer", None)
        return tokenizer if tokenizer is not None else self.processing_class

    def _llds_tag_rollout(self, output: dict[str, Any], tool_metrics_before: tuple[int, int]) -> None:
        """Per rollout batch: LLDS-MA's beta and the answer-span mask column (when beta != 1)."""
        settings = self.llds_settings
        completion_mask: Tensor = output["completion_mask"]
        if settings.answer_weight == "ma":
            mask = completion_mask * output["tool_mask"] if "tool_mask" in output else completion_mask
            self._llds_valid_searches, self._llds_beta = ma_answer_weight(
                self._llds_new_tool_metric("tools/call_frequency", tool_metrics_before[0]),
                self._llds_new_tool_metric("tools/failure_frequency", tool_metrics_before[1]),
                mask,
                schedule=settings.ma_schedule,
            )
        if self._llds_beta != 1.0:
            output[_ANSWER_MASK_KEY] = answer_token_mask(
                self._lldmon_tokenizer(), output["completion_ids"], completion_mask, settings.answer_pattern
            )

    def _llds_add(self, loss: Tensor, inputs: Mapping[str, Any], logp: Tensor) -> Tensor:
        """`loss` plus the scaled LLDS/SAPO term; `loss` unchanged if computing the term fails."""
        out = loss
        with self._llds_guard():
            out = loss + self._llds_term(inputs, logp)
        return out

    def _llds_term(self, inputs: Mapping[str, Any], logp: Tensor) -> Tensor:
        settings, switch = self.llds_settings, self._llds_switch
        mask: Tensor = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        old: Tensor | None = inputs.get("old_per_token_logps")
        if old is None or not self._lldmon_drifted():
            # No optimizer step since the rollout: no displacement, whatever a recomputed
            # old_per_token_logps (vLLM importance-sampling correction) says. Term = 0, still attached.
            old = logp.detach()
        advantages: Tensor = inputs["advantages"]
        terms: list[Tensor] = []
        llds_part: tuple[Tensor, LLDSStats] | None = None
        sapo_part: tuple[Tensor, SAPOStats] | None = None
        if switch is not None and switch.active:
            answer_mask: Tensor | None = inputs.get(_ANSWER_MASK_KEY)
            llds_part = llds_loss(
                logp,
                old,
                mask,
                advantages,
                gate=settings.gate,
                answer_mask=answer_mask,
                answer_weight=self._llds_beta if answer_mask is not None else 1.0,
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
        args: Any = self.args

        def scale(normalize: Any) -> Tensor | float:
            return term_scale(
                loss_type=str(self.loss_type),
                normalize=normalize,
                grad_accum=int(
                    getattr(self, "current_gradient_accumulation_steps", args.gradient_accumulation_steps)
                ),
                n_loss_tokens=(mask != 0).sum(),
                num_items_in_batch=inputs.get("num_items_in_batch"),
                num_processes=int(self.accelerator.num_processes),
                steps_per_generation=int(args.steps_per_generation),
            )

        if llds_part is not None and switch is not None:
            terms.append(switch.lam * llds_part[0] * scale(settings.normalize))
        if sapo_part is not None:
            terms.append(settings.sapo_weight * sapo_part[0] * scale(settings.sapo_normalize))
        term = terms[0] if len(terms) == 1 else terms[0] + terms[1]
        if llds_part is not None:
            self._llds_step_stats.add_llds(*llds_part)
        if sapo_part is not None:
            self._llds_step_stats.add_sapo(*sapo_part)
        return term

    def _llds_step_begin(self, step: int) -> None:
        """Fix the LLDS setting of optimizer step `step` (auto: the sink's directive, read once here)."""
        self._llds_step_stats.clear()
        if self.llds_settings.mode != "auto":
            return
        switch: LLDSSwitch | None = None
        if self._lldmon_is_main():
            try:
                switch = read_directive(self.lldmon_sink)
            except Exception as exc:
                self._llds_warn(
                    ("directive", type(exc).__name__),
                    "lldmon: cannot read the sink's directive; LLDS keeps its current setting: %r",
                    exc,
                )
        if int(self.accelerator.num_processes) > 1:
            switch = self._llds_broadcast(switch)
        if switch is not None:
            self._llds_apply(switch, step)

    def _llds_broadcast(self, switch: LLDSSwitch | None) -> LLDSSwitch | None:
        """The main process's directive on every rank, so all ranks add the same term."""
        from accelerate.utils import broadcast

        device = self.accelerator.device
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
            self._llds_warn(
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

    def _llds_apply(self, switch: LLDSSwitch, step: int) -> None:
        current = self._llds_switch
        changed = (
            not self._llds_directive_seen
            or current is None
            or (switch.enabled, switch.lam, switch.version) != (current.enabled, current.lam, current.version)
        )
        self._llds_directive_seen = True
        self._llds_switch = switch
        if changed and self._lldmon_is_main():
            logger.info(
                "lldmon: LLDS %s from optimizer step %d by the service's directive (version %s, reason: %s)%s",
                "on" if switch.active else "off",
                step,
                switch.version,
                switch.reason or "-",
                f", lambda={switch.lam:g}" if switch.enabled else "",
            )

    def _llds_step_end(self, step: int) -> None:
        """Queue the step's llds/* (and sapo/*) metrics for the sink (main process)."""
        if self.lldmon_sink is None or not self._lldmon_is_main():
            self._llds_step_stats.clear()
            return
        switch = self._llds_switch
        if switch is not None and not self._llds_guard.enabled:  # switched off by a failure
            switch = LLDSSwitch(enabled=False, lam=0.0)
        sapo = self.llds_settings.sapo_weight if self._llds_guard.enabled else 0.0
        try:
            metrics = self._llds_step_stats.finish(llds=switch, sapo_weight=sapo)
        except Exception as exc:
            self._llds_step_stats.clear()
            self._llds_warn(("llds-metrics", type(exc).__name__), "lldmon: llds/* metrics failed: %r", exc)
            return
        if metrics:
            self._lldmon_metrics.setdefault(step, {}).update(metrics)

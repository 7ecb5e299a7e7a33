"""The probe actor: `LLDMonTrainingWorker`, verl 0.9.1's actor `TrainingWorker` with lldmon's exact
post-update probe, anchor set and LLDS-MA inputs, and `install()`, which makes verl build it.

verl 0.9.1 has no hook after the optimizer step, so the subclass overrides `train_mini_batch`:
before verl's update it hands the loss what it cannot see (answer spans, rewards, V_s:
`trainer_hooks.verl.batch`, through `LossExtras`); after it, it re-scores `lldmon_probe_size` rows
(the exact Def. 4.1 `lld/delta_*`) and the anchor set (`lld/anchor/*`), and returns those metrics
with verl's, each with its 0/1 weight. Failures of lldmon's parts are logged once (logger
`lldmon.verl`) and never stop training; the update itself is verl's. Why, wiring, settings, cost and
limits: docs/hooks-verl.md.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import torch
from torch import Tensor

from trainer_hooks import rollback
from trainer_hooks._warn import WarnOnce
from trainer_hooks.anchors import AnchorSet
from trainer_hooks.likelihood import measure_step
from trainer_hooks.probe_rows import probe_rows
from trainer_hooks.verl.batch import (
    ANSWER_MASK_KEY,
    REWARDS_KEY,
    AnswerSpanFinder,
    column,
    padded,
    rewards_from_batch,
    valid_searches_from_batch,
)
from trainer_hooks.verl.config import LossSettings
from trainer_hooks.verl.loss_extras import LossExtras, loss_extras
from trainer_hooks.verl.names import ANCHOR_METRICS, PROBE_METRICS, VS_SOURCE, weight_key

__all__ = ["install", "training_worker_class"]

logger = logging.getLogger("lldmon.verl")

_PACKAGE: Final = __name__.rpartition(".")[0]
_CLASS_PATH: Final = f"{_PACKAGE}.LLDMonTrainingWorker"


_class: type | None = None
_class_lock = threading.Lock()


def training_worker_class() -> type:
    """`LLDMonTrainingWorker`: verl's `TrainingWorker` with the probe (see the module docstring).

    Created on first use and reachable as `trainer_hooks.verl.LLDMonTrainingWorker`.
    """
    global _class
    with _class_lock:
        if _class is None:
            _class = _build_class()
        return _class


def install() -> Callable[[], None]:
    """Make verl's `ActorRolloutRefWorker` build its actor as `LLDMonTrainingWorker` **in this process**.

    Needed in every actor worker process before `init_model` (lldmon's policy-loss config does it
    when verl builds it there). A class that is already a subclass of `LLDMonTrainingWorker` is
    kept; another custom actor class is replaced, with a warning. Returns an undo function.
    """
    from verl.workers.engine_workers import ActorRolloutRefWorker

    cls = training_worker_class()
    previous = ActorRolloutRefWorker.actor_worker_cls
    if isinstance(previous, type) and issubclass(previous, cls):
        return lambda: None
    if previous.__name__ != "TrainingWorker":
        logger.warning("lldmon: replacing the custom actor worker class %s by %s", previous, _CLASS_PATH)
    ActorRolloutRefWorker.actor_worker_cls = cls

    def undo() -> None:
        ActorRolloutRefWorker.actor_worker_cls = previous

    return undo


def _build_class() -> type:
    from verl.single_controller.base.decorator import (
        Dispatch,
        make_nd_compute_dataproto_dispatch_fn,
        register,
    )
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import TrainingWorker

    class LLDMonTrainingWorker(TrainingWorker):  # type: ignore[misc]
        """verl's actor `TrainingWorker` plus lldmon's post-update probe, anchor set and LLDS-MA
        inputs (`trainer_hooks.verl.actor`)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._lldmon_step = 0
            self._lldmon_warn = WarnOnce(logger)
            self._lldmon_finder: AnswerSpanFinder | None = None
            self._lldmon_anchors: AnchorSet | None = None

        # --- helpers --------------------------------------------------------------------------

        def _lldmon_settings(self) -> LossSettings:
            loss_fn: Any = getattr(self, "loss_fn", None)
            config = getattr(loss_fn, "keywords", {}).get("config")
            return LossSettings.from_config(config) if config is not None else LossSettings()

        def _lldmon_dp(self) -> tuple[Any, int, int]:
            group = self.engine.get_data_parallel_group()
            size = self.engine.get_data_parallel_size()
            rank = self.engine.get_data_parallel_rank()
            return (group if size > 1 else None), size, rank

        def _lldmon_reduce(self, values: list[float], op: str) -> list[float]:
            group, _, _ = self._lldmon_dp()
            if group is None:
                return values
            t = torch.tensor(values, dtype=torch.float64, device=self.device_name)
            reduce_op = torch.distributed.ReduceOp.MAX if op == "max" else torch.distributed.ReduceOp.SUM
            torch.distributed.all_reduce(t, op=reduce_op, group=group)
            return [float(v) for v in t.tolist()]

        def _lldmon_gather(self, metrics: dict[str, float]) -> dict[str, list[float]]:
            """Per-rank metrics as lists over the data-parallel group (the same dict on every rank)."""
            group, size, _ = self._lldmon_dp()
            if group is None:
                return {k: [v] for k, v in metrics.items()}
            gathered: list[Any] = [None] * size
            torch.distributed.all_gather_object(gathered, metrics, group=group)
            keys = sorted({k for d in gathered for k in d})
            return {k: [float(d.get(k, 0.0)) for d in gathered] for k in keys}

        def _lldmon_unit(self) -> int:
            """Row count granularity of `infer_batch` (fixed micro-batches must divide the batch)."""
            ec = self.engine_config
            if getattr(ec, "use_dynamic_bsz", False):
                return 1
            return max(int(getattr(ec, "infer_micro_batch_size_per_gpu", None) or 1), 1)

        def _lldmon_padded_rows(self, n: int) -> Tensor:
            """Indices 0..n-1 repeated up to the next multiple of the micro-batch size."""
            unit = self._lldmon_unit()
            return torch.arange(-(-n // unit) * unit) % max(n, 1)

        def _lldmon_score(self, td: Any, template: Any) -> Tensor | None:
            """(n, T) log-probs of the responses of verl-format `td` under the current policy."""
            from verl.workers.utils.padding import no_padding_2_padding

            temperature = column(template, "temperature")
            if temperature is not None and column(td, "temperature") is None:
                tu.assign_non_tensor(td, temperature=temperature)
            tu.assign_non_tensor(td, calculate_entropy=False, compute_loss=False)
            out = self.infer_batch(td)
            if out is None:
                return None
            scores: Tensor = no_padding_2_padding(tu.get(out, "log_probs"), td).float()
            return scores

        # --- before the update: what the loss cannot see ----------------------------------------

        def _lldmon_extras(self, data: Any) -> Tensor | None:
            """Adds the answer-span and reward columns to `data`; returns the rows' valid-search counts.
            Local only (no collective), so that an error here cannot leave other ranks waiting."""
            batch = int(data.batch_size[0])
            responses = column(data, "responses")
            attention = column(data, "attention_mask")
            if (
                isinstance(responses, Tensor)
                and isinstance(attention, Tensor)
                and not responses.is_nested
                and not attention.is_nested
            ):
                if self._lldmon_finder is None:
                    self._lldmon_finder = AnswerSpanFinder(self.model_config.tokenizer)
                lengths = attention[:, -responses.shape[1] :].sum(dim=1)
                data[ANSWER_MASK_KEY] = self._lldmon_finder.mask(responses.cpu(), lengths.cpu()).to(
                    responses.device
                )
            rewards = rewards_from_batch(data)
            if rewards is not None and rewards.shape == (batch,):
                data[REWARDS_KEY] = rewards
            counts, _ = valid_searches_from_batch(data, batch)
            return counts

        def _lldmon_valid_searches_mean(
            self, counts: Tensor | None, batch: int
        ) -> tuple[float | None, float]:
            """V_s over the data-parallel group (every rank calls this, whatever happened before)."""
            has = 1.0 if counts is not None else 0.0
            total, n, has_all = self._lldmon_reduce(
                [float(counts.sum()) if counts is not None else 0.0, float(batch), has], "sum"
            )
            _, size, _ = self._lldmon_dp()
            if has_all == size and n > 0:  # every rank has the count
                return total / n, 1.0
            return None, 0.0

        def _lldmon_wrap_loss(self, inner: Any, v_s: float | None) -> Callable[..., Any]:
            def loss_fn(*args: Any, **kwargs: Any) -> Any:
                data = kwargs.get("data")
                extras = LossExtras(
                    answer_mask=padded(column(data, ANSWER_MASK_KEY)),
                    rewards=padded(column(data, REWARDS_KEY)),
                    valid_searches_mean=v_s,
                )
                with loss_extras(extras):
                    return inner(*args, **kwargs)

            for attr in ("keywords", "func", "args"):  # keep what readers of a partial look at
                if hasattr(inner, attr):
                    setattr(loss_fn, attr, getattr(inner, attr))
            return loss_fn

        # --- after the update: probe and anchors ------------------------------------------------

        def _lldmon_probe_rows(self, data: Any, batch: int, settings: LossSettings) -> Tensor:
            _, _, rank = self._lldmon_dp()
            gen = torch.Generator().manual_seed(
                (settings.probe_seed * 1_000_003 + self._lldmon_step * 7919 + rank) % (2**63 - 1)
            )
            n = min(settings.probe_size, batch)
            adv, mask = padded(column(data, "advantages")), padded(column(data, "response_mask"))
            if adv is not None and mask is not None and adv.shape[0] == mask.shape[0] == batch:
                width = min(adv.shape[-1], mask.shape[1]) if adv.dim() == 2 else mask.shape[1]
                adv = adv[:, :width] if adv.dim() == 2 else adv
                rows = probe_rows(adv, mask[:, :width], n, gen).cpu()
            else:  # no advantages to stratify by: a uniform draw
                rows = torch.randperm(batch, generator=gen)[:n].sort().values
            return rows[self._lldmon_padded_rows(n)]  # the first n are the probe, the rest padding

        def _lldmon_probe(self, probe: Any, data: Any, settings: LossSettings) -> dict[str, float]:
            n = min(settings.probe_size, int(data.batch_size[0]))
            new = self._lldmon_score(probe, data)
            if new is None:
                return {}
            new = new[:n]
            old = column(probe, "old_log_probs")[:n]
            mask = column(probe, "response_mask")[:n]
            adv = column(probe, "advantages")[:n]
            rewards = padded(column(probe, REWARDS_KEY))
            rewards = rewards[:n] if rewards is not None else None
            answer = padded(column(probe, ANSWER_MASK_KEY))
            answer = answer[:n] if answer is not None else None
            width = min(new.shape[1], old.shape[1])
            result = measure_step(
                old_logp=old[:, :width].float(),
                new_logp=new[:, :width].to(old.device),
                mask=mask[:, :width],
                advantages=adv[:, :width] if adv.dim() == 2 else adv,
                rewards=rewards,
                answer_mask=answer[:, :width] if answer is not None else None,
                success_threshold=settings.success_threshold if rewards is not None else None,
                eps=settings.eps,
                max_action_records=0,
                source="probe",
                step=self._lldmon_step,
            ).metrics
            return _weighted(result, PROBE_METRICS)

        def _lldmon_anchor_offer(self, data: Any, settings: LossSettings) -> None:
            if settings.anchor_size <= 0:
                return
            if self._lldmon_anchors is None:
                _, size, _ = self._lldmon_dp()
                tok = self.model_config.tokenizer
                self._lldmon_anchors = AnchorSet(
                    capacity=math.ceil(settings.anchor_size / size),
                    success_threshold=settings.success_threshold,
                    eps=settings.eps,
                    pad_token_id=int(getattr(tok, "pad_token_id", 0) or 0),
                )
            anchors = self._lldmon_anchors
            rewards = column(data, REWARDS_KEY)
            prompts, responses = column(data, "prompts"), column(data, "responses")
            attention = column(data, "attention_mask")
            mask, old = column(data, "response_mask"), column(data, "old_log_probs")
            if anchors.full or not all(
                isinstance(t, Tensor) and not t.is_nested
                for t in (rewards, prompts, responses, attention, mask, old)
            ):
                return
            width_p = prompts.shape[1]
            anchors.offer(
                prompt_ids=prompts,
                prompt_mask=attention[:, :width_p],
                completion_ids=responses,
                completion_mask=attention[:, width_p : width_p + responses.shape[1]],
                loss_mask=mask,
                rewards=rewards,
                step=self._lldmon_step,
                old_logp=old,
            )

        def _lldmon_anchor_measure(self, data: Any, settings: LossSettings) -> dict[str, float] | None:
            anchors = self._lldmon_anchors
            if anchors is None or settings.anchor_size <= 0:
                return None
            if self._lldmon_step % settings.anchor_interval != 0:
                return None
            n_local = len(anchors)
            (n_max,) = self._lldmon_reduce([float(n_local)], "max")
            if n_max == 0:
                return None
            rows = len(self._lldmon_padded_rows(int(n_max)))
            # Every rank scores the same number of rows (FSDP: the same number of forward calls).
            if n_local > 0:
                b = anchors.batch()
                index = torch.arange(rows) % n_local
                td = _anchor_tensordict(b.input_ids[index], b.attention_mask[index], b.loss_mask[index])
            else:
                td = tu.index_select_tensor_dict(data, torch.zeros(rows, dtype=torch.long))
            new = self._lldmon_score(td, data)
            if n_local == 0 or new is None:
                return {}
            return _weighted(
                anchors.measure(new[:n_local, : b.logits_to_keep], step=self._lldmon_step), ANCHOR_METRICS
            )

        # --- the overrides ------------------------------------------------------------------------

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator]
        def load_checkpoint(
            self, local_path: Any, hdfs_path: Any = None, del_local_after_load: bool = False
        ) -> Any:
            """verl's restore; in a job restarted for a rollback, then the learning rate of a rollback
            (`resume_learning_rate`)."""
            configured = _base_rate(self.engine)  # before the restore: the config's rate
            result = super().load_checkpoint(local_path, hdfs_path, del_local_after_load)
            resume_learning_rate(self.engine, configured, self._lldmon_warn)
            return result

        @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)  # type: ignore[untyped-decorator]
        def train_mini_batch(self, data: Any) -> Any:
            self._lldmon_step += 1
            warn = self._lldmon_warn
            settings = LossSettings()
            v_s: float | None = None
            vs_source = 0.0
            probe = None
            counts: Tensor | None = None
            batch = int(data.batch_size[0])
            try:
                settings = self._lldmon_settings()
            except Exception as exc:  # the config was validated when built: not expected here
                warn(("settings", type(exc).__name__), "lldmon: probe actor settings: %r", exc)
            try:
                counts = self._lldmon_extras(data)
                if settings.probe_size > 0 and batch > 0:
                    probe = tu.index_select_tensor_dict(data, self._lldmon_probe_rows(data, batch, settings))
            except Exception as exc:
                warn(("prepare", type(exc).__name__), "lldmon: probe actor setup failed: %r", exc)
            try:
                v_s, vs_source = self._lldmon_valid_searches_mean(counts, batch)
            except Exception as exc:
                warn(("vs", type(exc).__name__), "lldmon: valid-search count failed: %r", exc)
            inner: Any = getattr(self, "loss_fn", None)
            if inner is not None:
                self.loss_fn = self._lldmon_wrap_loss(inner, v_s)
            try:
                output = super().train_mini_batch(data)
            finally:
                self.loss_fn = inner

            metrics: dict[str, float] = {VS_SOURCE: vs_source}
            if probe is not None:
                try:
                    metrics.update(self._lldmon_probe(probe, data, settings))
                except Exception as exc:
                    warn(("probe", type(exc).__name__), "lldmon: post-update probe failed: %r", exc)
            try:
                self._lldmon_anchor_offer(data, settings)
            except Exception as exc:
                warn(("anchor-offer", type(exc).__name__), "lldmon: anchor capture failed: %r", exc)
            try:
                anchor = self._lldmon_anchor_measure(data, settings)
                if anchor is not None:
                    metrics.update(anchor or _weighted({}, ANCHOR_METRICS))
            except Exception as exc:
                warn(("anchors", type(exc).__name__), "lldmon: anchor set failed: %r", exc)
            try:
                gathered = self._lldmon_gather(metrics)
                if output is not None:
                    out_metrics = tu.get(output, "metrics")
                    for key, values in gathered.items():
                        out_metrics[key] = values
            except Exception as exc:
                warn(("gather", type(exc).__name__), "lldmon: could not return probe metrics: %r", exc)
            return output

    # Importable and picklable by name, through the package's module __getattr__.
    LLDMonTrainingWorker.__module__ = _PACKAGE
    LLDMonTrainingWorker.__qualname__ = "LLDMonTrainingWorker"
    return LLDMonTrainingWorker


def _base_rate(engine: Any) -> float | None:
    """The first base rate of `engine`'s scheduler (its optimizer's rate without one); None: neither."""
    try:
        bases = list(getattr(getattr(engine, "lr_scheduler", None), "base_lrs", None) or [])
        if bases:
            return float(bases[0])
        groups = list(getattr(getattr(engine, "optimizer", None), "param_groups", None) or [])
        return float(groups[0]["lr"]) if groups else None
    except Exception:
        return None


def resume_learning_rate(engine: Any, configured: float | None, warn: WarnOnce) -> None:
    """In a job `lldmon supervise` restarted for a rollback, after verl restored its checkpoint (and
    with it the rates it was saved with, maybe scaled by an earlier rollback): the configured rate
    `configured` times the rollback's factor (`trainer_hooks.rollback.scale_learning_rate`) on
    `engine`'s optimizer and scheduler. Never raises: a failure is warned once, training goes on at
    the checkpoint's rate."""
    try:
        resumed = rollback.resumed()
        if resumed is None:
            return
        if configured is None:
            warn("lr-scale", "lldmon: cannot set the rollback's learning rate: the engine has no optimizer")
            return
        lr = configured * resumed.lr_scale
        rollback.scale_learning_rate(engine.optimizer, getattr(engine, "lr_scheduler", None), lr)
        logger.warning("lldmon: resumed from %s for a rollback, learning rate %g", resumed.checkpoint, lr)
    except Exception as exc:
        warn(("lr-scale", type(exc).__name__), "lldmon: cannot set the rollback's learning rate: %r", exc)


def _weighted(result: Mapping[str, float], names: Sequence[str]) -> dict[str, float]:
    """X and "lldmon/w/X" for each name: the value and 1.0 where measured, 0.0 and 0.0 where not."""
    out: dict[str, float] = {}
    for name in names:
        value = result.get(name)
        out[name] = float(value) if value is not None else 0.0
        out[weight_key(name)] = 1.0 if value is not None else 0.0
    return out


def _anchor_tensordict(input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor) -> Any:
    """verl's no-padding actor input for anchors laid out as left-padded prompt + right-padded response."""
    from verl import DataProto
    from verl.workers.utils.padding import left_right_2_no_padding

    width = loss_mask.shape[1]
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    proto = DataProto.from_dict(
        tensors={
            "prompts": input_ids[:, :-width],
            "responses": input_ids[:, -width:],
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "response_mask": loss_mask,
        }
    )
    return left_right_2_no_padding(proto.to_tensordict())

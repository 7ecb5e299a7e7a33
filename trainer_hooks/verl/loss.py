"""verl integration: lldmon's measurement and the LLDS regulariser as a verl policy loss, and
streaming of verl's per-step scalars to the lldmon service.

Written against verl 0.9.1 (engine workers, `verl/workers/utils/losses.py::ppo_loss`); verl is
imported lazily, so importing this module never needs it. Everything below that touches verl
objects types them as `Any`.

Policy loss ("lldmon")
======================

`register()` registers, with verl's `core_algos.register_policy_loss`, a policy loss that

1. calls a base policy loss (default "vanilla", any registered name) unchanged;
2. measures likelihood displacement of the micro-batch (`trainer_hooks.likelihood.measure_step`
   on detached tensors, no gradient) and adds the result to the returned metrics dict;
3. when LLDS is on, adds `lambda * llds_loss(...)` (`trainer_hooks.regularizers.llds_loss`) to the
   loss and reports `llds/active`, `llds/lambda`, `llds/loss`, `llds/gated_action_frac`.

Measurement and LLDS failures never crash training: the exception is logged once (logger
`lldmon.verl`) and the step goes on with the base loss. Invalid *configuration* values do raise
(`ValueError`, at config construction or on the first loss call): fail fast, before GPU hours.

Configuration (verl 0.9.1). verl builds `actor_rollout_ref.actor.policy_loss` into the dataclass
`verl.workers.config.PolicyLossConfig`, which rejects unknown keys. So swap in this module's
subclass, which adds lldmon's keys (and registers the loss in the process that builds the config,
i.e. in every Ray actor worker; no `register()` call is needed there)::

    actor_rollout_ref.actor.policy_loss._target_=trainer_hooks.verl.LLDMonPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=lldmon
    +actor_rollout_ref.actor.policy_loss.llds_lambda=0.2          # optional keys need the "+"
    actor_rollout_ref.actor.ppo_mini_batch_size=256 data.train_batch_size=512   # >= 2 updates/batch

Keys under `policy_loss` (`SETTING_KEYS`; unset or null = default):

=====================  ===============  ==========================================================
key                    default          meaning
=====================  ===============  ==========================================================
lldmon_base            "vanilla"        registered policy loss that computes the PPO/GRPO loss
lldmon_measure         true             emit lld metrics (false: only LLDS and the base loss)
lldmon_eps             0.0              an action/trajectory "decreased" when D < eps
lldmon_drift_atol      1e-3             a micro-batch counts as not drifted when the mean
                                        |log pi_new - log pi_old| over its loss tokens is <= this
                                        (recomputed old log-probs carry kernel noise; 0 = exact)
llds_lambda            0.0              LLDS weight; 0 = off (paper: 0.2, 0.3 for Qwen2.5-7B-Instr.)
llds_gate              "action"         "action" (Eq. 4) | "response" (Eq. 10) | "token" (Eq. 9)
llds_answer_weight     1.0              weight beta of answer tokens (LLDS-MA, Eq. 5); a float >= 0
                                        or "ma" (beta = `ma_beta` of the tool calls per response)
llds_normalize         "loss_tokens"    "loss_tokens" (authors' code) | "preserving_tokens" (paper)
llds_directive_file    null             JSON file read at every call (see "Switching LLDS")
=====================  ===============  ==========================================================

The clip threshold of `ratio/pos_frac_low` is the actor's `clip_ratio_low` (else `clip_ratio`).
With older verl versions that pass the actor config as an OmegaConf DictConfig, the same keys can
be added to `policy_loss` directly (no `_target_`), and `register()` must be called in the worker
processes (e.g. from a module named by `VERL_USE_EXTERNAL_MODULES`).

Decisions where verl's loss interface is narrower than lldmon's:

- verl passes no answer mask: the "answer span" of LLDS-MA is the **last action** (last maximal
  run of loss-mask tokens) of each response, which holds the final `<answer>` in Search-R1-style
  agents (and the reasoning right before it). "ma" uses the number of tool calls per response
  (actions - 1, valid or not) as V_s: verl passes no valid-search count to the loss.
- verl normalises its token-mean loss by the token count of the whole mini-batch (all micro-batches
  and data-parallel ranks, `config.global_batch_info`) and sums micro-batch losses. The LLDS term is
  scaled the same way (by the micro-batch's share of the mini-batch's loss tokens, times dp_size),
  so the effective weight is `lambda` whatever the micro-batch split: the authors' per-micro-batch
  normalisation averaged over the mini-batch. Without `global_batch_info` (older verl, direct calls)
  the term is `lambda * llds_loss(...)` of the micro-batch as it is.
- `llds/loss` and `llds/gated_action_frac` are micro-batch values of `llds_loss` (before lambda
  and the scaling above).

Metrics of the loss and how they survive verl's aggregation
-----------------------------------------------------------
verl averages each metric over micro-batches, mini-batches and data-parallel ranks, and its
data-parallel aggregation (`Metric.aggregate_dp`) *raises* if one rank reports a key on more
micro-batches than another. So the loss returns the **same keys on every call**:

- `X` for X in `LOSS_METRICS`: the micro-batch value of `measure_step` when it is defined there,
  else 0.0; and `weight_key(X)` = "lldmon/w/X": 1.0 when defined, 0.0 when not. `attach()` turns
  them back into X = mean(X) / mean(weight), the mean over the micro-batches where X is defined.
  Undefined means: an empty population (e.g. no A > 0 response in the micro-batch), or, for the
  delta metrics (`DELTA_METRICS`), a micro-batch that has not drifted (old == current log-probs: the
  first mini-batch of each rollout batch): a structural 0 is no measurement, and would read as LLD.
- "lldmon/adv_pos_mass", "lldmon/adv_neg_mass": per-micro-batch advantage masses; `attach()`
  derives `adv/pos_neg_mass_ratio` from their ratio (a per-micro-batch ratio could be +inf).
- `llds/active`, `llds/lambda` (0 when off), `llds/loss`, `llds/gated_action_frac` (0 when off).

`ratio/pos_min` is not emitted (verl would average micro-batch minima), nor `response/length_mean`
and `turns/mean` (verl logs them over the whole batch). No key contains "min" or "max", which
verl's `reduce_metrics` would reduce with min/max instead of a mean. In verl 0.9.1 all actor
metrics reach the logger prefixed "actor/" ("actor/lld/logp_pos"); read them through `attach()`.

Identical log-probs (one update per rollout batch). If no micro-batch has drifted on the second
mini-batch seen (mini-batches are told apart by `global_batch_info["batch_num_tokens"]`; without
it every call counts as one), a warning is logged once: every update then sees old == current,
in-loss deltas are structurally 0 and LLDS is a no-op (its gate never opens). Fix: more than one
update per rollout batch, `ppo_mini_batch_size < train_batch_size` (Search-R1: 256 of 512) or
`ppo_epochs > 1`. Kernel noise in the recomputed old log-probs above `lldmon_drift_atol` hides it.

Streaming verl's scalars: `attach(tracking, sink)`
==================================================
Wraps a `verl.utils.tracking.Tracking` instance's `log(data, step)` so that every logged dict also
goes to `sink.log(step, map_verl_metrics(data))`: names in `VERL_TO_CANONICAL` are renamed, lldmon's
loss metrics are re-assembled (above), every other scalar passes through under its own name. Errors
of the sink or the mapping are logged once and never reach verl.

verl's trainer creates its `Tracking` itself, inside the `TaskRunner` Ray actor (not in the process
that launches the job): `attach_new_trackings(sink_factory)` patches the class so that the
instances created afterwards in that process are attached; run it there, e.g. from a module named
in `VERL_USE_EXTERNAL_MODULES` (see its docstring). With a custom trainer or TaskRunner, calling
`attach(trainer.logger, client)` after `trainer.init()` works as well (v1 trainer).

Switching LLDS from the service's directive: what is and is not possible
------------------------------------------------------------------------
verl's config is static, and the loss runs in the Ray **actor worker processes**, not in the
process where `Tracking` and the `MonitorClient` live (the trainer's `TaskRunner` actor, called
"driver" below). A module-level override set in the driver does not reach the workers. What this
module offers, in order of precedence at every loss call:

1. `set_llds_override(enabled, lam)`: process-local. Effective only in the process that runs the
   loss (a worker, or single-process use and tests); calling it in verl's driver changes nothing.
2. `llds_directive_file`: the loss re-reads this JSON file (`{"llds": {"enabled": .., "lam": ..}}`,
   the service's directive format) whenever its mtime changes (one `os.stat` per call). The driver
   writes it: `attach(tracking, client, on_directive=directive_file_writer(path))`. This reaches
   the workers only if they see the same path: always on a single node, across nodes only on a
   shared filesystem. The switch takes effect on the micro-batches after the write (the next
   training step); data-parallel ranks may switch one micro-batch apart.
3. the static `llds_lambda` of the config.

Nothing here restarts workers or edits verl's config; without a shared path the only way to
switch LLDS in a running verl job is a restart with a new `llds_lambda` (e.g. from a checkpoint).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import numbers
import os
import tempfile
import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, get_args

import torch
from torch import Tensor

from contracts import metrics as M
from contracts.metrics import MAX_METRIC_NAME_LENGTH
from trainer_hooks.actions import action_ids, num_actions
from trainer_hooks.likelihood import measure_step, response_advantages
from trainer_hooks.regularizers import Gate, Normalize, llds_loss, ma_beta

__all__ = [
    "DELTA_METRICS",
    "LOSS_METRICS",
    "LOSS_NAME",
    "SETTING_KEYS",
    "VERL_TO_CANONICAL",
    "LossSettings",
    "MetricSink",
    "attach",
    "attach_new_trackings",
    "detach",
    "directive_file_writer",
    "get_llds_override",
    "llds_from_directive",
    "map_verl_metrics",
    "policy_loss_config_class",
    "register",
    "set_llds_override",
    "weight_key",
    "write_llds_directive",
]

logger = logging.getLogger("lldmon.verl")

LOSS_NAME: Final = "lldmon"
"""Default name of the registered policy loss (`policy_loss.loss_mode`)."""

DEFAULT_LLDS_LAMBDA: Final = 0.2
"""LLDS weight used when an override switches LLDS on without a lambda (lld-reference.md sec. 4)."""

_CONFIG_CLASS_PATH: Final = f"{__name__}.LLDMonPolicyLossConfig"

# ----------------------------------------------------------------------------------------------
# metric names

LEVEL_METRICS: Final = (M.LOGP_POS, M.LOGP_NEG, M.GARBLED_FRAC)
"""Loss metrics that are measurements also when old == current (rollout-time levels)."""
DELTA_METRICS: Final = (
    M.DELTA_TRAJ_POS,
    M.DELTA_TRAJ_NEG,
    M.DELTA_ACTION_POS,
    M.FRAC_TRAJ_DECREASED_POS,
    M.FRAC_ACTION_DECREASED_POS,
    M.RATIO_POS_MEAN,
    M.RATIO_POS_FRAC_LOW,
)
"""Loss metrics that are structurally 0 (no measurement) on micro-batches that have not drifted."""
LOSS_METRICS: Final = LEVEL_METRICS + DELTA_METRICS
"""`measure_step` metrics the loss returns (each with its weight key, see the module docstring)."""

_WEIGHT_PREFIX: Final = "lldmon/w/"
ADV_POS_MASS: Final = "lldmon/adv_pos_mass"
ADV_NEG_MASS: Final = "lldmon/adv_neg_mass"
LLDS_METRICS: Final = (M.LLDS_ACTIVE, M.LLDS_LAMBDA, M.LLDS_LOSS, M.LLDS_GATED_ACTION_FRAC)

_VERL_ACTOR_PREFIX: Final = "actor/"


def weight_key(name: str) -> str:
    """The key of the 0/1 weight that goes with loss metric `name` ("lldmon/w/<name>")."""
    return _WEIGHT_PREFIX + name


VERL_TO_CANONICAL: Final[Mapping[str, str]] = {
    "actor/entropy": M.ENTROPY_MEAN,  # entropy of the rollout batch (old-log-prob pass)
    "actor/entropy_loss": M.ENTROPY_MEAN,  # in-loss entropy (also older verl); if no actor/entropy
    "actor/grad_norm": M.GRAD_NORM,  # before clipping
    "actor/loss": M.LOSS,  # verl 0.9.1: total actor loss (pg + kl + entropy terms, + LLDS)
    "actor/ppo_kl": M.KL,  # masked mean of log pi_old - log pi_theta
    "actor/pg_clipfrac": M.CLIP_FRAC,
    "critic/score/mean": M.REWARD_MEAN,  # sequence score (reward before KL penalty)
    "response_length/mean": M.RESPONSE_LENGTH_MEAN,
    "response_length/clip_ratio": M.RESPONSE_CLIP_RATIO,
    "env/number_of_valid_search": M.SEARCH_VALID_PER_TRAJ,  # Search-R1's fork
    "num_turns/mean": M.TURNS_MEAN,  # verl's multi-turn agent loop
    "training/num_turns/mean": M.TURNS_MEAN,  # older location of the same
}
"""verl / Search-R1 logger key -> canonical metric name (lld-reference.md section 6); the one table.

When two keys map to the same canonical name in one dict, the earlier one in this table wins and
the other passes through under its own name. Every key not listed passes through unchanged, except
lldmon's own loss metrics ("lld/...", "llds/...", with or without verl's "actor/" prefix), which are
re-assembled by `map_verl_metrics`.
"""

# ----------------------------------------------------------------------------------------------
# settings

AnswerWeight = float | Literal["ma"]

SETTING_KEYS: Final[Mapping[str, str]] = {
    "lldmon_base": "base",
    "lldmon_measure": "measure",
    "lldmon_eps": "eps",
    "lldmon_drift_atol": "drift_atol",
    "llds_lambda": "llds_lambda",
    "llds_gate": "llds_gate",
    "llds_answer_weight": "llds_answer_weight",
    "llds_normalize": "llds_normalize",
    "llds_directive_file": "llds_directive_file",
}
"""Config key under `actor.policy_loss` -> `LossSettings` field."""


@dataclass(frozen=True)
class LossSettings:
    """lldmon's settings of the policy loss, read from `config.policy_loss` (see `SETTING_KEYS`)."""

    base: str = "vanilla"
    measure: bool = True
    eps: float = 0.0
    drift_atol: float = 1e-3
    llds_lambda: float = 0.0
    llds_gate: Gate = "action"
    llds_answer_weight: AnswerWeight = 1.0
    llds_normalize: Normalize = "loss_tokens"
    llds_directive_file: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.base, str) or not self.base:
            raise ValueError(f"lldmon_base must be a registered policy loss name, got {self.base!r}")
        for key, value in (
            ("lldmon_eps", self.eps),
            ("lldmon_drift_atol", self.drift_atol),
            ("llds_lambda", self.llds_lambda),
        ):
            if not math.isfinite(value):
                raise ValueError(f"{key} must be finite, got {value!r}")
        if self.drift_atol < 0 or self.llds_lambda < 0:
            raise ValueError("lldmon_drift_atol and llds_lambda must be >= 0")
        if self.llds_gate not in get_args(Gate):
            raise ValueError(f"llds_gate must be one of {get_args(Gate)}, got {self.llds_gate!r}")
        if self.llds_normalize not in get_args(Normalize):
            raise ValueError(
                f"llds_normalize must be one of {get_args(Normalize)}, got {self.llds_normalize!r}"
            )
        w = self.llds_answer_weight
        if w != "ma" and (isinstance(w, str) or not math.isfinite(w) or w < 0):
            raise ValueError(f'llds_answer_weight must be a finite number >= 0 or "ma", got {w!r}')

    @classmethod
    def from_config(cls, config: Any) -> LossSettings:
        """Settings from an actor config (`ActorConfig`, DictConfig or mapping) or its
        `policy_loss` section; missing keys and null values take the defaults.

        Raises:
            ValueError: a value of the wrong type or out of range (the message names the key).
        """
        section = _get(config, "policy_loss", None)
        if section is None:
            section = config
        values: dict[str, Any] = {}
        for key, field_name in SETTING_KEYS.items():
            value = _get(section, key, None)
            if value is None:
                continue
            try:
                values[field_name] = _coerce(field_name, value)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"policy_loss.{key}: {exc}") from exc
        return cls(**values)


def _coerce(field_name: str, value: Any) -> Any:
    if field_name == "measure":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise TypeError(f"expected a bool, got {value!r}")
    if field_name in ("eps", "drift_atol", "llds_lambda"):
        if isinstance(value, bool) or not isinstance(value, numbers.Real | str):
            raise TypeError(f"expected a number, got {value!r}")
        return float(value)
    if field_name == "llds_answer_weight":
        if isinstance(value, str) and value.strip().lower() == "ma":
            return "ma"
        if isinstance(value, bool) or not isinstance(value, numbers.Real | str):
            raise TypeError(f'expected a number or "ma", got {value!r}')
        return float(value)
    if field_name == "llds_directive_file":
        return os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _get(obj: Any, key: str, default: Any) -> Any:
    """`obj[key]` for verl's BaseConfig, OmegaConf DictConfig, dicts or plain objects."""
    if obj is None:
        return default
    getter = getattr(obj, "get", None)
    if callable(getter):
        try:
            return getter(key, default)
        except Exception:
            return default
    return getattr(obj, key, default)


# ----------------------------------------------------------------------------------------------
# LLDS switching: process-local override and directive file


_override_lock = threading.Lock()
_override: tuple[bool, float | None] | None = None


def set_llds_override(enabled: bool | None, lam: float | None = None) -> None:
    """Override the config's LLDS switch in **this process** (None: back to the config).

    `enabled=True` with `lam=None` keeps the config's `llds_lambda` if it is > 0, else uses 0.2.
    verl runs the loss in Ray worker processes: calling this in the driver has no effect on
    training (see the module docstring; use `llds_directive_file` to reach the workers).
    """
    global _override
    if lam is not None and (not math.isfinite(lam) or lam < 0):
        raise ValueError(f"lam must be finite and >= 0, got {lam!r}")
    with _override_lock:
        _override = None if enabled is None else (bool(enabled), None if lam is None else float(lam))


def get_llds_override() -> tuple[bool, float | None] | None:
    """The process-local override `(enabled, lam)` set by `set_llds_override`, or None."""
    with _override_lock:
        return _override


def llds_from_directive(directive: Any) -> tuple[bool, float] | None:
    """`(enabled, lam)` of a directive, or None if it has none or it is malformed.

    Accepts `trainer_hooks.client.Directive` (`.llds.enabled`, `.llds.lam`), the service's JSON
    shape `{"llds": {"enabled": .., "lam": ..}, ...}`, or a flat `{"enabled": .., "lam": ..}`.
    """
    try:
        llds = _get(directive, "llds", None)
        if llds is None:
            llds = directive
        enabled = _get(llds, "enabled", None)
        lam = _get(llds, "lam", None)
        if not isinstance(enabled, bool) or isinstance(lam, bool) or not isinstance(lam, numbers.Real):
            return None
        lam_f = float(lam)
        if not math.isfinite(lam_f) or lam_f < 0:
            return None
        return enabled, lam_f
    except Exception:
        return None


def write_llds_directive(path: str | os.PathLike[str], enabled: bool, lam: float) -> None:
    """Atomically write the LLDS switch that `llds_directive_file` readers pick up."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    body = json.dumps({"llds": {"enabled": bool(enabled), "lam": float(lam)}})
    fd, tmp = tempfile.mkstemp(prefix=".lldmon-directive-", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(body)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; workers may run as another user
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def directive_file_writer(path: str | os.PathLike[str]) -> Callable[[Any], None]:
    """An `on_directive` callback for `attach`: writes each new directive's LLDS switch to `path`."""

    def write(directive: Any) -> None:
        parsed = llds_from_directive(directive)
        if parsed is not None:
            write_llds_directive(path, *parsed)

    return write


class _DirectiveFile:
    """Reads `llds_directive_file` again only when it changed (inode, mtime, size); keeps the last
    good value while the file is malformed, forgets it when the file is removed."""

    def __init__(self) -> None:
        self._stamp: tuple[str, int, int, int] | None = None
        self._value: tuple[bool, float] | None = None

    def read(self, path: str, warn: _WarnOnce) -> tuple[bool, float] | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._stamp, self._value = None, None
            return None
        except OSError as exc:  # e.g. a shared filesystem hiccup: keep the last switch
            warn(("directive-file-stat", path), "lldmon: cannot stat llds_directive_file %s: %s", path, exc)
            return self._value
        stamp = (path, st.st_ino, st.st_mtime_ns, st.st_size)  # os.replace gives a new inode
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                with open(path) as fh:
                    parsed = llds_from_directive(json.load(fh))
                if parsed is None:
                    raise ValueError('expected {"llds": {"enabled": <bool>, "lam": <number >= 0>}}')
                self._value = parsed
            except (OSError, ValueError) as exc:
                warn(("directive-file", path), "lldmon: ignoring llds_directive_file %s: %s", path, exc)
        return self._value


# ----------------------------------------------------------------------------------------------
# the policy loss


class _WarnOnce:
    def __init__(self) -> None:
        self._seen: set[Hashable] = set()
        self._lock = threading.Lock()

    def __call__(self, key: Hashable, msg: str, *args: object) -> None:
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        with contextlib.suppress(Exception):  # logging must never break training
            logger.warning(msg, *args)


_SAME_LOGP_WARNING: Final = (
    "lldmon: old and current log-probs are identical (mean |delta| <= %g) on every micro-batch of "
    "the first %d mini-batches: one policy update per rollout batch. In-loss likelihood deltas are "
    "structurally 0 (no lld/delta_* metric) and LLDS is a no-op. Fix: more than one update per "
    "rollout batch, actor_rollout_ref.actor.ppo_mini_batch_size < data.train_batch_size "
    "(Search-R1: 256 of 512) or ppo_epochs > 1."
)


class _LossState:
    """Per-registration state: warnings, drift detection, the directive file."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.warn = _WarnOnce()
        self.directive_file = _DirectiveFile()
        self.drift_seen = False
        self.minibatches = 0
        self.last_minibatch_key: object = object()

    # --- drift -----------------------------------------------------------------------------

    def drifted(self, old: Tensor, new: Tensor, mask: Tensor, config: Any, atol: float) -> bool:
        """Whether this micro-batch's log-probs moved (mean |new - old| over mask tokens > atol)."""
        m = mask != 0
        count = m.sum()
        diff = torch.where(m, (new.double() - old.double()).abs(), torch.zeros((), dtype=torch.float64))
        mean_abs, n = torch.stack([diff.sum() / count.clamp(min=1).double(), count.double()]).tolist()
        info = _get(config, "global_batch_info", None)
        key = _get(info, "batch_num_tokens", None)
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

    # --- LLDS switch -------------------------------------------------------------------------

    def llds_weight(self, settings: LossSettings) -> float:
        """The LLDS lambda in force now (0 = off): process override > directive file > config."""
        override = get_llds_override()
        if override is None and settings.llds_directive_file:
            override = self.directive_file.read(settings.llds_directive_file, self.warn)
        if override is None:
            return settings.llds_lambda
        enabled, lam = override
        if not enabled:
            return 0.0
        if lam is None:
            lam = settings.llds_lambda if settings.llds_lambda > 0 else DEFAULT_LLDS_LAMBDA
        return lam


def _measure(
    old: Tensor,
    new: Tensor,
    mask: Tensor,
    advantages: Tensor,
    *,
    drifted: bool,
    settings: LossSettings,
    clip_eps: float,
) -> dict[str, float]:
    result = measure_step(
        old_logp=old,
        new_logp=new,
        mask=mask,
        advantages=advantages,
        eps=settings.eps,
        clip_eps=clip_eps,
        max_action_records=0,
    ).metrics
    out: dict[str, float] = {}
    for name in LOSS_METRICS:
        value = result.get(name)
        defined = value is not None and (drifted or name not in DELTA_METRICS)
        out[name] = float(value) if defined and value is not None else 0.0
        out[weight_key(name)] = 1.0 if defined else 0.0
    # Advantage masses as in measure_step's adv/pos_neg_mass_ratio (rows with loss tokens; a NaN
    # advantage lands in both sums); attach() derives the ratio from their means.
    adv = response_advantages(advantages, mask).double()
    rows = (mask != 0).any(dim=1)
    zero = torch.zeros_like(adv)
    pos = torch.where(rows & ~(adv <= 0), adv, zero).sum()
    neg = torch.where(rows & ~(adv >= 0), -adv, zero).sum()
    out[ADV_POS_MASS], out[ADV_NEG_MASS] = torch.stack([pos, neg]).tolist()
    return out


def _empty_measurement() -> dict[str, float]:
    out = {name: 0.0 for name in LOSS_METRICS}
    out.update({weight_key(name): 0.0 for name in LOSS_METRICS})
    out[ADV_POS_MASS] = 0.0
    out[ADV_NEG_MASS] = 0.0
    return out


def _last_action_mask(mask: Tensor) -> tuple[Tensor, Tensor]:
    """(B, T) bool mask of each row's last action, and (B,) number of actions per row."""
    ids = action_ids(mask)
    n_act = num_actions(ids)
    return (ids >= 0) & (ids == (n_act - 1)[:, None]), n_act


def _llds_term(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    lam: float,
    settings: LossSettings,
    config: Any,
) -> tuple[Tensor, dict[str, float]]:
    answer_mask: Tensor | None = None
    beta = 1.0
    if settings.llds_answer_weight != 1.0:
        answer_mask, n_act = _last_action_mask(mask)
        if settings.llds_answer_weight == "ma":
            rows = n_act > 0
            calls = (n_act - 1).clamp(min=0).double()
            v_s = (calls.sum() / rows.sum().clamp(min=1)).item() if bool(rows.any()) else math.nan
            beta = ma_beta(v_s)
        else:
            beta = float(settings.llds_answer_weight)
    reg, stats = llds_loss(
        log_prob,
        old_log_prob,
        mask,
        advantages,
        gate=settings.llds_gate,
        answer_mask=answer_mask,
        answer_weight=beta,
        normalize=settings.llds_normalize,
    )
    info = _get(config, "global_batch_info", None)
    global_tokens = _get(info, "batch_num_tokens", None)
    if global_tokens is not None and float(global_tokens) > 0:
        # verl sums micro-batch losses normalised by the mini-batch's token count (times dp_size):
        # weight this micro-batch's term by its share of those tokens, the same way.
        dp_size = float(_get(info, "dp_size", 1) or 1)
        share = (mask != 0).sum().to(reg.dtype) * (dp_size / float(global_tokens))
        term = (lam * share) * reg
    else:
        term = lam * reg
    loss_value, gated = torch.stack([reg.detach(), stats.gated_action_frac.to(reg.dtype)]).tolist()
    metrics = {
        M.LLDS_ACTIVE: 1.0,
        M.LLDS_LAMBDA: float(lam),
        M.LLDS_LOSS: loss_value,
        M.LLDS_GATED_ACTION_FRAC: gated,
    }
    return term, metrics


_LLDS_OFF: Final[Mapping[str, float]] = {name: 0.0 for name in LLDS_METRICS}


def _clip_eps(config: Any) -> float:
    low = _get(config, "clip_ratio_low", None)
    if low is None:
        low = _get(config, "clip_ratio", None)
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
        try:
            with torch.no_grad():
                old, new = old_log_prob.detach(), log_prob.detach()
                mask, adv = response_mask.detach(), advantages.detach()
                drifted = state.drifted(old, new, mask, config, settings.drift_atol)
                if settings.measure:
                    metrics.update(
                        _measure(
                            old,
                            new,
                            mask,
                            adv,
                            drifted=drifted,
                            settings=settings,
                            clip_eps=_clip_eps(config),
                        )
                    )
        except Exception as exc:
            state.warn(
                ("measure", type(exc).__name__),
                "lldmon: likelihood measurement failed, training goes on without it: %r",
                exc,
            )
            if settings.measure:
                metrics.update(_empty_measurement())

        llds_metrics: Mapping[str, float] = _LLDS_OFF
        try:
            lam = state.llds_weight(settings)
            if lam > 0:
                term, llds_metrics = _llds_term(
                    log_prob,
                    old_log_prob,
                    advantages,
                    response_mask,
                    lam=lam,
                    settings=settings,
                    config=config,
                )
                loss = loss + term
        except Exception as exc:
            llds_metrics = _LLDS_OFF
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


# ----------------------------------------------------------------------------------------------
# verl's PolicyLossConfig with lldmon's keys (built lazily: verl is optional)

_config_class: type | None = None
_config_class_lock = threading.Lock()


def policy_loss_config_class() -> type:
    """`LLDMonPolicyLossConfig`: verl's `PolicyLossConfig` plus the keys in `SETTING_KEYS`.

    Created on first use (it subclasses a verl class) and reachable as
    `trainer_hooks.verl.LLDMonPolicyLossConfig`, the `_target_` verl's config loader instantiates.
    Building an instance validates lldmon's keys and registers the "lldmon" loss in this process
    if it is not registered yet.
    """
    global _config_class
    with _config_class_lock:
        if _config_class is not None:
            return _config_class
        from dataclasses import dataclass as verl_dataclass

        from verl.trainer.ppo import core_algos
        from verl.workers.config import PolicyLossConfig

        @verl_dataclass
        class LLDMonPolicyLossConfig(PolicyLossConfig):  # type: ignore[misc]
            """verl's PolicyLossConfig with lldmon's keys (`trainer_hooks.verl.SETTING_KEYS`)."""

            _target_: str = _CONFIG_CLASS_PATH
            loss_mode: str = LOSS_NAME
            lldmon_base: str = "vanilla"
            lldmon_measure: bool = True
            lldmon_eps: float = 0.0
            lldmon_drift_atol: float = 1e-3
            llds_lambda: float = 0.0
            llds_gate: str = "action"
            llds_answer_weight: Any = 1.0
            llds_normalize: str = "loss_tokens"
            llds_directive_file: Any = None

            def __post_init__(self) -> None:
                parent = getattr(super(), "__post_init__", None)
                if callable(parent):
                    parent()
                LossSettings.from_config(self)  # validates, raises ValueError
                if self.loss_mode == LOSS_NAME and LOSS_NAME not in core_algos.POLICY_LOSS_REGISTRY:
                    register(LOSS_NAME)

        # Importable and picklable by name, through the module __getattr__ below.
        LLDMonPolicyLossConfig.__module__ = __name__
        LLDMonPolicyLossConfig.__qualname__ = "LLDMonPolicyLossConfig"
        _config_class = LLDMonPolicyLossConfig
        return LLDMonPolicyLossConfig


def __getattr__(name: str) -> Any:
    if name == "LLDMonPolicyLossConfig":
        return policy_loss_config_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------------------------
# streaming verl's logged scalars


class MetricSink(Protocol):
    """Where `attach` sends each step's metrics; `trainer_hooks.client.MonitorClient` is one.

    `attach(..., on_directive=...)` also reads an optional `directive` attribute of the sink.
    """

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Queue the scalar metrics (canonical or pass-through names) of one step."""


def _as_float(value: object) -> float | None:
    """A real scalar as float (bool, int, float, numpy scalar, one-element tensor), else None."""
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, torch.Tensor):
        return float(value.item()) if value.numel() == 1 and not value.is_complex() else None
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) in ((), (1,)):
        try:
            out = item()
        except (TypeError, ValueError):
            return None
        return float(out) if isinstance(out, numbers.Real) else None
    return None


def _lldmon_name(key: str) -> str:
    """verl 0.9.1 prefixes every actor metric with "actor/"; lldmon's loss names are unprefixed."""
    return key[len(_VERL_ACTOR_PREFIX) :] if key.startswith(_VERL_ACTOR_PREFIX) else key


_OWN_KEYS: Final = frozenset(
    (*LOSS_METRICS, *(weight_key(n) for n in LOSS_METRICS), ADV_POS_MASS, ADV_NEG_MASS, *LLDS_METRICS)
)


def map_verl_metrics(data: Mapping[str, object]) -> dict[str, float]:
    """Canonical-name metrics from one dict verl's trainer logs (`Tracking.log(data, step)`).

    - keys of `VERL_TO_CANONICAL` are renamed (the earlier key wins when two name one metric);
    - lldmon's loss metrics ("lld/...", "lldmon/w/...", "lldmon/adv_*_mass", "llds/...", with or
      without verl's "actor/" prefix) become the canonical `LOSS_METRICS` (mean over the
      micro-batches where defined; absent if defined nowhere), `adv/pos_neg_mass_ratio` (+inf with
      no negative mass, NaN with no mass at all) and the `llds/*` metrics;
    - every other real scalar passes through under its own name; non-scalars (strings, lists,
      None) and names longer than `MAX_METRIC_NAME_LENGTH` are dropped. NaN and inf are kept:
      they are collapse signals.
    """
    own: dict[str, float] = {}
    rest: dict[str, float] = {}
    for key, raw in data.items():
        value = _as_float(raw)
        if value is None or not isinstance(key, str):
            continue
        name = _lldmon_name(key)
        if name in _OWN_KEYS:
            if name not in own or key == name:  # an unprefixed key wins over "actor/<key>"
                own[name] = value
        else:
            rest[key] = value

    out: dict[str, float] = {}
    for name in LOSS_METRICS:
        if name not in own:
            continue
        weight = own.get(weight_key(name))
        if weight is None:
            out[name] = own[name]  # emitted by something else than this loss: take it as is
        elif weight > 0 or math.isnan(weight):
            out[name] = own[name] / weight if weight > 0 else math.nan
    if ADV_POS_MASS in own and ADV_NEG_MASS in own:
        out[M.ADV_POS_NEG_MASS_RATIO] = _mass_ratio(own[ADV_POS_MASS], own[ADV_NEG_MASS])
    for name in LLDS_METRICS:
        if name in own:
            out[name] = own[name]

    for key, canonical in VERL_TO_CANONICAL.items():
        if key in rest and canonical not in out:
            out[canonical] = rest.pop(key)
    for key, value in rest.items():
        if key not in out and len(key) <= MAX_METRIC_NAME_LENGTH:
            out[key] = value
    return out


def _mass_ratio(pos: float, neg: float) -> float:
    if math.isnan(pos) or math.isnan(neg):
        return math.nan
    if neg == 0:
        return math.inf if pos > 0 else math.nan
    return pos / neg


_ORIGINAL_LOG: Final = "_lldmon_original_log"


def attach(
    tracking: Any,
    sink: MetricSink,
    *,
    on_directive: Callable[[Any], object] | None = None,
) -> Any:
    """Make `tracking.log(data, step)` (a `verl.utils.tracking.Tracking`) also feed `sink`.

    After verl's own loggers ran, `sink.log(int(step), map_verl_metrics(data))` is called. With
    `on_directive`, `on_directive(sink.directive)` is then called whenever the sink's directive
    (its LLDS switch, `llds_from_directive`) differs from the one last passed (the first time: at
    the first log). Use `directive_file_writer(path)` to pass it to the verl workers through
    `llds_directive_file` (see the module docstring for what reaches the workers and what not).

    Anything lldmon does here is guarded: an error is logged once (logger `lldmon.verl`) and never
    reaches verl; verl's own logging runs first and unguarded. Attaching again replaces the
    previous attachment. Returns `tracking`.
    """
    original = tracking.__dict__.get(_ORIGINAL_LOG)
    if original is None:
        original = tracking.log
        tracking.__dict__[_ORIGINAL_LOG] = original
    warn = _WarnOnce()
    last_switch: list[tuple[bool, float] | None] = [None]

    def log(data: Any, step: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(data, step, *args, **kwargs)
        try:
            sink.log(int(step), map_verl_metrics(data))
        except Exception as exc:
            warn(("sink", type(exc).__name__), "lldmon: could not send verl metrics: %r", exc)
        if on_directive is not None:
            try:
                directive = getattr(sink, "directive", None)
                switch = llds_from_directive(directive) if directive is not None else None
                if switch is not None and switch != last_switch[0]:
                    on_directive(directive)
                    last_switch[0] = switch
            except Exception as exc:
                warn(("directive", type(exc).__name__), "lldmon: on_directive failed: %r", exc)
        return result

    tracking.log = log
    return tracking


def attach_new_trackings(
    sink_factory: Callable[[], MetricSink],
    *,
    on_directive: Callable[[Any], object] | None = None,
) -> Callable[[], None]:
    """`attach` every `verl.utils.tracking.Tracking` created from now on **in this process**.

    verl 0.9.1 creates its `Tracking` inside the trainer (`RayPPOTrainer.init()` as
    `trainer.logger` in the default v1 trainer, a local variable of `fit()` in v0), and the trainer
    runs in the `TaskRunner` Ray actor, not in the launching process. So call this in that actor,
    e.g. from a module that the launching shell names in `VERL_USE_EXTERNAL_MODULES` (verl imports
    it in every process at `import verl`; Ray processes started by a local `ray.init` inherit the
    variable)::

        # my_lldmon_setup.py
        from trainer_hooks.client import MonitorClient
        from trainer_hooks.verl import attach_new_trackings, directive_file_writer
        attach_new_trackings(
            lambda: MonitorClient("http://lldmon:8000", "grpo-3b-nq", project="nq"),
            on_directive=directive_file_writer("/shared/lldmon/directive.json"),
        )

    `sink_factory` is called once per new `Tracking` (only the process that builds a trainer
    creates one, so other processes never open a client); an exception in it is logged and the
    `Tracking` stays as verl made it. Returns a function that undoes the patch for later instances.
    """
    from verl.utils import tracking as tracking_module

    cls = tracking_module.Tracking
    original_init = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        try:
            attach(self, sink_factory(), on_directive=on_directive)
        except Exception as exc:
            logger.warning("lldmon: could not attach to a verl Tracking: %r", exc)

    cls.__init__ = __init__

    def undo() -> None:
        cls.__init__ = original_init

    return undo


def detach(tracking: Any) -> None:
    """Undo `attach`: `tracking.log` is verl's own again (no-op if not attached)."""
    original = tracking.__dict__.pop(_ORIGINAL_LOG, None)
    if original is not None:
        tracking.__dict__.pop("log", None)
        if getattr(tracking, "log", None) != original:  # `log` was an instance attribute before
            tracking.log = original

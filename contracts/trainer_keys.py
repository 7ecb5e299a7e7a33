"""Trainer metric keys -> canonical names (`contracts.metrics`): the one table per trainer family.

Used by the live adapters (`trainer_hooks.trl.map_trl_logs`, `trainer_hooks.verl.map_verl_metrics`)
*and* the log importers (`monitor.importers`), so a log imported after the run yields what the adapter
streamed during it. Sources: docs/science.md section 6 and the real logs in shared/datasets/real_runs.

One pure function per family maps one step's dict (`{key: value}` as the trainer logs it):

- `canonical_trl(logs)`: TRL GRPOTrainer `on_log` / `trainer_state.json` / stdout dicts;
- `canonical_verl(data)`: verl / Search-R1 `Tracking.log` dicts (console and `file` JSONL loggers);
- `canonical_tracker(row)`: W&B / TensorBoard rows written by either trainer: verl's own keys, or
  TRL's under transformers' `train/` prefix (`rewrite_logs`).

Values: real scalars are kept as floats (`as_float`: bool, int, float, numpy scalars, one-element
tensors, duck-typed so this module stays stdlib-only); anything else (None, text, lists) is dropped.
NaN and +-inf are kept: they are collapse signals. Name length is not checked here (the adapters drop
names longer than `MAX_METRIC_NAME_LENGTH`, the importers report them).

Precedence, when several keys of one dict would give the same name (implemented once, in `_Output`):

1. lldmon's own loss metrics re-assembled from verl's micro-batch means (`reassemble_lldmon`) and the
   advantage mass ratios;
2. renames of the table, in table order: the first key of the table present in the dict takes the
   canonical name; a later key for the same name keeps its own name (verl >= 0.5 logs both
   `actor/entropy`, the rollout batch's entropy, and `actor/entropy_loss`, the in-loss entropy: the
   first is `entropy/mean`, the other stays `actor/entropy_loss`; older verl logs only the latter);
3. derived metrics (TRL: `search/valid_per_traj`);
4. verl: lldmon's own metric names under verl's "actor/" prefix lose the prefix, unless the same
   name is logged unprefixed too (then the prefixed one is dropped);
5. every other key passes through under its own name, unless that name is already taken.

`row_keys(family, keys)` names the keys whose output can depend on other keys of the same step; every
other key maps to itself alone (the importers canonicalise those column-wise, the rest step by step).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from contracts import metrics as M

__all__ = [
    "ADV_MASS_PAIRS",
    "LLDMON_WEIGHT_PREFIX",
    "TRACKER",
    "TRACKER_PREFIX",
    "TRL",
    "TRL_TO_CANONICAL",
    "VERL",
    "VERL_ACTOR_PREFIX",
    "VERL_TO_CANONICAL",
    "Family",
    "as_float",
    "canonical_tracker",
    "canonical_trl",
    "canonical_verl",
    "reassemble_lldmon",
    "weight_key",
]

TRL_TO_CANONICAL: Final[Mapping[str, str]] = MappingProxyType(
    {
        # rollouts (GRPOTrainer._generate_and_score_completions)
        "reward": M.REWARD_MEAN,  # nanmean of the weighted reward sum over all processes
        "reward_std": M.REWARD_STD,
        "frac_reward_zero_std": M.ADV_FRAC_ZERO_STD_GROUPS,  # share of groups whose rewards are all equal
        "completions/mean_length": M.RESPONSE_LENGTH_MEAN,  # counts model tokens only (tool_mask == 1)
        "completion_length": M.RESPONSE_LENGTH_MEAN,  # TRL <= 0.15 (and ms-swift of that time)
        "completions/clipped_ratio": M.RESPONSE_CLIP_RATIO,  # share of completions cut at max length
        # loss (GRPOTrainer._compute_loss)
        "entropy": M.ENTROPY_MEAN,  # mean over loss-mask tokens
        "kl": M.KL_REF,  # KL to the reference model, only with beta != 0
        "clip_ratio/region_mean": M.CLIP_FRAC,  # grpo/bnpo/dr_grpo/dapo/luspo: share of clipped tokens
        "cispo_clip_ratio": M.CLIP_FRAC,  # cispo's counterpart (never logged together with the above)
        "clip_ratio": M.CLIP_FRAC,  # TRL 0.16-0.17, before the split into clip_ratio/*
        # optimisation (transformers.Trainer._maybe_log_save_evaluate)
        "loss": M.LOSS,
        "grad_norm": M.GRAD_NORM,  # total norm before clipping
    }
)
"""TRL GRPOTrainer log key -> canonical name (also ms-swift's GRPO trainer, a TRL subclass that logs the same
keys). Every other scalar (learning_rate, epoch, clip_ratio/low_mean, rewards/<func>/mean, tools/*, eval_*
keys, ...) passes through under its own name."""

VERL_TO_CANONICAL: Final[Mapping[str, str]] = MappingProxyType(
    {
        "actor/entropy": M.ENTROPY_MEAN,  # entropy of the rollout batch (old-log-prob pass)
        "actor/entropy_loss": M.ENTROPY_MEAN,  # in-loss entropy; older verl: the only (positive) entropy
        "actor/grad_norm": M.GRAD_NORM,  # before clipping
        "actor/loss": M.LOSS,  # verl 0.9.1: total actor loss (pg + kl + entropy terms, + LLDS)
        "actor/kl_loss": M.KL_REF,  # KL to the reference policy (use_kl_loss)
        "actor/reward_kl_penalty": M.KL_REF,  # the same KL when it is a reward penalty (use_kl_in_reward)
        "actor/ppo_kl": M.KL_OLD,  # masked mean of log pi_old - log pi_theta (old -> new policy)
        "actor/pg_clipfrac": M.CLIP_FRAC,
        "critic/score/mean": M.REWARD_MEAN,  # sequence score (reward before KL penalty)
        "response_length/mean": M.RESPONSE_LENGTH_MEAN,
        "response_length/clip_ratio": M.RESPONSE_CLIP_RATIO,
        "env/number_of_valid_search": M.SEARCH_VALID_PER_TRAJ,  # Search-R1's fork
        "episode/valid_action_ratio": M.ACTION_VALID_RATIO,  # verl-agent (ALFWorld, WebShop)
        "num_turns/mean": M.TURNS_MEAN,  # verl's multi-turn agent loop
        "training/num_turns/mean": M.TURNS_MEAN,  # older location of the same
    }
)
"""verl / Search-R1 logger key -> canonical name; for two keys of one name the earlier one wins."""

TRACKER_PREFIX: Final = "train/"
"""transformers' W&B / TensorBoard callbacks log training scalars as `train/<name>` (`rewrite_logs`)."""

VERL_ACTOR_PREFIX: Final = "actor/"
"""verl 0.9.1 prefixes every metric its actor returns with "actor/" ("actor/lld/logp_pos")."""

LLDMON_WEIGHT_PREFIX: Final = "lldmon/w/"
"""lldmon's verl loss returns every metric X with a 0/1 weight "lldmon/w/X" (defined on this micro-batch
or not), because verl averages metrics over micro-batches: X = mean(X) / mean(weight) re-assembles the
mean over the micro-batches where X is defined (`reassemble_lldmon`)."""

LLDMON_NAMESPACES: Final = ("lld/", "llds/", "lldmon/")
"""Name prefixes that are lldmon's own (with `contracts.metrics.CANONICAL_METRICS`)."""

ADV_MASS_PAIRS: Final = (
    ("lldmon/adv_pos_mass", "lldmon/adv_neg_mass", M.ADV_POS_NEG_MASS_RATIO),
    ("lldmon/adv_pos_mass_answer", "lldmon/adv_neg_mass_answer", M.ADV_POS_NEG_MASS_RATIO_ANSWER),
)
"""(positive mass key, negative mass key, ratio name): per-micro-batch advantage masses of the verl loss;
their ratio of means is the [CalibAdv] ratio (a ratio per micro-batch could be +inf)."""

TOOL_CALLS: Final = "tools/call_frequency"
"""TRL: tool calls per trajectory."""
TOOL_FAILURES: Final = "tools/failure_frequency"
"""TRL: failed calls per call."""

_CANONICAL: Final = frozenset(M.CANONICAL_METRICS)


def weight_key(name: str) -> str:
    """The key of the 0/1 weight that goes with lldmon loss metric `name` ("lldmon/w/<name>")."""
    return LLDMON_WEIGHT_PREFIX + name


def as_float(value: object) -> float | None:
    """A real scalar as float (bool, int, float, numpy scalar, one-element tensor); None otherwise."""
    if isinstance(value, numbers.Real):
        try:
            return float(value)
        except OverflowError:  # an int beyond float range
            return None
    item = getattr(value, "item", None)
    if not callable(item):
        return None
    numel = getattr(value, "numel", None)
    single = numel() == 1 if callable(numel) else getattr(value, "shape", None) in ((), (1,))
    if not single:
        return None
    try:
        out = item()
    except (TypeError, ValueError, RuntimeError):
        return None
    return float(out) if isinstance(out, numbers.Real) else None


def _scalars(row: Mapping[str, object]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, raw in row.items():
        if isinstance(key, str) and key:
            value = as_float(raw)
            if value is not None:
                out[key] = value
    return out


class _Output:
    """Names taken in precedence order: the first claim of a name wins."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def claim(self, name: str, value: float) -> bool:
        if name in self.values:
            return False
        self.values[name] = value
        return True


def _rename(out: _Output, values: Mapping[str, float], table: Mapping[str, str]) -> set[str]:
    """Step 2 of the precedence: table renames; returns the keys used (the losers are not)."""
    used: set[str] = set()
    for key, canonical in table.items():
        if key in values and out.claim(canonical, values[key]):
            used.add(key)
    return used


# ---------------------------------------------------------------------------------------------- TRL


def _trl(values: Mapping[str, float], passthrough_prefix: str = "") -> _Output:
    out = _Output()
    used = _rename(out, values, TRL_TO_CANONICAL)
    calls, failures = values.get(TOOL_CALLS), values.get(TOOL_FAILURES)
    if calls is not None and failures is not None:
        # mean tool calls per trajectory that did not fail (TRL logs calls per trajectory, failures per call)
        out.claim(M.SEARCH_VALID_PER_TRAJ, calls * (1.0 - failures))
    for key, value in values.items():
        if key not in used:
            out.claim(passthrough_prefix + key, value)
    return out


def canonical_trl(logs: Mapping[str, object]) -> dict[str, float]:
    """Canonical-name metrics of one TRL `logs` dict (see the module docstring).

    Renames `TRL_TO_CANONICAL`, derives `search/valid_per_traj` = `tools/call_frequency` *
    (1 - `tools/failure_frequency`) and passes every other scalar through under its own name.
    """
    return _trl(_scalars(logs)).values


def _trl_row_keys(keys: Collection[str]) -> set[str]:
    return {k for k in keys if k in TRL_TO_CANONICAL or k in _CANONICAL or k in (TOOL_CALLS, TOOL_FAILURES)}


# ---------------------------------------------------------------------------------------------- verl


def _unprefixed(key: str) -> str:
    if key.startswith(VERL_ACTOR_PREFIX) and len(key) > len(VERL_ACTOR_PREFIX):
        return key[len(VERL_ACTOR_PREFIX) :]
    return key


def _is_lldmon_name(name: str) -> bool:
    return name in _CANONICAL or name.startswith(LLDMON_NAMESPACES)


def _lldmon_values(values: Mapping[str, float]) -> dict[str, float]:
    """lldmon's names with verl's "actor/" prefix removed; an unprefixed key wins over a prefixed one."""
    own: dict[str, float] = {}
    for key, value in values.items():
        name = _unprefixed(key)
        if name not in own or key == name:
            own[name] = value
    return own


def reassemble_lldmon(values: Mapping[str, float]) -> tuple[dict[str, float], set[str]]:
    """lldmon's loss metrics from verl's micro-batch means: `(metrics, keys consumed)`.

    Generic over names: every X (with or without verl's "actor/" prefix) that has a weight key
    "lldmon/w/X" becomes X = mean(X) / mean(weight), the mean over the micro-batches where X was defined;
    absent if it was defined nowhere (weight 0), NaN if the weight is NaN. Each pair of `ADV_MASS_PAIRS`
    becomes its ratio (+inf with no negative mass, NaN with no mass at all). Weight and mass keys are
    consumed whether or not they produce a metric; an X without its weight is not touched here.
    """
    own = _lldmon_values(values)
    out: dict[str, float] = {}
    consumed: set[str] = set()
    for key in values:
        name = _unprefixed(key)
        if name.startswith(LLDMON_WEIGHT_PREFIX):
            consumed.add(key)
            metric = name[len(LLDMON_WEIGHT_PREFIX) :]
            if not metric or metric not in own:
                continue
            consumed.update(k for k in values if _unprefixed(k) == metric)
            weight = own[name]
            if weight > 0:
                out[metric] = own[metric] / weight
            elif math.isnan(weight):
                out[metric] = math.nan
    for pos_key, neg_key, ratio in ADV_MASS_PAIRS:
        consumed.update(k for k in values if _unprefixed(k) in (pos_key, neg_key))
        if pos_key in own and neg_key in own:
            out[ratio] = _mass_ratio(own[pos_key], own[neg_key])
    return out, consumed


def _mass_ratio(pos: float, neg: float) -> float:
    if math.isnan(pos) or math.isnan(neg):
        return math.nan
    if neg == 0:
        return math.inf if pos > 0 else math.nan
    return pos / neg  # both masses are >= 0 (the negative one as a magnitude)


def _verl(values: Mapping[str, float]) -> _Output:
    out = _Output()
    lldmon, consumed = reassemble_lldmon(values)
    for name, value in lldmon.items():
        out.claim(name, value)
    rest = {k: v for k, v in values.items() if k not in consumed}
    used = _rename(out, rest, VERL_TO_CANONICAL)
    for key, value in rest.items():
        if key in used:
            continue
        name = _unprefixed(key)
        if name != key and _is_lldmon_name(name):
            if name not in rest:  # else the unprefixed key passes through below and this one is dropped
                out.claim(name, value)
        else:
            out.claim(key, value)
    return out


def canonical_verl(data: Mapping[str, object]) -> dict[str, float]:
    """Canonical-name metrics of one verl `Tracking.log` dict (see the module docstring).

    lldmon's loss metrics are re-assembled (`reassemble_lldmon`), keys of `VERL_TO_CANONICAL` renamed,
    lldmon's names under verl's "actor/" prefix unprefixed, and every other scalar passes through.
    """
    return _verl(_scalars(data)).values


def _verl_row_keys(keys: Collection[str]) -> set[str]:
    names = {_unprefixed(k) for k in keys}
    return {
        k
        for k in keys
        if k in VERL_TO_CANONICAL or _is_lldmon_name(_unprefixed(k)) or weight_key(_unprefixed(k)) in names
    }


# ---------------------------------------------------------------------------------------------- trackers


def _split_tracker(values: Mapping[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    trl: dict[str, float] = {}
    verl: dict[str, float] = {}
    for key, value in values.items():
        if key.startswith(TRACKER_PREFIX) and len(key) > len(TRACKER_PREFIX):
            trl[key[len(TRACKER_PREFIX) :]] = value
        else:
            verl[key] = value
    return trl, verl


def canonical_tracker(row: Mapping[str, object]) -> dict[str, float]:
    """Canonical-name metrics of one W&B / TensorBoard row written by either trainer: keys under
    `train/` are TRL's (`canonical_trl`; those it does not rename keep their `train/` prefix), the
    others verl's (`canonical_verl`); verl's output wins a name both give."""
    trl, verl = _split_tracker(_scalars(row))
    out = _verl(verl)
    for name, value in _trl(trl, passthrough_prefix=TRACKER_PREFIX).values.items():
        out.claim(name, value)
    return out.values


def _tracker_row_keys(keys: Collection[str]) -> set[str]:
    trl = [
        k[len(TRACKER_PREFIX) :]
        for k in keys
        if k.startswith(TRACKER_PREFIX) and len(k) > len(TRACKER_PREFIX)
    ]
    verl = [k for k in keys if not (k.startswith(TRACKER_PREFIX) and len(k) > len(TRACKER_PREFIX))]
    return _verl_row_keys(verl) | {TRACKER_PREFIX + k for k in _trl_row_keys(trl)}


# ---------------------------------------------------------------------------------------------- families


@dataclass(frozen=True)
class Family:
    """One trainer family's vocabulary: `canonical(row)` maps one step's dict; `row_keys(keys)` are
    the keys (of all those a log holds) whose output may depend on other keys of the same step. A key
    outside `row_keys` maps to itself whatever else its step holds, and no other key gives its name."""

    name: str
    canonical: Callable[[Mapping[str, object]], dict[str, float]]
    _row_keys: Callable[[Collection[str]], set[str]]

    def row_keys(self, keys: Iterable[str]) -> frozenset[str]:
        return frozenset(self._row_keys(list(keys)))


TRL: Final = Family("trl", canonical_trl, _trl_row_keys)
VERL: Final = Family("verl", canonical_verl, _verl_row_keys)
TRACKER: Final = Family("tracker", canonical_tracker, _tracker_row_keys)

"""Trainer metric names -> canonical lldmon names (contracts/metrics.py).

Sources: lld-reference.md section 6 (what verl / Search-R1 and TRL's GRPOTrainer emit) and the real logs in
../shared/datasets/real_runs (verl's older `actor/entropy_loss` is a positive entropy, not a loss term).
Names without an entry keep their own name, so nothing a trainer logs is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from contracts import metrics as M

VERL_NAMES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "actor/entropy": M.ENTROPY_MEAN,
        "actor/entropy_loss": M.ENTROPY_MEAN,  # older verl: the (positive) entropy under a "loss" name
        "actor/grad_norm": M.GRAD_NORM,
        "critic/score/mean": M.REWARD_MEAN,
        "response_length/mean": M.RESPONSE_LENGTH_MEAN,
        "response_length/clip_ratio": M.RESPONSE_CLIP_RATIO,
        "actor/ppo_kl": M.KL,
        "actor/pg_clipfrac": M.CLIP_FRAC,
    }
)
"""verl console / JSONL metric names (lld-reference.md section 6)."""

VERL_PREFERRED: Final[frozenset[str]] = frozenset({"actor/entropy"})
"""When two verl names map to one canonical name in the same step, these win (the newer name)."""

TRL_NAMES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "reward": M.REWARD_MEAN,
        "reward_std": M.REWARD_STD,
        "grad_norm": M.GRAD_NORM,
        "entropy": M.ENTROPY_MEAN,
        "frac_reward_zero_std": M.ADV_FRAC_ZERO_STD_GROUPS,
        "completions/mean_length": M.RESPONSE_LENGTH_MEAN,
        "kl": M.KL,
        "loss": M.LOSS,
        "clip_ratio/region_mean": M.CLIP_FRAC,
    }
)
"""TRL GRPOTrainer `on_log` names (lld-reference.md section 6)."""


def canonical_name(name: str, mapping: Mapping[str, str]) -> str:
    """The canonical name of a trainer metric; unknown names are kept as they are."""
    return mapping.get(name, name)

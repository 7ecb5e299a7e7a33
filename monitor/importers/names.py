"""Trainer metric names -> canonical lldmon names: a re-export of `contracts.trainer_keys`, the one table
per trainer family shared with the live adapters (`trainer_hooks.trl`, `trainer_hooks.verl`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from contracts.trainer_keys import (
    TRACKER,
    TRL,
    TRL_TO_CANONICAL,
    VERL,
    VERL_TO_CANONICAL,
    Family,
    canonical_tracker,
    canonical_trl,
    canonical_verl,
)

VERL_NAMES: Final[Mapping[str, str]] = VERL_TO_CANONICAL
"""verl / Search-R1 logger key -> canonical name (`contracts.trainer_keys.VERL_TO_CANONICAL`)."""
TRL_NAMES: Final[Mapping[str, str]] = TRL_TO_CANONICAL
"""TRL GRPOTrainer log key -> canonical name (`contracts.trainer_keys.TRL_TO_CANONICAL`)."""

__all__ = [
    "TRACKER",
    "TRL",
    "TRL_NAMES",
    "TRL_TO_CANONICAL",
    "VERL",
    "VERL_NAMES",
    "VERL_TO_CANONICAL",
    "Family",
    "canonical_tracker",
    "canonical_trl",
    "canonical_verl",
]

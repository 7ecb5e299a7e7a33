"""TRL's log keys under canonical names (the table itself is `contracts.trainer_keys`, shared with the
importers)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from contracts.metrics import MAX_METRIC_NAME_LENGTH
from contracts.trainer_keys import TRL_TO_CANONICAL as _TRL_TO_CANONICAL
from contracts.trainer_keys import canonical_trl

__all__ = ["TRL_TO_CANONICAL", "map_trl_logs"]

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

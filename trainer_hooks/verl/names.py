"""Metric names of the verl side: what the lldmon loss and the probe actor return (each value with a
0/1 weight, docs/hooks-verl.md), and verl's logged keys under canonical names (the table itself is
`contracts.trainer_keys`, shared with the importers)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from contracts import metrics as M
from contracts.metrics import MAX_METRIC_NAME_LENGTH
from contracts.trainer_keys import ADV_MASS_PAIRS, canonical_verl, weight_key
from contracts.trainer_keys import VERL_TO_CANONICAL as _VERL_TO_CANONICAL

__all__ = [
    "ADV_NEG_MASS",
    "ADV_NEG_MASS_ANSWER",
    "ADV_POS_MASS",
    "ADV_POS_MASS_ANSWER",
    "ANCHOR_METRICS",
    "DELTA_METRICS",
    "LEVEL_METRICS",
    "LLDS_METRICS",
    "LOSS_METRICS",
    "PROBE_METRICS",
    "VERL_TO_CANONICAL",
    "VS_SOURCE",
    "XMB_METRICS",
    "XMB_TO_EXACT",
    "map_verl_metrics",
    "weight_key",
]

# ----------------------------------------------------------------------------------------------
# the loss

LEVEL_METRICS: Final = (M.LOGP_POS, M.LOGP_NEG, M.LOGP_CORRECT, M.GARBLED_FRAC)
"""Loss metrics that are measurements also when old == current (rollout-time levels).
`lld/logp_correct` needs rewards: only with the probe actor (`trainer_hooks.verl.actor`)."""
XMB_METRICS: Final = tuple(M.EXACT_TO_XMB.values())
"""In-loss deltas, published under their cross-mini-batch names `lld/xmb/*` (a proxy: the exact
Def. 4.1 delta `lld/delta_*` comes from the post-update probe of `trainer_hooks.verl.actor`)."""
DELTA_METRICS: Final = (*XMB_METRICS, M.RATIO_POS_MEAN, M.RATIO_POS_FRAC_LOW)
"""Loss metrics that are structurally 0 (no measurement) on micro-batches that have not drifted."""
LOSS_METRICS: Final = LEVEL_METRICS + DELTA_METRICS
"""Metrics the loss returns (each with its weight key `weight_key(X)`, docs/hooks-verl.md)."""
XMB_TO_EXACT: Final[Mapping[str, str]] = {xmb: exact for exact, xmb in M.EXACT_TO_XMB.items()}
"""`lld/xmb/*` -> the `measure_step` name it is measured under (`lld/delta_*`, ...)."""

ADV_POS_MASS: Final = ADV_MASS_PAIRS[0][0]
"""Key "lldmon/adv_pos_mass": per-micro-batch advantage mass over A > 0 loss tokens ([CalibAdv])."""
ADV_NEG_MASS: Final = ADV_MASS_PAIRS[0][1]
"""Key "lldmon/adv_neg_mass": per-micro-batch |advantage mass| over A < 0 loss tokens."""
ADV_POS_MASS_ANSWER: Final = ADV_MASS_PAIRS[1][0]
"""Key "lldmon/adv_pos_mass_answer": the same over answer-span tokens (with the probe actor)."""
ADV_NEG_MASS_ANSWER: Final = ADV_MASS_PAIRS[1][1]
"""Key "lldmon/adv_neg_mass_answer": the same over answer-span tokens (with the probe actor)."""
LLDS_METRICS: Final = (M.LLDS_ACTIVE, M.LLDS_LAMBDA, M.LLDS_LOSS, M.LLDS_GATED_ACTION_FRAC)
"""LLDS metrics of the loss (0 when LLDS is off)."""

# ----------------------------------------------------------------------------------------------
# the probe actor

VS_SOURCE: Final = "lldmon/ma/vs_source"
"""1.0 when V_s came from the rollout's valid-search count, 0.0 when from actions - 1."""
PROBE_METRICS: Final = tuple(M.EXACT_TO_XMB)
"""Exact Def. 4.1 metrics of the post-update probe (each with its weight key)."""
ANCHOR_METRICS: Final = (M.ANCHOR_LOGP, M.ANCHOR_DELTA, M.ANCHOR_FRAC_DECREASED, M.ANCHOR_SIZE)
"""Anchor metrics (each with its weight key), on the steps where the anchors are re-scored."""

# ----------------------------------------------------------------------------------------------
# verl's logged keys

VERL_TO_CANONICAL: Final[Mapping[str, str]] = _VERL_TO_CANONICAL
"""verl / Search-R1 logger key -> canonical metric name: `contracts.trainer_keys.VERL_TO_CANONICAL`
(the one table, with its precedence rule), re-exported."""


def map_verl_metrics(data: Mapping[str, object]) -> dict[str, float]:
    """Canonical-name metrics from one dict verl's trainer logs (`Tracking.log(data, step)`).

    `contracts.trainer_keys.canonical_verl` (the importers use it too): lldmon's loss metrics are
    re-assembled from verl's micro-batch means (any "X" with a weight key "lldmon/w/X", with or
    without verl's "actor/" prefix, becomes mean(X) / mean(weight); the advantage masses become
    `adv/pos_neg_mass_ratio` and `adv/pos_neg_mass_ratio_answer`), keys of `VERL_TO_CANONICAL` are
    renamed and every other real scalar passes through under its own name. Non-scalars (strings,
    lists, None) and names longer than `MAX_METRIC_NAME_LENGTH` are dropped. NaN and inf are kept:
    they are collapse signals.
    """
    return {k: v for k, v in canonical_verl(data).items() if len(k) <= MAX_METRIC_NAME_LENGTH}

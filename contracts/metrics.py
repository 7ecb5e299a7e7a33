"""Canonical metric names: the one vocabulary of hooks, service, database, dashboard and importers.

Sign conventions follow lld-reference.md section 2: D = log pi_new - log pi_old, so D < 0 means
the likelihood of a token/action/trajectory *fell*. "pos" = responses with advantage A > 0
(correct responses in GRPO), "neg" = A < 0.
"""

from __future__ import annotations

from typing import Final

# --- likelihood displacement (lld-reference.md section 2) ---
LOGP_POS: Final = "lld/logp_pos"
"""Mean per-token log-prob under the rollout (old) policy of A>0 responses, action tokens only."""
LOGP_NEG: Final = "lld/logp_neg"
"""Mean per-token log-prob under the rollout (old) policy of A<0 responses, action tokens only."""
DELTA_TRAJ_POS: Final = "lld/delta_traj_pos"
"""Mean trajectory delta D_traj = sum(new - old) over A>0 responses."""
DELTA_TRAJ_NEG: Final = "lld/delta_traj_neg"
"""Mean trajectory delta D_traj over A<0 responses."""
DELTA_ACTION_POS: Final = "lld/delta_action_pos"
"""Mean action delta D_action over the actions of A>0 responses."""
FRAC_TRAJ_DECREASED_POS: Final = "lld/frac_traj_decreased_pos"
"""Share of A>0 responses whose D_traj < eps."""
FRAC_ACTION_DECREASED_POS: Final = "lld/frac_action_decreased_pos"
"""Share of actions of A>0 responses whose D_action < eps."""

# --- optimisation health ---
ENTROPY_MEAN: Final = "entropy/mean"
GRAD_NORM: Final = "grad/norm"
"""Gradient norm before clipping."""
LOSS: Final = "loss"
KL: Final = "kl"
CLIP_FRAC: Final = "clip/frac"

# --- rollouts ---
REWARD_MEAN: Final = "reward/mean"
REWARD_STD: Final = "reward/std"
RESPONSE_LENGTH_MEAN: Final = "response/length_mean"
RESPONSE_CLIP_RATIO: Final = "response/clip_ratio"
SEARCH_VALID_PER_TRAJ: Final = "search/valid_per_traj"
TURNS_MEAN: Final = "turns/mean"

# --- importance ratios on A>0 tokens (SAPO's drift signature, lld-reference.md section 5) ---
RATIO_POS_MEAN: Final = "ratio/pos_mean"
RATIO_POS_MIN: Final = "ratio/pos_min"
RATIO_POS_FRAC_LOW: Final = "ratio/pos_frac_low"

# --- advantages (CalibAdv diagnostics) ---
ADV_POS_NEG_MASS_RATIO: Final = "adv/pos_neg_mass_ratio"
ADV_FRAC_ZERO_STD_GROUPS: Final = "adv/frac_zero_std_groups"
GARBLED_FRAC: Final = "garbled/frac"

# --- LLDS state reported by the trainer ---
LLDS_ACTIVE: Final = "llds/active"
LLDS_LAMBDA: Final = "llds/lambda"
LLDS_LOSS: Final = "llds/loss"
LLDS_GATED_ACTION_FRAC: Final = "llds/gated_action_frac"

LLD_METRICS: Final = (
    LOGP_POS,
    LOGP_NEG,
    DELTA_TRAJ_POS,
    DELTA_TRAJ_NEG,
    DELTA_ACTION_POS,
    FRAC_TRAJ_DECREASED_POS,
    FRAC_ACTION_DECREASED_POS,
)
"""Metrics only the hooks can produce; imported logs usually lack them (degraded mode)."""

CANONICAL_METRICS: Final = (
    *LLD_METRICS,
    ENTROPY_MEAN,
    GRAD_NORM,
    LOSS,
    KL,
    CLIP_FRAC,
    REWARD_MEAN,
    REWARD_STD,
    RESPONSE_LENGTH_MEAN,
    RESPONSE_CLIP_RATIO,
    SEARCH_VALID_PER_TRAJ,
    TURNS_MEAN,
    RATIO_POS_MEAN,
    RATIO_POS_MIN,
    RATIO_POS_FRAC_LOW,
    ADV_POS_NEG_MASS_RATIO,
    ADV_FRAC_ZERO_STD_GROUPS,
    GARBLED_FRAC,
    LLDS_ACTIVE,
    LLDS_LAMBDA,
    LLDS_LOSS,
    LLDS_GATED_ACTION_FRAC,
)

MAX_METRIC_NAME_LENGTH: Final = 256

"""Which metrics the run page plots, panel by panel (canonical names from `contracts.metrics`).

Panels of likelihood metrics say which estimator they show (docs/science.md section 2): the exact
post-update delta (`lld/delta_*`, `lld/frac_*_decreased_*`), the cross-mini-batch proxy seen inside the loss
(`lld/xmb/*`), the level at rollout (`lld/logp_*`) and the frozen anchor set (`lld/anchor/*`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from contracts import metrics as M


@dataclass(frozen=True)
class Panel:
    key: str
    title: str
    metrics: tuple[str, ...]
    log_y: bool = False
    y_title: str = ""
    optional: frozenset[str] = frozenset()
    """Metrics plotted when a run has them and never reported as missing (not every run has every
    estimator: on TRL's default schedule nothing drifts inside the loss, so there is no `lld/xmb/*`;
    the anchor set needs correct responses and a single-process job)."""


PANELS: Final = (
    Panel("reward", "Reward", (M.REWARD_MEAN,)),
    Panel(
        "logp",
        "Likelihood level: at rollout, A>0 / A<0 / correct responses (lld/logp_*); "
        "anchor set re-scored (lld/anchor/logp)",
        (M.LOGP_POS, M.LOGP_NEG, M.LOGP_CORRECT, M.ANCHOR_LOGP),
        y_title="mean token log-prob",
        optional=frozenset({M.LOGP_CORRECT, M.ANCHOR_LOGP}),
    ),
    Panel(
        "deltas",
        "Displacement D = log π_new − log π_old (< 0: fell): exact post-update (lld/delta_*), "
        "cross-mini-batch proxy (lld/xmb/*)",
        (M.DELTA_TRAJ_POS, M.DELTA_TRAJ_NEG, M.DELTA_ACTION_POS, M.XMB_DELTA_TRAJ_POS),
        optional=frozenset({M.XMB_DELTA_TRAJ_POS}),
    ),
    Panel(
        "frac",
        "Share of A>0 responses whose likelihood fell: exact post-update (lld/frac_*), "
        "cross-mini-batch proxy (lld/xmb/*)",
        (M.FRAC_TRAJ_DECREASED_POS, M.XMB_FRAC_TRAJ_DECREASED_POS),
        optional=frozenset({M.XMB_FRAC_TRAJ_DECREASED_POS}),
    ),
    Panel("entropy", "Entropy", (M.ENTROPY_MEAN,)),
    Panel("grad", "Gradient norm (log scale)", (M.GRAD_NORM,), log_y=True),
    Panel("tools", "Valid searches per trajectory and turns", (M.SEARCH_VALID_PER_TRAJ, M.TURNS_MEAN)),
    Panel(
        "ratio",
        "Importance ratios on A>0 tokens",
        (M.RATIO_POS_MEAN, M.RATIO_POS_MIN, M.RATIO_POS_FRAC_LOW),
    ),
    Panel("llds", "LLDS state reported by the trainer", (M.LLDS_ACTIVE, M.LLDS_LAMBDA, M.LLDS_LOSS)),
)

PANEL_METRICS: Final = tuple(dict.fromkeys(name for panel in PANELS for name in panel.metrics))
"""Every metric the run page shows, in panel order: the only names it queries."""

PANELS_BY_KEY: Final = {panel.key: panel for panel in PANELS}

COMPARE_DEFAULT_METRICS: Final = (M.REWARD_MEAN, M.LOGP_POS, M.GRAD_NORM, M.ENTROPY_MEAN)
LOG_METRICS: Final = frozenset({M.GRAD_NORM})

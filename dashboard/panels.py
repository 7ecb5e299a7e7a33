"""Which metrics the run page plots, panel by panel (canonical names from `contracts.metrics`)."""

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


PANELS: Final = (
    Panel("reward", "Reward", (M.REWARD_MEAN,)),
    Panel(
        "logp",
        "Log-likelihood of correct (A>0) vs incorrect (A<0) responses",
        (M.LOGP_POS, M.LOGP_NEG),
        y_title="mean token log-prob",
    ),
    Panel(
        "deltas",
        "Likelihood displacement D = log π_new − log π_old (< 0: fell)",
        (M.DELTA_TRAJ_POS, M.DELTA_TRAJ_NEG, M.DELTA_ACTION_POS),
    ),
    Panel("frac", "Share of correct responses whose likelihood fell", (M.FRAC_TRAJ_DECREASED_POS,)),
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

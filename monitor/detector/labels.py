"""Ground-truth labels of a run: where its reward collapsed."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from monitor.detector.stats import rolling_median

DEFAULT_SMOOTH = 3
"""Trailing median length applied to the reward before comparing it with its running peak, so one noisy
step is never a collapse (the detector's `reward_smooth` uses the same)."""


def reward_collapse_step(
    steps: npt.ArrayLike,
    reward: npt.ArrayLike,
    fraction: float = 0.5,
    smooth: int = DEFAULT_SMOOTH,
    floor: float = 0.0,
) -> int | None:
    """First step where the (trailing-median smoothed) reward falls below floor + `fraction` of
    (its running peak - floor): "reward < half its running peak". None if it never does."""
    steps_arr = np.asarray(steps, dtype=np.int64).ravel()
    smoothed = rolling_median(reward, smooth)
    peak = -np.inf
    for i, value in enumerate(smoothed.tolist()):
        if value != value:  # NaN: nothing logged in the window
            continue
        if peak > floor and value < floor + fraction * (peak - floor):
            return int(steps_arr[i])
        peak = max(peak, value)
    return None

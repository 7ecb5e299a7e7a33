"""Ground-truth label of a run: where its reward collapsed. One rule, used everywhere a run is labelled
(the generated scenarios, the detector evaluation and `lldmon eval`, the collapse lab, the recorded lab
fixtures, the benchmarks).

The rule (`collapse_step`), on the reward series as logged (`reward/mean`; TRL logs it once per rollout
batch, i.e. every `steps_per_generation` optimizer steps; steps where it is NaN or absent are ignored):

1. trailing mean: at every logged point `i`, `m_i` = mean of the rewards logged at steps in
   `(step_i - window, step_i]` (default window 10 steps);
2. running peak: `p_i = max(m_0, ..., m_i)`;
3. the labelled collapse step is the first logged step `step_i` such that `m_j < fraction * p_j` for
   EVERY later point `j >= i` up to the end of the run (default fraction 0.2), provided that
   - the peak was worth losing: `p_i >= min_peak` (default 0.05), and
   - the run went on long enough to tell: `last step - step_i >= min_after` (default 10 steps).

Once `m_j < fraction * p_j` holds, `m_j` is below the peak, so the peak is constant from `i` on: the
condition reads "the 10-step mean stays below 20 % of the best 10-step mean seen so far, until the end".
A dip that recovers above 20 % of the peak (noisy recovery) is not a collapse; a later dip that lasts to
the end is, at its own first step. A run that ends fewer than `min_after` steps after the dip began is
not labelled (too short to tell). None: no collapse.

A run that does not collapse is not thereby healthy. The second rule (`damaged`): the trailing mean stayed
below `DAMAGE_FRACTION` (half) of its running peak (a peak >= `min_peak`) for at least `DAMAGE_STEPS`
consecutive steps (three trailing-mean windows). Such a run lost half of what it could do for longer than
a noisy dip lasts, and whether it then crawled back above 20 % of its peak is what separates it from a
collapse in hindsight; online, at the drop, the two look alike and an alert is due. A damaged run is
neither a collapse (no critical finding is owed) nor a control (a critical finding on it is not a false
alarm). `outcome` gives the three-way label.

Pure (no I/O).
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "COLLAPSE",
    "COLLAPSE_FRACTION",
    "DAMAGED",
    "DAMAGE_FRACTION",
    "DAMAGE_RULE_TEXT",
    "DAMAGE_STEPS",
    "HEALTHY",
    "MIN_AFTER",
    "MIN_PEAK",
    "RULE",
    "RULE_TEXT",
    "WINDOW",
    "collapse_step",
    "longest_shortfall",
    "lost_half",
    "outcome",
    "trailing_means",
]

WINDOW: Final = 10
"""Steps in the trailing mean of the reward."""
COLLAPSE_FRACTION: Final = 0.2
"""Collapsed: the trailing mean stays below this fraction of its running peak until the end."""
MIN_PEAK: Final = 0.05
"""A peak trailing mean below this is nothing to collapse from (no label)."""
MIN_AFTER: Final = 10
"""Steps the run must last after the labelled step (else too short to tell; no label)."""

RULE: Final = f"sustained-collapse(window={WINDOW},fraction={COLLAPSE_FRACTION},min_peak={MIN_PEAK},min_after={MIN_AFTER})"
"""Short identifier of the rule with its parameters (stored with every recorded label)."""
RULE_TEXT: Final = (
    f"labelled collapse step: the first step after which the reward's {WINDOW}-step trailing mean stays "
    f"below {COLLAPSE_FRACTION:.0%} of its running peak until the end of the run, if that peak was "
    f">= {MIN_PEAK} and the run lasted >= {MIN_AFTER} steps past it (lldmon_lab/labels.py)"
)


DAMAGE_FRACTION: Final = 0.5
"""Damaged: the trailing mean below this fraction of its running peak for `DAMAGE_STEPS` steps."""
DAMAGE_STEPS: Final = 3 * WINDOW
"""Consecutive steps below `DAMAGE_FRACTION` of the peak that make a run damaged: three trailing-mean
windows, longer than the noisy dips of the healthy runs measured (the longest on the 15 third-party
controls spans 24 steps, on the generated controls 14)."""
DAMAGE_RULE_TEXT: Final = (
    f"damaged (not a collapse, not a control): the reward's {WINDOW}-step trailing mean stayed below "
    f"{DAMAGE_FRACTION:.0%} of its running peak (>= {MIN_PEAK}) for >= {DAMAGE_STEPS} consecutive steps "
    "(lldmon_lab/labels.py)"
)

COLLAPSE: Final = "collapse"
DAMAGED: Final = "damaged"
HEALTHY: Final = "healthy"


def _clean(steps: npt.ArrayLike, rewards: npt.ArrayLike) -> tuple[list[int], list[float]]:
    s = np.asarray(steps).ravel().tolist()
    r = np.asarray(rewards, dtype=np.float64).ravel().tolist()
    if len(s) != len(r):
        raise ValueError(f"steps and rewards differ in length ({len(s)} vs {len(r)})")
    by_step: dict[int, float] = {}
    for step, value in zip(s, r, strict=True):
        if math.isfinite(value):
            by_step[int(step)] = float(value)  # a step logged twice: the later value wins
    ordered = sorted(by_step)
    return ordered, [by_step[k] for k in ordered]


def trailing_means(
    steps: npt.ArrayLike, rewards: npt.ArrayLike, window: int = WINDOW
) -> tuple[list[int], list[float]]:
    """(steps, means): at each logged step `s` with a finite reward, the mean of the finite rewards
    logged at steps in `(s - window, s]`. Steps are sorted; a step logged twice keeps its later value.

    steps, rewards: (n,) each (lists or arrays)."""
    if window < 1:
        raise ValueError("window must be >= 1")
    s, r = _clean(steps, rewards)
    means: list[float] = []
    first = 0
    for i, step in enumerate(s):
        while s[first] <= step - window:
            first += 1
        means.append(sum(r[first : i + 1]) / (i + 1 - first))  # a fresh sum: no drift over long runs
    return s, means


def collapse_step(
    steps: npt.ArrayLike,
    rewards: npt.ArrayLike,
    *,
    window: int = WINDOW,
    fraction: float = COLLAPSE_FRACTION,
    min_peak: float = MIN_PEAK,
    min_after: int = MIN_AFTER,
) -> int | None:
    """The labelled collapse step of a reward series (rule: module docstring), or None.

    steps: (n,) logged steps; rewards: (n,) rewards at those steps (NaN/inf ignored). O(n * window).

    The trailing mean lags: after a sudden drop from a plateau p to ~0, the mean falls below 0.2 p once
    fewer than 2 of the window's points are from the plateau, i.e. about `window - 2` steps after the
    last good step (when the reward is logged every step). Lead times measured against this label
    include that lag.
    """
    s, means = trailing_means(steps, rewards, window)
    if not s:
        return None
    peaks: list[float] = []
    peak = -math.inf
    for m in means:
        peak = max(peak, m)
        peaks.append(peak)
    start: int | None = None  # first index of the suffix where every point is below fraction * peak
    for i in range(len(s) - 1, -1, -1):
        if means[i] < fraction * peaks[i]:
            start = i
        else:
            break
    if start is None:
        return None
    for i in range(start, len(s)):
        if s[-1] - s[i] < min_after:
            return None
        if peaks[i] >= min_peak:  # the peak is constant along the suffix unless rewards are negative
            return s[i]
    return None


def longest_shortfall(
    steps: npt.ArrayLike,
    rewards: npt.ArrayLike,
    *,
    fraction: float = DAMAGE_FRACTION,
    window: int = WINDOW,
    min_peak: float = MIN_PEAK,
) -> tuple[int | None, int]:
    """(first step, steps spanned) of the longest run of consecutive logged points whose trailing mean is
    below `fraction` of its running peak (a peak >= `min_peak`); (None, 0) when there is none. A stretch
    of one point spans one step.

    steps: (n,) logged steps; rewards: (n,) rewards at those steps (NaN/inf ignored)."""
    s, means = trailing_means(steps, rewards, window)
    best_start: int | None = None
    best = 0
    start: int | None = None
    peak = -math.inf
    for step, m in zip(s, means, strict=True):
        peak = max(peak, m)
        if peak >= min_peak and m < fraction * peak:
            start = step if start is None else start
            if step - start + 1 > best:
                best_start, best = start, step - start + 1
        else:
            start = None
    return best_start, best


def lost_half(steps: npt.ArrayLike, rewards: npt.ArrayLike) -> bool:
    """The damaged rule's test (module docstring), for a run the collapse rule does not label."""
    return longest_shortfall(steps, rewards)[1] >= DAMAGE_STEPS


def outcome(steps: npt.ArrayLike, rewards: npt.ArrayLike) -> str:
    """`COLLAPSE`, `DAMAGED` or `HEALTHY` by the two rules (module docstring)."""
    if collapse_step(steps, rewards) is not None:
        return COLLAPSE
    return DAMAGED if lost_half(steps, rewards) else HEALTHY

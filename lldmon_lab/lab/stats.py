"""The lab's statistics over seeds: a collapse rate's interval, Fisher's exact test between two arms and a
mean's interval (pure; scipy does the arithmetic).

Why these: the lab counts collapses in a handful to a few dozen seeds per arm, often 0 of n, where the
normal-approximation interval collapses to [0, 0]. The Wilson score interval keeps a sensible width at
0/n and n/n; Fisher's exact test needs no large-sample assumption for a 2 x 2 table of
collapsed / survived. A reward (best or final 10-step mean of a run) is averaged over the seeds with a
Student t interval: deterministic (no resampling seed to record) and defined from two runs on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from scipy import stats

__all__ = ["CONFIDENCE", "Alternative", "MeanInterval", "fisher_p", "mean_interval", "rate_interval"]

CONFIDENCE: Final = 0.95
Alternative = Literal["less", "greater", "two-sided"]


def _check_count(k: int, n: int, what: str) -> None:
    if isinstance(k, bool) or isinstance(n, bool) or not isinstance(k, int) or not isinstance(n, int):
        raise ValueError(f"{what}: counts must be integers, got {k!r} of {n!r}")
    if not 0 <= k <= n:
        raise ValueError(f"{what}: need 0 <= collapsed <= runs, got {k} of {n}")


def rate_interval(k: int, n: int) -> tuple[float, float] | None:
    """Wilson score 95 % interval of a rate of `k` in `n` (`scipy.stats.binomtest(...).proportion_ci`);
    None for n == 0 (no run, no rate)."""
    _check_count(k, n, "rate_interval")
    if n == 0:
        return None
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=CONFIDENCE, method="wilson")
    return float(ci.low), float(ci.high)


def fisher_p(k_a: int, n_a: int, k_b: int, n_b: int, alternative: Alternative = "two-sided") -> float | None:
    """Fisher's exact p for the table [[k_a, n_a - k_a], [k_b, n_b - k_b]] (collapsed, survived per arm).

    `alternative="less"`: the p that arm a's collapse odds are lower than arm b's (a collapses less
    often); "two-sided": that they differ. None when either arm has no run."""
    _check_count(k_a, n_a, "fisher_p (arm a)")
    _check_count(k_b, n_b, "fisher_p (arm b)")
    if n_a == 0 or n_b == 0:
        return None
    result = stats.fisher_exact([[k_a, n_a - k_a], [k_b, n_b - k_b]], alternative=alternative)
    return float(result.pvalue)


@dataclass(frozen=True)
class MeanInterval:
    n: int
    mean: float
    low: float | None
    """Lower end of the Student t 95 % interval of the mean; None below 2 values (no interval)."""
    high: float | None


def mean_interval(values: Sequence[float]) -> MeanInterval | None:
    """Mean and Student t 95 % interval (`scipy.stats.t.interval`, n - 1 degrees of freedom); None
    without values, no interval for one value, a zero-width one when every value is the same."""
    xs = [float(v) for v in values]
    bad = [v for v in xs if not math.isfinite(v)]
    if bad:
        raise ValueError(f"mean_interval: values must be finite, got {bad[0]!r}")
    n = len(xs)
    if n == 0:
        return None
    mean = math.fsum(xs) / n
    if n < 2:
        return MeanInterval(n, mean, None, None)
    if min(xs) == max(xs):
        return MeanInterval(n, mean, mean, mean)
    low, high = stats.t.interval(CONFIDENCE, df=n - 1, loc=mean, scale=float(stats.sem(xs)))
    return MeanInterval(n, mean, float(low), float(high))

"""Spike-preserving downsampling of one series (min/max buckets), so plots keep collapse spikes."""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt


def minmax_indices(values: npt.NDArray[np.float64], max_points: int) -> npt.NDArray[np.int64]:
    """Indices (ascending) of at most `max_points` points that keep every bucket's extremes.

    The series is cut into equal buckets; each keeps its finite minimum and maximum and its first
    non-finite point (NaN/inf are collapse signals, never averaged away). The first and last points
    are always kept.
    """
    n = len(values)
    if max_points <= 0:
        raise ValueError("max_points must be positive")
    if n <= max_points:
        return np.arange(n, dtype=np.int64)
    if max_points < 5:
        return np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))
    n_buckets = max(1, (max_points - 2) // 3)
    edges = np.linspace(1, n - 1, n_buckets + 1).astype(np.int64)
    finite = np.isfinite(values)
    keep: list[int] = [0, n - 1]
    for lo, hi in itertools.pairwise(edges):
        if hi <= lo:
            continue
        chunk = values[lo:hi]
        ok = finite[lo:hi]
        if ok.any():
            masked_low = np.where(ok, chunk, np.inf)
            masked_high = np.where(ok, chunk, -np.inf)
            keep.append(lo + int(np.argmin(masked_low)))
            keep.append(lo + int(np.argmax(masked_high)))
        if not ok.all():
            keep.append(lo + int(np.argmin(ok)))
    return np.unique(np.asarray(keep, dtype=np.int64))

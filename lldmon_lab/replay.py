"""Thinned replays of a run: what the detector would have seen from a trainer that logs less often.

Used by the tests and `benchmarks/detection.py` to check that every window and confirmation works in
steps, not points (TRL's default `logging_steps=10`, or a reward every 2 steps and the likelihood
deltas every 5).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import numpy as np
import numpy.typing as npt

from monitor.detector.stats import FloatArray, IntArray
from monitor.detector.types import BoolArray

Thinned = tuple[IntArray, dict[str, FloatArray], dict[str, BoolArray]]


def thin(
    steps: npt.ArrayLike,
    values: Mapping[str, npt.ArrayLike],
    present: Mapping[str, npt.ArrayLike] | None = None,
    every: int = 10,
    per_metric: Mapping[str, int] | None = None,
    how: Literal["mean", "last"] = "mean",
) -> Thinned:
    """For each metric, one value per block of `every` steps (`per_metric` sets another block length for
    some metrics), at the block's last logged step: the mean of the values logged in the block (`how=
    "mean"`, what TRL logs with `logging_steps=every`: its metrics are averaged over the logging
    interval; a NaN / inf in the block stays NaN / inf) or its last value (`"last"`, a logger that
    samples). The steps are the union of the steps kept. Without `present`, NaN means "not logged"."""
    s = np.asarray(steps, dtype=np.int64).ravel()
    vals = {k: np.asarray(v, dtype=np.float64).ravel() for k, v in values.items()}
    pres = (
        {k: ~np.isnan(v) for k, v in vals.items()}
        if present is None
        else {k: np.asarray(present[k], dtype=np.bool_).ravel() for k in vals}
    )
    blocks = per_metric or {}
    keep: dict[str, BoolArray] = {}
    kept: dict[str, FloatArray] = {}
    for name, mask in pres.items():
        block = (s // max(1, blocks.get(name, every))).astype(np.int64)
        idx = np.flatnonzero(mask)
        last = np.zeros(s.size, dtype=np.bool_)
        out = np.full(s.size, np.nan)
        if idx.size:
            b = block[idx]
            ends = np.r_[b[1:] != b[:-1], True]  # the last logged point of each block
            last[idx[ends]] = True
            if how == "mean":
                starts = np.r_[True, b[1:] != b[:-1]]
                group = np.cumsum(starts) - 1
                sums = np.bincount(group, weights=vals[name][idx])
                counts = np.bincount(group)
                with np.errstate(invalid="ignore"):
                    out[idx[ends]] = sums / counts
            else:
                out[idx[ends]] = vals[name][idx[ends]]
        keep[name] = last
        kept[name] = out
    any_kept = np.zeros(s.size, dtype=np.bool_)
    for mask in keep.values():
        any_kept |= mask
    out_steps = s[any_kept]
    out_vals = {k: kept[k][any_kept] for k in vals}
    out_pres = {k: keep[k][any_kept] for k in vals}
    return out_steps, out_vals, out_pres


__all__ = ["thin"]

"""min/max-bucket downsampling keeps extremes, non-finite points and both ends."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.services.downsample import minmax_indices


def test_short_series_untouched() -> None:
    assert minmax_indices(np.arange(5.0), 10).tolist() == [0, 1, 2, 3, 4]


def test_rejects_non_positive_budget() -> None:
    with pytest.raises(ValueError, match="max_points"):
        minmax_indices(np.arange(5.0), 0)


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(
        st.floats(allow_nan=True, allow_infinity=True, width=64) | st.floats(-1e6, 1e6),
        min_size=1,
        max_size=3000,
    ),
    max_points=st.integers(1, 500),
)
def test_budget_order_and_extremes(values: list[float], max_points: int) -> None:
    arr = np.asarray(values, dtype=np.float64)
    keep = minmax_indices(arr, max_points)
    assert len(keep) <= max(max_points, 0) or len(arr) <= max_points
    assert keep.tolist() == sorted(set(keep.tolist()))
    if len(arr) > max_points >= 5:
        assert keep[0] == 0 and keep[-1] == len(arr) - 1
        finite = arr[np.isfinite(arr)]
        if finite.size:
            kept = arr[keep]
            assert np.nanmax(np.where(np.isfinite(kept), kept, -np.inf)) == finite.max()
            assert np.nanmin(np.where(np.isfinite(kept), kept, np.inf)) == finite.min()
        if not np.isfinite(arr).all():
            assert not np.isfinite(arr[keep]).all()

"""Robust statistics against naive reference implementations."""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.detector import stats

values = st.lists(
    st.one_of(
        st.floats(min_value=-1e3, max_value=1e3, allow_nan=False),
        st.just(float("nan")),
        st.just(float("inf")),
    ),
    min_size=0,
    max_size=40,
)


def naive_median(xs: list[float]) -> float:
    finite = [x for x in xs if math.isfinite(x)]
    return statistics.median(finite) if finite else float("nan")


def naive_mad(xs: list[float]) -> float:
    finite = [x for x in xs if math.isfinite(x)]
    if not finite:
        return float("nan")
    m = statistics.median(finite)
    return statistics.median([abs(x - m) for x in finite])


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-9)


@given(values)
def test_median_and_mad_match_naive(xs: list[float]) -> None:
    assert same(stats.median(xs), naive_median(xs))
    assert same(stats.mad(xs), naive_mad(xs))
    if any(math.isfinite(x) for x in xs):
        finite = np.array([x for x in xs if math.isfinite(x)])
        assert same(stats.fast_median(finite), float(np.median(finite)))


def test_fast_median_large_arrays_use_partition() -> None:
    rng = np.random.default_rng(0)
    for n in (257, 1000, 1001):
        v = rng.normal(size=n)
        assert stats.fast_median(v) == pytest.approx(float(np.median(v)))


def naive_theil_sen(x: list[float], y: list[float]) -> tuple[float, float, float]:
    pts = [(a, b) for a, b in zip(x, y, strict=True) if math.isfinite(a) and math.isfinite(b)]
    slopes = [(y2 - y1) / (x2 - x1) for (x1, y1), (x2, y2) in itertools.combinations(pts, 2) if x2 != x1]
    slope = statistics.median(slopes)
    intercept = statistics.median([b - slope * a for a, b in pts])
    s = sum(
        (1 if (y2 - y1) * (x2 - x1) > 0 else -1 if (y2 - y1) * (x2 - x1) < 0 else 0)
        for (x1, y1), (x2, y2) in itertools.combinations(pts, 2)
    )
    n = len(pts)
    ties = [len(list(g)) for _, g in itertools.groupby(sorted(b for _, b in pts))]
    var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties)) / 18
    z = 0.0 if s == 0 or var <= 0 else (s - math.copysign(1, s)) / math.sqrt(var)
    return slope, intercept, z


@settings(max_examples=100)
@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.integers(-50, 50).map(float), st.floats(-50, 50, allow_nan=False, allow_subnormal=False)
            ),
            st.one_of(
                st.integers(-3, 3).map(float), st.floats(-100, 100, allow_nan=False), st.just(float("nan"))
            ),
        ),
        min_size=0,
        max_size=25,
    )
)
def test_theil_sen_matches_naive(points: list[tuple[float, float]]) -> None:
    x = [p[0] for p in points]
    y = [p[1] for p in points]
    fit = stats.theil_sen(x, y)
    finite = [(a, b) for a, b in points if math.isfinite(b)]
    distinct_x = len({a for a, _ in finite}) >= 2
    if len(finite) < 2 or not distinct_x:
        assert math.isnan(fit.slope) and fit.n == 0
        return
    slope, intercept, z = naive_theil_sen(x, y)
    assert fit.slope == pytest.approx(slope, rel=1e-9, abs=1e-9)
    assert fit.intercept == pytest.approx(intercept, rel=1e-9, abs=1e-6)
    if len({a for a, _ in finite}) == len(finite):  # the naive S uses all pairs; ours skips equal x
        assert fit.mk_z == pytest.approx(z, rel=1e-9, abs=1e-9)


def test_theil_sen_recovers_a_line_despite_outliers() -> None:
    x = np.arange(30.0)
    y = 2.0 - 0.5 * x
    y[[3, 17, 25]] += [50.0, -80.0, 1e6]
    fit = stats.theil_sen(x, y)
    assert fit.slope == pytest.approx(-0.5)
    assert fit.intercept == pytest.approx(2.0)
    assert fit.mk_z < -5
    assert fit.z == -math.inf  # zero residual noise: an exact line


def test_mann_kendall_is_calibrated_on_noise() -> None:
    rng = np.random.default_rng(1)
    x = np.arange(30.0)
    z = np.array([stats.theil_sen(x, rng.standard_t(3, 30)).mk_z for _ in range(2000)])
    assert abs(z.std() - 1) < 0.08
    assert (z <= -3).mean() < 0.006  # nominal 0.00135, whatever the noise law


def test_slope_se_matches_ols_formula() -> None:
    x = np.arange(10.0)
    assert stats.slope_se(x, 2.0) == pytest.approx(2.0 / math.sqrt(np.sum((x - x.mean()) ** 2)))
    assert math.isnan(stats.slope_se([1.0], 1.0))


def naive_cusum(xs: list[float], target: float, scale: float, k: float, direction: int) -> list[float]:
    out, s = [], 0.0
    for x in xs:
        if math.isfinite(x):
            s = max(0.0, s + direction * (x - target) / scale - k)
        out.append(s)
    return out


@given(values, st.floats(-10, 10), st.floats(0.01, 10), st.floats(0, 2), st.sampled_from([1, -1]))
def test_cusum_matches_naive(xs: list[float], target: float, scale: float, k: float, direction: int) -> None:
    got = stats.cusum(xs, target, scale, k, direction)
    want = naive_cusum(xs, target, scale, k, direction)
    assert got.tolist() == pytest.approx(want)
    assert stats.cusum_last(xs, target, scale, k, direction) == pytest.approx(want[-1] if want else 0.0)


def test_cusum_detects_a_shift_and_rejects_bad_input() -> None:
    x = np.r_[np.zeros(20), np.full(10, -2.0)]
    path = stats.cusum(x, 0.0, 1.0, k=0.5, direction=-1)
    assert path[19] == 0 and path[-1] == pytest.approx(15.0)
    assert np.isnan(stats.cusum(x, 0.0, 0.0)).all()
    with pytest.raises(ValueError):
        stats.cusum(x, 0.0, 1.0, direction=0)


def test_empty_and_all_nan_inputs_give_nan_without_warnings() -> None:
    # pytest runs with warnings as errors: a RuntimeWarning here would fail the test
    for data in ([], [float("nan")] * 5):
        assert math.isnan(stats.median(data))
        assert math.isnan(stats.mad(data))
        assert math.isnan(stats.quantile(data, 0.5))
    assert stats.theil_sen([], []) is stats.NO_FIT
    assert math.isnan(stats.NO_FIT.z)
    with pytest.raises(ValueError):
        stats.theil_sen([1.0, 2.0], [1.0])


def test_theil_sen_with_a_subnormal_x_gap_warns_nothing() -> None:
    """Found by hypothesis in CI: x points 1e-305 apart give an infinite slope and inf * 0 = NaN in the
    intercept; the fit must come back (degenerate) without a RuntimeWarning."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = stats.theil_sen(np.array([0.0, 9.81968732e-306]), np.array([0.0, 883.0]), autocorr=True)
    assert fit.slope == np.inf and fit.mk_z == 0.0 and fit.mk_z_corrected == 0.0

"""Robust statistics over short series, in plain numpy (no scipy): medians / MAD that ignore NaN without
warnings, Theil-Sen slopes with a robust standard error and a Mann-Kendall trend score (optionally corrected
for autocorrelated noise), and one-sided CUSUM.

Every function accepts NaN / inf in its input and ignores non-finite points; an empty selection gives NaN
(never a RuntimeWarning), so callers need no `np.errstate` guards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

MAD_TO_SD: Final = 1.482602218505602
"""1 / Phi^-1(3/4): MAD * this estimates the standard deviation of normal data."""


def finite(x: npt.ArrayLike) -> FloatArray:
    """The finite values of `x` as a 1-D float array."""
    arr = np.asarray(x, dtype=np.float64).ravel()
    return arr[np.isfinite(arr)]


def fast_median(v: FloatArray) -> float:
    """Median of a non-empty array without NaN (np.median costs ~40 us of overhead per call; this sorts
    small arrays and partitions large ones)."""
    n = v.size
    lo, hi = (n - 1) // 2, n // 2
    if n <= 256:
        s = np.sort(v)
        return 0.5 * float(s[lo] + s[hi])
    p = np.partition(v, (lo, hi))
    return 0.5 * float(p[lo] + p[hi])


def median(x: npt.ArrayLike) -> float:
    """Median of the finite values (NaN if there are none)."""
    v = finite(x)
    return fast_median(v) if v.size else float("nan")


def mad(x: npt.ArrayLike, center: float | None = None) -> float:
    """Median absolute deviation of the finite values around `center` (default: their median)."""
    v = finite(x)
    if v.size == 0:
        return float("nan")
    c = fast_median(v) if center is None else center
    return fast_median(np.abs(v - c))


def quantile(x: npt.ArrayLike, q: float) -> float:
    """Linear-interpolated quantile (q in 0..1) of the finite values, NaN if there are none."""
    v = finite(x)
    return float(np.quantile(v, q)) if v.size else float("nan")


@lru_cache(maxsize=64)
def _pairs(n: int) -> tuple[IntArray, IntArray]:
    i, j = np.triu_indices(n, k=1)
    return i.astype(np.int64), j.astype(np.int64)


@dataclass(frozen=True)
class TrendFit:
    """Theil-Sen fit y ~ intercept + slope * x with a robust standard error of the slope."""

    slope: float
    intercept: float
    se: float
    """Robust standard error: 1.4826 * MAD(residuals) / sqrt(sum (x - mean x)^2) (the OLS formula with a
    robust noise scale; Theil-Sen's efficiency is ~0.9 of OLS on normal noise)."""
    resid_sd: float
    n: int
    mk_z: float = float("nan")
    """Mann-Kendall trend statistic Z = (S - sign S) / sqrt(Var S), S = sum over pairs of
    sign(y_j - y_i) sign(x_j - x_i), Var S with the tie correction (Kendall 1975). Distribution-free under
    iid noise: P(Z <= -3) = 0.00135 for any noise law, unlike slope / SE with a MAD noise estimate.
    Autocorrelated noise inflates it (AR(1), phi = 0.8, n = 30 / 60: |Z| >= 3 in 23 % / 29 % of trend-free
    series); see `mk_z_corrected`."""
    mk_z_corrected: float = float("nan")
    """`mk_z` with Var S inflated for autocorrelated noise (Yue & Wang 2004 over lags 1-2, see
    `mann_kendall_corrected`); NaN unless `theil_sen(..., autocorr=True)`. Never larger in magnitude than
    `mk_z` (equal below `MK_AUTOCORR_MIN_N` points)."""

    @property
    def z(self) -> float:
        """slope / se (+-inf when the residuals are exactly zero, NaN without a fit)."""
        if not np.isfinite(self.slope):
            return float("nan")
        if self.se > 0:
            return self.slope / self.se
        if self.slope == 0:
            return 0.0
        return float(np.copysign(np.inf, self.slope))


NO_FIT: Final = TrendFit(float("nan"), float("nan"), float("nan"), float("nan"), 0, float("nan"))


def _tie_term(values: FloatArray) -> float:
    """sum over groups of tied values of t (t - 1) (2t + 5) (0 without ties, the common case)."""
    s = np.sort(values)
    same = s[1:] == s[:-1]
    if not same.any():
        return 0.0
    # lengths of runs of equal values: boundaries where `same` switches
    edges = np.flatnonzero(np.diff(np.concatenate(([False], same, [False])).astype(np.int8)))
    t = (edges[1::2] - edges[::2] + 1).astype(np.float64)
    return float(np.sum(t * (t - 1) * (2 * t + 5)))


def mann_kendall_z(s: float, n: int, tie_term: float = 0.0) -> float:
    """Normal score of the Mann-Kendall statistic S with continuity correction."""
    var = (n * (n - 1) * (2 * n + 5) - tie_term) / 18.0
    if var <= 0 or s == 0:
        return 0.0
    return (s - math.copysign(1.0, s)) / math.sqrt(var)


AutocorrMethod = Literal["hamed_rao", "yue_wang"]

MK_AUTOCORR_METHOD: Final[AutocorrMethod] = "yue_wang"
"""The correction `theil_sen(..., autocorr=True)` applies, over lags 1..`MK_AUTOCORR_LAG`. Chosen by
benchmarks/trend_autocorr.py: on trend-free AR(1) phi = 0.8 noise, |Z| >= 3 in 6.4 % / 5.1 % of series at
n = 30 / 60 (iid Z: 23 % / 29 %; nominal 0.27 %), against Hamed-Rao 13.5 % / 11.7 % (all lags,
pymannkendall's default) or 9.7 % / 5.5 % (lags 1-3) and Yue-Wang 23 % / 28 % (all lags) or
6.4 % / 4.2 % (lags 1-3, ~10 points less power at n = 60). Power on iid noise drops ~3-4 points."""

MK_AUTOCORR_LAG: Final = 2
"""Lags summed by the default correction. At n <= 60 more lags add noise, not signal: the biased sample
autocorrelations of a demeaned series sum to exactly -1/2 over all lags, so the long-lag tail cancels
the short lags (the all-lag Yue-Wang factor is mostly below 1, i.e. no correction at all). What remains
above nominal is the estimate, not the formula: r_1 of 30 detrended AR(1) phi = 0.8 points averages
~0.56; with the true autocorrelations the Hamed-Rao Var S matches the simulated one."""

MK_AUTOCORR_MIN_N: Final = 10
"""Below this many points lag autocorrelations are too noisy to estimate: the corrected Z is the iid one."""

_Z_975: Final = 1.959963984540054
"""Phi^-1(0.975): a lag autocorrelation outside +-_Z_975 / sqrt(n) is significant at 5 % (Hamed & Rao 1998)."""


def _average_ranks(v: FloatArray) -> FloatArray:
    """Ranks 1..n of `v`, tied values sharing the mean of their ranks (scipy.stats.rankdata's default), as
    the ranks of Hamed & Rao (1998) need."""
    order = np.argsort(v, kind="stable")
    s = v[order]
    first = np.concatenate(([True], s[1:] != s[:-1]))
    group = np.cumsum(first) - 1
    bounds = np.flatnonzero(np.concatenate((first, [True])))  # start of each group of ties, then n
    ranks = np.empty(v.size)
    ranks[order] = 0.5 * (bounds[group] + bounds[group + 1] + 1)
    return ranks


def _acf(v: FloatArray, max_lag: int) -> FloatArray:
    """Sample autocorrelations r_1..r_max_lag of `v` in the order given (the biased estimator: lag sums
    divided by n, as Hamed & Rao and Yue & Wang use); NaN when `v` is constant."""
    n = v.size
    c = v - v.sum() / n  # v.mean() costs a few us more
    acov: FloatArray = np.correlate(c, c, "full")[n - 1 : n + max_lag]  # all lags in one C loop: n^2 products
    if not acov[0] > 0:
        return np.full(max_lag, np.nan)
    r: FloatArray = acov[1:] / acov[0]
    return r


def _read_only(a: FloatArray) -> FloatArray:
    a.setflags(write=False)
    return a


@lru_cache(maxsize=128)
def _hamed_rao_weights(n: int, max_lag: int) -> FloatArray:
    m = n - np.arange(1, max_lag + 1, dtype=np.float64)
    return _read_only(2.0 / (n * (n - 1) * (n - 2)) * m * (m - 1) * (m - 2))


@lru_cache(maxsize=128)
def _yue_wang_weights(n: int, max_lag: int) -> FloatArray:
    return _read_only(2.0 * (1.0 - np.arange(1, max_lag + 1, dtype=np.float64) / n))


def hamed_rao_factor(resid: FloatArray, lag: int | None = None) -> float:
    """Hamed & Rao (1998) variance inflation n/n* = 1 + 2 / (n (n-1) (n-2)) * sum_k (n-k)(n-k-1)(n-k-2) r_k
    over the lags k = 1..n-1 (1..`lag` if given) whose autocorrelation r_k of the ranks of the detrended
    series `resid` is significant at 5 % (|r_k| > 1.96 / sqrt(n)), pymannkendall's
    `hamed_rao_modification_test` convention. Unfloored (below 1, even negative, under negative
    autocorrelation); NaN for a constant series.

    Hamed, K.H. & Rao, A.R. (1998), A modified Mann-Kendall trend test for autocorrelated data,
    J. Hydrology 204, 182-196."""
    n = resid.size
    max_lag = n - 1 if lag is None else min(lag, n - 1)
    if n < 3 or max_lag < 1:
        return 1.0
    r = _acf(_average_ranks(resid), max_lag)
    if np.isnan(r[0]):
        return float("nan")
    r[np.abs(r) <= _Z_975 / math.sqrt(n)] = 0.0
    return 1.0 + float(_hamed_rao_weights(n, max_lag) @ r)


def yue_wang_factor(resid: FloatArray, lag: int | None = None) -> float:
    """Yue & Wang (2004) variance inflation n/n* = 1 + 2 sum_k (1 - k/n) r_k from the autocorrelations r_k
    of the detrended series `resid` itself, lags k = 1..n-1 (1..`lag` if given), no significance screen:
    pymannkendall's `yue_wang_modification_test` convention. Unfloored; NaN for a constant series.

    Yue, S. & Wang, C.Y. (2004), The Mann-Kendall test modified by effective sample size to detect trend
    in serially correlated hydrological series, Water Resources Management 18, 201-218."""
    n = resid.size
    max_lag = n - 1 if lag is None else min(lag, n - 1)
    if max_lag < 1:
        return 1.0
    return 1.0 + float(_yue_wang_weights(n, max_lag) @ _acf(resid, max_lag))


def _mk_z_corrected(
    xa: FloatArray,
    ya: FloatArray,
    slope: float,
    z: float,
    method: AutocorrMethod,
    lag: int | None,
) -> float:
    """The iid Mann-Kendall `z` divided by sqrt(max(1, n/n*)), n/n* from the series detrended by `slope`
    and put in x order (the lag structure is the order of the points, whatever their x spacing)."""
    n = xa.size
    if n < MK_AUTOCORR_MIN_N or z == 0 or not math.isfinite(slope):
        return z
    if (xa[1:] < xa[:-1]).any():
        order = np.argsort(xa, kind="stable")
        xa, ya = xa[order], ya[order]
    with np.errstate(over="ignore", invalid="ignore"):  # huge y: a non-finite residual gives factor NaN
        resid = ya - slope * xa
        factor = hamed_rao_factor(resid, lag) if method == "hamed_rao" else yue_wang_factor(resid, lag)
    # Floor at 1: negative autocorrelation would shrink Var S below the iid value and so *raise* |Z|; the
    # detector wants a correction that only removes false alarms, and on trend-free series a sampling dip
    # below 1 is noise, not evidence. NaN (constant residuals: an exact line) also keeps the iid Z.
    if not factor > 1.0:
        return z
    return z / math.sqrt(factor)


def _theil_sen(
    x: npt.ArrayLike, y: npt.ArrayLike, method: AutocorrMethod | None, lag: int | None = None
) -> TrendFit:
    xa = np.asarray(x, dtype=np.float64).ravel()
    ya = np.asarray(y, dtype=np.float64).ravel()
    if xa.shape != ya.shape:
        raise ValueError("x and y must have the same length")
    ok = np.isfinite(xa) & np.isfinite(ya)
    if not ok.all():
        xa, ya = xa[ok], ya[ok]
    n = xa.size
    if n < 2:
        return NO_FIT
    i, j = _pairs(n)
    dx = xa[j] - xa[i]
    keep = dx != 0
    if not keep.all():
        if not keep.any():
            return NO_FIT
        i, j, dx = i[keep], j[keep], dx[keep]
    dy = ya[j] - ya[i]
    # absurdly close x values (subnormal gaps): an infinite slope, and NaN residuals from inf * 0, are fine
    with np.errstate(over="ignore", invalid="ignore"):
        slope = fast_median(dy / dx)
        intercept = fast_median(ya - slope * xa)
        resid = ya - (intercept + slope * xa)
        resid_sd = MAD_TO_SD * fast_median(np.abs(resid - fast_median(resid)))
    s_stat = float(np.sign(dy * dx).sum())
    ties = _tie_term(ya)
    sxx = float(np.sum((xa - xa.mean()) ** 2))
    se = resid_sd / np.sqrt(sxx) if sxx > 0 else float("nan")
    z = mann_kendall_z(s_stat, n, ties)
    z_corr = float("nan") if method is None else _mk_z_corrected(xa, ya, slope, z, method, lag)
    return TrendFit(slope, intercept, float(se), resid_sd, n, z, z_corr)


def theil_sen(x: npt.ArrayLike, y: npt.ArrayLike, autocorr: bool = False) -> TrendFit:
    """Theil-Sen estimator: the median of the pairwise slopes (y_j - y_i) / (x_j - x_i) over pairs with
    distinct x, intercept = median(y - slope * x). Points with a non-finite x or y are dropped.
    `autocorr=True` also fills `mk_z_corrected` (`mann_kendall_corrected` with its defaults, reusing this
    fit): ~1.4x the time per call at n = 30-60 (benchmarks/trend_autocorr.py)."""
    return _theil_sen(x, y, MK_AUTOCORR_METHOD if autocorr else None, MK_AUTOCORR_LAG)


def mann_kendall_corrected(
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    method: AutocorrMethod = MK_AUTOCORR_METHOD,
    lag: int | None = MK_AUTOCORR_LAG,
) -> float:
    """Mann-Kendall Z of y against x with Var S inflated for serially correlated noise, which the iid Z
    ignores (AR(1) phi = 0.8 over 30 / 60 points: |Z| >= 3 in 23 % / 29 % of trend-free series, nominal
    0.27 %; corrected with the defaults: 6.4 % / 5.1 %).

    Var S is multiplied by max(1, n/n*), n/n* from the autocorrelations of the series detrended by its
    Theil-Sen slope, taken in x order (irregular spacing is ignored: lag k = k points apart):
    "hamed_rao" (Hamed & Rao 1998, ranks, significant lags only; `hamed_rao_factor`) or "yue_wang"
    (Yue & Wang 2004, values, no screen; `yue_wang_factor`) over lags 1..`lag` (None: all, pymannkendall's
    default). The defaults (`MK_AUTOCORR_METHOD`, `MK_AUTOCORR_LAG`) are the measured best calibration and
    equal `theil_sen(x, y, autocorr=True).mk_z_corrected`. Non-finite points are dropped; with fewer than
    `MK_AUTOCORR_MIN_N` points the iid Z is returned; NaN without a fit (fewer than 2 distinct x)."""
    return _theil_sen(x, y, method, lag).mk_z_corrected


def slope_se(x: npt.ArrayLike, noise_sd: float) -> float:
    """Standard error of a slope fitted on the finite x positions for a given noise level."""
    xa = finite(x)
    if xa.size < 2:
        return float("nan")
    sxx = float(np.sum((xa - xa.mean()) ** 2))
    return noise_sd / np.sqrt(sxx) if sxx > 0 else float("nan")


def cusum(x: npt.ArrayLike, target: float, scale: float, k: float = 0.5, direction: int = 1) -> FloatArray:
    """One-sided tabular CUSUM (Page 1954) of the standardised series z = (x - target) / scale:
    S_0 = 0, S_t = max(0, S_{t-1} + d * z_t - k) with d = +1 (upward shift) or -1 (downward shift).
    Non-finite points leave S unchanged. Returns S_t for every point; an alarm is S_t >= h."""
    if direction not in (1, -1):
        raise ValueError("direction must be +1 or -1")
    arr = np.asarray(x, dtype=np.float64).ravel()
    out = np.zeros(arr.size)
    if not (np.isfinite(target) and np.isfinite(scale) and scale > 0):
        out[:] = np.nan
        return out
    z = direction * (arr - target) / scale - k
    s = 0.0
    for t, value in enumerate(z.tolist()):
        if math.isfinite(value):
            s = max(0.0, s + value)
        out[t] = s
    return out


def cusum_last(x: npt.ArrayLike, target: float, scale: float, k: float = 0.5, direction: int = 1) -> float:
    """The CUSUM statistic at the last point, S_T (0 for an empty series, NaN when target/scale are
    unusable)."""
    path = cusum(x, target, scale, k, direction)
    return float(path[-1]) if path.size else 0.0


def noise_sd(x: npt.ArrayLike, y: npt.ArrayLike) -> float:
    """Robust noise level of y around its Theil-Sen trend (so a slow drift is not counted as noise)."""
    return theil_sen(x, y).resid_sd

"""Mann-Kendall Z on autocorrelated noise: false alarms and power of the iid Z against the corrections
in `monitor.detector.stats` (Hamed & Rao 1998, Yue & Wang 2004, each over all lags and a few), and the
cost of `theil_sen(..., autocorr=True)`.

* false alarms: share of `--series` trend-free AR(1) series (unit marginal variance, x = 0..n-1) with
  |Z| >= 3 (nominal 0.27 %), phi in {0, 0.5, 0.8, 0.95}, n in {30, 60}
* power: share of `--power-series` series with a linear trend rising by 2, 4 or 8 marginal noise SDs
  over the window that reach Z >= 3, phi in {0, 0.5, 0.8}
* cost: median CPU time per call of `theil_sen(x, y)` and `theil_sen(x, y, autocorr=True)` (`--reps`
  interleaved batches of 100 calls) at n = 30 and 60, their ratio, and the all-lag Hamed-Rao for scale

Prints Markdown tables; "YW<=2" is what `theil_sen(..., autocorr=True)` computes.

Usage::

    python -m benchmarks.trend_autocorr [--series 2000] [--power-series 1000] [--seed 0] [--reps 200]
                                        [--only-cost]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from monitor.detector import stats

FloatArray = stats.FloatArray
ZFunction = Callable[[FloatArray, FloatArray], float]

VARIANTS: dict[str, ZFunction] = {
    "iid": lambda x, y: stats.theil_sen(x, y).mk_z,
    "YW<=2 (chosen)": lambda x, y: stats.theil_sen(x, y, autocorr=True).mk_z_corrected,
    "YW<=1": lambda x, y: stats.mann_kendall_corrected(x, y, "yue_wang", 1),
    "YW<=3": lambda x, y: stats.mann_kendall_corrected(x, y, "yue_wang", 3),
    "YW all": lambda x, y: stats.mann_kendall_corrected(x, y, "yue_wang", None),
    "HR<=3": lambda x, y: stats.mann_kendall_corrected(x, y, "hamed_rao", 3),
    "HR all": lambda x, y: stats.mann_kendall_corrected(x, y, "hamed_rao", None),
}
SIZES = (30, 60)


def ar1(rng: np.random.Generator, count: int, n: int, phi: float) -> FloatArray:
    """`count` stationary AR(1) series of length n with unit marginal variance (rows)."""
    out = np.empty((count, n))
    out[:, 0] = rng.normal(size=count)
    innovation_sd = np.sqrt(1 - phi**2)
    for t in range(1, n):
        out[:, t] = phi * out[:, t - 1] + innovation_sd * rng.normal(size=count)
    return out


def z_table(series: FloatArray) -> dict[str, FloatArray]:
    x = np.arange(float(series.shape[1]))
    return {name: np.array([f(x, y) for y in series]) for name, f in VARIANTS.items()}


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def false_alarms(count: int, seed: int) -> str:
    rows = []
    for n in SIZES:
        for phi in (0.0, 0.5, 0.8, 0.95):
            z = z_table(ar1(np.random.default_rng([seed, n, int(phi * 100)]), count, n, phi))
            rows.append([str(n), f"{phi:g}"] + [f"{100 * np.mean(np.abs(v) >= 3):.1f}" for v in z.values()])
    return markdown(["n", "phi", *VARIANTS], rows)


def power(count: int, seed: int) -> str:
    rows = []
    for n in SIZES:
        for phi in (0.0, 0.5, 0.8):
            for rise in (2.0, 4.0, 8.0):
                rng = np.random.default_rng([seed, n, int(phi * 100), int(rise), 1])
                z = z_table(ar1(rng, count, n, phi) + rise * np.arange(n) / (n - 1))
                rows.append(
                    [str(n), f"{phi:g}", f"{rise:g}"] + [f"{100 * np.mean(v >= 3):.1f}" for v in z.values()]
                )
    return markdown(["n", "phi", "rise/sd", *VARIANTS], rows)


def per_call_us(calls: dict[str, Callable[[], object]], reps: int, batch: int = 100) -> dict[str, float]:
    """Median CPU time per call of each function (process time, so other jobs on the machine count less),
    over `reps` batches of `batch` calls, the functions' batches interleaved so drift hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(reps):
        for name, f in calls.items():
            t0 = time.process_time_ns()
            for _ in range(batch):
                f()
            times[name].append((time.process_time_ns() - t0) / batch / 1e3)
    return {name: statistics.median(ts) for name, ts in times.items()}


def cost(reps: int, seed: int) -> str:
    rows = []
    for n in SIZES:
        x = np.arange(float(n))
        y = ar1(np.random.default_rng([seed, n, 2]), 1, n, 0.8)[0] + 0.02 * x
        us = per_call_us(
            {
                "plain": partial(stats.theil_sen, x, y),
                "autocorr": partial(stats.theil_sen, x, y, autocorr=True),
                "hamed_rao": partial(stats.mann_kendall_corrected, x, y, "hamed_rao", None),
            },
            reps,
        )
        plain, corrected = us["plain"], us["autocorr"]
        rows.append(
            [
                str(n),
                f"{plain:.1f}",
                f"{corrected:.1f}",
                f"{corrected / plain:.2f}",
                f"{corrected - plain:+.1f}",
                f"{us['hamed_rao']:.1f}",
            ]
        )
    header = ["n", "theil_sen us", "autocorr=True us", "ratio", "extra us", "HR all lags us"]
    return markdown(header, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=2000, help="trend-free series per (n, phi)")
    parser.add_argument("--power-series", type=int, default=1000, help="trended series per (n, phi, rise)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reps", type=int, default=200, help="timed batches of 100 calls")
    parser.add_argument("--only-cost", action="store_true", help="skip the Monte-Carlo tables")
    args = parser.parse_args(argv)
    if args.only_cost:
        print(cost(args.reps, args.seed))
        return 0
    print(f"## False alarms: % of {args.series} trend-free AR(1) series with |Z| >= 3 (nominal 0.27 %)\n")
    print(false_alarms(args.series, args.seed))
    print(
        f"\n## Power: % of {args.power_series} series with a linear trend (rise over the window) and Z >= 3\n"
    )
    print(power(args.power_series, args.seed))
    print("\n## Cost per call (median)\n")
    print(cost(args.reps, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Series aligned on the union of their steps, and the wide CSV of them: rendering only (numpy, no
database), shared by the API, `lldmon export` and the CLI's remote mode, which renders what it read over
HTTP in an install without the server extra."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from contracts.wire import NAN, NEG_INF, POS_INF
from monitor.domain import Series


@dataclass(frozen=True)
class WideTable:
    """Series aligned on the union of their steps: the shape of every export.

    `values[i, j]` is metric j at `steps[i]`; where `logged[i, j]` is False the metric has no row at
    that step and the value is NaN only as a filler, unlike a NaN that was logged.
    """

    steps: np.ndarray  # (n_steps,) int64, ascending
    names: list[str]  # (n_metrics,)
    values: np.ndarray  # (n_steps, n_metrics) float64
    logged: np.ndarray  # (n_steps, n_metrics) bool


def wide_table(series: Sequence[Series]) -> WideTable:
    names = [s.name for s in series]
    if not series:
        return WideTable(np.empty(0, np.int64), names, np.empty((0, 0)), np.empty((0, 0), dtype=bool))
    steps = np.unique(np.concatenate([np.asarray(s.steps, dtype=np.int64) for s in series]))
    values = np.full((len(steps), len(series)), np.nan)
    logged = np.zeros((len(steps), len(series)), dtype=bool)
    for j, s in enumerate(series):
        rows = np.searchsorted(steps, np.asarray(s.steps, dtype=np.int64))
        values[rows, j] = np.asarray(s.values, dtype=np.float64)
        logged[rows, j] = True
    return WideTable(steps, names, values, logged)


def _csv_quote(name: str) -> str:
    """Metric names are free text: quote them the way the csv module would."""
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow([name])
    return out.getvalue()


def history_csv(series: list[Series], nonfinite: Literal["wire", "python"] = "wire") -> str:
    """Wide CSV: one row per step, one column per metric; empty cell = not logged.

    Non-finite values are written as the wire strings (`NaN`, `Infinity`, `-Infinity`, what the
    API's JSON uses) or, with nonfinite="python", as `nan`, `inf`, `-inf` (what `lldmon export`
    writes: float(), numpy and pandas read them back as floats). Built with numpy over the whole
    table (a 10,000-step run with 30 metrics is 300,000 cells).
    """
    header = ",".join(["step", *(_csv_quote(s.name) for s in series)])
    if not series:
        return header + "\n"
    table = wide_table(series)
    values = table.values
    text = values.astype(str).astype(object)  # numpy writes nan, inf, -inf
    if nonfinite == "wire":
        text[np.isnan(values)] = NAN
        text[values == np.inf] = POS_INF
        text[values == -np.inf] = NEG_INF
    text[~table.logged] = ""
    cells = np.column_stack([table.steps.astype(str).astype(object), text])
    return header + "\n" + "\n".join(",".join(row) for row in cells.tolist()) + "\n"

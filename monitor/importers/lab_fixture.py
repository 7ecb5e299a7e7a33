"""lldmon's recorded lab runs (`--format lab-fixture`): the fixtures of `tests/fixtures/lab/*.jsonl.gz`.

A gzip JSONL file (a plain one is read too): a header line `{"format": "lldmon-lab-run/1", "name", "label",
...}`, then one `{"step": s, "metrics": {canonical name: value}}` line per step, ascending, non-finite
values as the strings "NaN", "Infinity", "-Infinity" (the full description is in `lldmon_lab.lab.fixtures`,
which writes them and turns them into labelled runs for the evaluation).

This module is the one reader of the format: `lldmon_lab.lab.fixtures` builds on it, and it depends on
nothing above the importers, so `lldmon import` can read a fixture without the lab or the evaluation. The
metric names are stored as they are (they are canonical names already); the run is named after the
header's `name` unless `--run` says otherwise. A fixture is written by lldmon, so a malformed one is an
error (naming the file and line), not a diagnostic to skip.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from monitor.importers.lldmon_export import VERBATIM
from monitor.importers.parsed import FileColumns, ParsedLog, Paths, as_path_list, merge_columns
from monitor.importers.reading import (
    Diagnostics,
    LogImportError,
    ProgressCallback,
    StepRecords,
    iter_raw_lines,
)

FORMAT: Final = "lldmon-lab-run/1"
SUFFIX: Final = ".jsonl.gz"
_NONFINITE: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class FixtureError(LogImportError):
    """A fixture file or a lab directory that cannot be read; the message names the file."""


@dataclass(frozen=True)
class LabRun:
    """One fixture as read: its header and its per-step metrics (`rows[i]` belongs to `steps[i]`)."""

    header: Mapping[str, Any]
    steps: list[int]
    rows: list[dict[str, float]]


def is_lab_header(obj: object) -> bool:
    """Whether a file's first JSON line is a lab fixture's header."""
    return isinstance(obj, dict) and obj.get("format") == FORMAT


def metric_value(value: Any, where: str) -> float:
    """A metric value of a step line: a number, or a non-finite value as its wire string."""
    if isinstance(value, bool):
        raise FixtureError(f"{where}: a boolean is not a metric value")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        if value in _NONFINITE:
            return _NONFINITE[value]
        try:
            return float(value)
        except ValueError:
            pass
    raise FixtureError(f"{where}: {value!r} is not a number")


def step_line(line: str, where: str) -> tuple[int, dict[str, float]]:
    """One `{"step": s, "metrics": {...}}` line (of a `--metrics-jsonl` file or a fixture): its step and
    its metrics as floats (null values dropped)."""
    try:
        obj = json.loads(line)
        step = int(obj["step"])
        metrics = obj["metrics"]
    except (ValueError, KeyError, TypeError):
        raise FixtureError(f"{where}: not a {{'step', 'metrics'}} line") from None
    if not isinstance(metrics, dict):
        raise FixtureError(f"{where}: not a {{'step', 'metrics'}} line")
    return step, {str(k): metric_value(v, f"{where} {k}") for k, v in metrics.items() if v is not None}


def read_lab_run(path: str | os.PathLike[str], progress: ProgressCallback | None = None) -> LabRun:
    """One fixture file (gzip or plain), its header checked and its steps strictly ascending."""
    try:
        lines = [raw.decode("utf-8") for raw in iter_raw_lines(path, progress) if raw.strip()]
    except (LogImportError, OSError, UnicodeDecodeError) as exc:
        raise FixtureError(f"{os.fspath(path)}: not a {FORMAT} fixture ({exc})") from None
    if not lines:
        raise FixtureError(f"{os.fspath(path)}: empty")
    try:
        header = json.loads(lines[0])
    except ValueError:
        raise FixtureError(f"{os.fspath(path)}:1: the header is not JSON") from None
    if not is_lab_header(header):
        raise FixtureError(f"{os.fspath(path)}:1: not a {FORMAT} header")
    label = header.get("label")
    if not isinstance(label, dict) or not {"collapses", "collapse_step", "rule"} <= set(label):
        raise FixtureError(f"{os.fspath(path)}:1: the header has no label {{collapses, collapse_step, rule}}")
    steps: list[int] = []
    rows: list[dict[str, float]] = []
    for n, line in enumerate(lines[1:], 2):
        step, metrics = step_line(line, f"{os.fspath(path)}:{n}")
        if steps and step <= steps[-1]:
            raise FixtureError(f"{os.fspath(path)}:{n}: step {step} is not after {steps[-1]}")
        steps.append(step)
        rows.append(metrics)
    return LabRun(header=header, steps=steps, rows=rows)


def _columns(run: LabRun, path: str, diagnostics: Diagnostics) -> FileColumns:
    """The fixture's values under their own names (a name the store refuses is reported, as for any log)."""
    records = StepRecords(path, diagnostics, VERBATIM)
    for n, (step, row) in enumerate(zip(run.steps, run.rows, strict=True), 2):
        records.add_row(step, n, row)
    return records.columns()


def load_lab_fixture(
    paths: Paths, *, strict: bool = False, progress: ProgressCallback | None = None
) -> ParsedLog:
    """Columns of recorded lab run(s), a later file winning per step; `run_name` is the headers' `name`
    when they agree on one."""
    diagnostics = Diagnostics(strict)
    files: list[FileColumns] = []
    names: set[str] = set()
    for p in as_path_list(paths):
        run = read_lab_run(p, progress)
        files.append(_columns(run, os.fspath(p), diagnostics))
        name = run.header.get("name")
        if isinstance(name, str) and name.strip():
            names.add(name)
    log = merge_columns(files, diagnostics.items)
    return dataclasses.replace(log, run_name=names.pop() if len(names) == 1 else None)


__all__ = [
    "FORMAT",
    "SUFFIX",
    "FixtureError",
    "LabRun",
    "is_lab_header",
    "load_lab_fixture",
    "metric_value",
    "read_lab_run",
    "step_line",
]

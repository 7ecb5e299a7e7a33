"""The common shape of an imported log, and merging the files of a resumed run."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from monitor.importers.reading import Diagnostic

StepRecords = Mapping[int, Mapping[str, float]]
"""step -> {canonical name: value} as parsed from one file (NaN / inf kept: they are data)."""


@dataclass(frozen=True)
class ParsedLog:
    """Columns of one run: `steps` ascending and unique; `values[name]` aligned with them, NaN where the
    metric was not logged; `present[name]` True where a value was logged (NaN and inf included);
    `diagnostics` the malformed lines met while reading (empty in strict mode: the first one raises);
    `run_name` the name the log gives its run where its format records one (a lab fixture's header), the
    name `lldmon import` uses unless `--run` is given."""

    steps: npt.NDArray[np.int64]
    values: dict[str, npt.NDArray[np.float64]]
    present: dict[str, npt.NDArray[np.bool_]]
    diagnostics: tuple[Diagnostic, ...] = ()
    run_name: str | None = None

    @property
    def n_points(self) -> int:
        """Logged values (what the import writes as rows)."""
        return int(sum(int(p.sum()) for p in self.present.values()))

    def as_tuple(self) -> tuple[npt.NDArray[np.int64], dict[str, npt.NDArray[np.float64]]]:
        return self.steps, self.values

    def __len__(self) -> int:
        return int(self.steps.size)


def merge_records(files: Iterable[StepRecords]) -> dict[int, dict[str, float]]:
    """Merge per-file records in the order given. A step that a later file logs replaces that step of the
    earlier files as a whole (a run resumed from a checkpoint logs the overlapping steps again)."""
    merged: dict[int, dict[str, float]] = {}
    for records in files:
        for step, row in records.items():
            merged[step] = dict(row)
    return merged


def to_columns(
    records: Mapping[int, Mapping[str, float]], diagnostics: Iterable[Diagnostic] = ()
) -> ParsedLog:
    """Step records -> aligned columns."""
    steps = np.array(sorted(records), dtype=np.int64)
    index = {int(s): i for i, s in enumerate(steps)}
    names: list[str] = sorted({name for row in records.values() for name in row})
    values = {name: np.full(steps.size, np.nan, dtype=np.float64) for name in names}
    present = {name: np.zeros(steps.size, dtype=np.bool_) for name in names}
    for step, row in records.items():
        i = index[step]
        for name, value in row.items():
            values[name][i] = value
            present[name][i] = True
    return ParsedLog(steps=steps, values=values, present=present, diagnostics=tuple(diagnostics))


IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class FileColumns:
    """One file's values per canonical name: `series[name] = (steps, values)`, steps ascending and
    unique (the value logged last for a step). 16 bytes a value instead of a dict entry per value, so a
    large log fits in memory."""

    series: dict[str, tuple[IntArray, FloatArray]]

    def steps(self) -> IntArray:
        """Every step with at least one value."""
        if not self.series:
            return np.empty(0, dtype=np.int64)
        return np.unique(np.concatenate([steps for steps, _ in self.series.values()]))

    def to_records(self) -> dict[int, dict[str, float]]:
        """step -> {name: value}, for small files and tests."""
        records: dict[int, dict[str, float]] = {}
        for name, (steps, values) in self.series.items():
            for step, value in zip(steps.tolist(), values.tolist(), strict=True):
                records.setdefault(step, {})[name] = value
        return dict(sorted(records.items()))


def merge_columns(files: Sequence[FileColumns], diagnostics: Iterable[Diagnostic] = ()) -> ParsedLog:
    """`merge_records` on columns: a step that a later file logs replaces that step of the earlier files
    as a whole."""
    later = np.empty(0, dtype=np.int64)
    pieces: dict[str, list[tuple[IntArray, FloatArray]]] = {}
    for file in reversed(files):
        for name, (steps, values) in file.series.items():
            if later.size:
                keep = ~np.isin(steps, later)
                steps, values = steps[keep], values[keep]
            if steps.size:
                pieces.setdefault(name, []).append((steps, values))
        later = np.union1d(later, file.steps())
    all_steps = later.astype(np.int64)
    values_out = {name: np.full(all_steps.size, np.nan, dtype=np.float64) for name in sorted(pieces)}
    present = {name: np.zeros(all_steps.size, dtype=np.bool_) for name in sorted(pieces)}
    for name, parts in pieces.items():
        for steps, values in parts:
            index = np.searchsorted(all_steps, steps)
            values_out[name][index] = values
            present[name][index] = True
    return ParsedLog(steps=all_steps, values=values_out, present=present, diagnostics=tuple(diagnostics))


PathLike = str | os.PathLike[str]
Paths = PathLike | Sequence[PathLike]
"""One log file, or the files of one resumed run in the order they were written."""


def as_path_list(paths: Paths) -> list[PathLike]:
    """One path or a sequence of paths, as a list."""
    if isinstance(paths, (str, os.PathLike)):
        return [paths]
    return list(paths)


def read_text(path: PathLike) -> str:
    """A log file as text; undecodable bytes (binary progress bars, truncated UTF-8) are replaced."""
    with open(path, "rb") as handle:
        return handle.read().decode("utf-8", errors="replace")

"""The common shape of an imported log, and merging the files of a resumed run."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

StepRecords = Mapping[int, Mapping[str, float]]
"""step -> {canonical name: value} as parsed from one file (NaN / inf kept: they are data)."""


@dataclass(frozen=True)
class ParsedLog:
    """Columns of one run: `steps` ascending and unique; `values[name]` aligned with them, NaN where the
    metric was not logged; `present[name]` True where a value was logged (NaN and inf included)."""

    steps: npt.NDArray[np.int64]
    values: dict[str, npt.NDArray[np.float64]]
    present: dict[str, npt.NDArray[np.bool_]]

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


def to_columns(records: Mapping[int, Mapping[str, float]]) -> ParsedLog:
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
    return ParsedLog(steps=steps, values=values, present=present)


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

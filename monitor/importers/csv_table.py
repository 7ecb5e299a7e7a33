"""CSV tables of metrics, one row per logged step: the reader shared by the W&B export (`wandb_csv`) and
generic CSV files (`--format csv`: TensorBoard exports, custom loggers, pandas `to_csv`).

Generic CSV: the step column is the first of `STEP_COLUMNS` in the header (`step`, `_step`,
`global_step`, `train/global_step`, `iteration`); a header without any of them is refused with the columns
it has. The other step columns, columns whose name starts with `_` (W&B bookkeeping such as `_runtime`) and
unnamed columns (the index pandas writes) are not metrics; every other column is one. Names are mapped
through the tracker vocabulary of `contracts.trainer_keys` (`TRACKER`: verl's keys as they are, TRL's under
`train/`), the one the W&B and TensorBoard importers use; a column the contract does not know keeps its own
name. An empty cell is "not logged"; `nan` / `inf` / `-inf` / `Infinity` cells are logged NaN / inf (collapse
signals, kept). A step on several rows is merged (a later row wins per column); for the files of a resumed
run a step a later file logs replaces that step of the earlier ones. Rows with the wrong number of cells,
without a usable step or with a cell that is not a number are reported with their line (W&B media cells,
`{"_type": ...}`, are skipped). Streamed row by row.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator, Sequence
from typing import Final

from contracts.trainer_keys import TRACKER, Family
from monitor.importers.parsed import FileColumns, ParsedLog, Paths
from monitor.importers.reading import (
    Diagnostics,
    LogImportError,
    ProgressCallback,
    StepRecords,
    iter_raw_lines,
    load_files,
    name_problem,
    parse_step,
    short,
)

STEP_COLUMNS: Final = ("step", "_step", "global_step", "train/global_step", "iteration")
"""Step columns of a generic CSV, in order of preference (the first one in the header is the step)."""

StepColumnChooser = Callable[[str, list[str]], str]
"""(path, header) -> the step column, or raises `LogImportError` naming the columns seen."""
IsMetric = Callable[[str], bool]
"""Whether a (named, non-step) column holds a metric."""


def _decoded_lines(path: str, progress: ProgressCallback | None) -> Iterator[str]:
    for number, raw in enumerate(iter_raw_lines(path, progress)):
        yield raw.decode("utf-8-sig" if number == 0 else "utf-8", errors="replace")


def _is_media(cell: str) -> bool:
    return cell.startswith("{") and '"_type"' in cell


def read_csv_table(
    path: str,
    diagnostics: Diagnostics,
    progress: ProgressCallback | None,
    *,
    choose_step: StepColumnChooser,
    not_metrics: Sequence[str],
    is_metric: IsMetric,
    family: Family = TRACKER,
) -> FileColumns:
    """Step records (canonical names, `family`'s vocabulary) of one CSV table. `not_metrics`: column
    names that are never metrics (the step columns); `is_metric` filters the others."""
    reader = csv.reader(_decoded_lines(path, progress))
    try:
        header = next(reader)
    except StopIteration:
        raise LogImportError(f"{path}: empty file, expected a header with a step column") from None
    except csv.Error as exc:
        raise LogImportError(f"{path}:1: unreadable CSV header: {exc}") from None
    header = [name.strip() for name in header]
    step_column = choose_step(path, header)
    step_index = header.index(step_column)
    metrics = [
        (i, name)
        for i, name in enumerate(header)
        if name and name != step_column and name not in not_metrics and is_metric(name)
    ]
    for problem in filter(None, (name_problem(name) for _, name in metrics)):  # once, not on every row
        diagnostics.report(path, 1, problem)
    metrics = [(i, name) for i, name in metrics if name_problem(name) is None]
    records = StepRecords(path, diagnostics, family)
    line = reader.line_num + 1  # where the next record starts
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            diagnostics.report(path, line, f"unreadable CSV row: {exc}")
            line = reader.line_num + 1
            continue
        start, line = line, reader.line_num + 1
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            diagnostics.report(
                path, start, f"{len(row)} cells, the header has {len(header)} (truncated row?)"
            )
            continue
        cell = row[step_index].strip()
        if not cell:
            diagnostics.report(path, start, f"no step (empty {step_column} cell)")
            continue
        step = parse_step(cell)
        if step is None:
            diagnostics.report(path, start, f"{step_column} is not a non-negative integer: {short(cell)}")
            continue
        for i, name in metrics:
            cell = row[i].strip()
            if not cell or _is_media(cell):
                continue
            records.add_logged(step, start, name, cell)
    return records.columns()


def step_column_of(header: Sequence[str]) -> str | None:
    """The step column of a generic CSV header (the first of `STEP_COLUMNS` present), or None."""
    names = {name.strip() for name in header}
    return next((c for c in STEP_COLUMNS if c in names), None)


def _generic_step(path: str, header: list[str]) -> str:
    found = step_column_of(header)
    if found is None:
        raise LogImportError(
            f"{path}: no step column (one of {', '.join(STEP_COLUMNS)}); columns: {short(header, 200)}"
        )
    return found


def is_metric_column(name: str) -> bool:
    """A named, non-step column is a metric unless it is bookkeeping (`_runtime`, `_timestamp`, ...)."""
    return not name.startswith("_")


def parse_csv_file(
    path: str, diagnostics: Diagnostics, progress: ProgressCallback | None = None
) -> FileColumns:
    """Step records (canonical names) of one generic CSV file (module docstring)."""
    return read_csv_table(
        path,
        diagnostics,
        progress,
        choose_step=_generic_step,
        not_metrics=STEP_COLUMNS,
        is_metric=is_metric_column,
    )


def load_csv(paths: Paths, *, strict: bool = False, progress: ProgressCallback | None = None) -> ParsedLog:
    """Columns of one run from its CSV file(s), in the order written (a later file wins per step)."""
    return load_files(paths, parse_csv_file, strict=strict, progress=progress)


__all__ = ["STEP_COLUMNS", "load_csv", "parse_csv_file", "read_csv_table", "step_column_of"]

"""W&B history exported as CSV (`run.history(...).to_csv()`, `scan_history` rows, the UI's "Export CSV").

One row per `wandb.log` call, one column per key, an empty cell where that call did not log the key.
The step is `_step` (verl passes its training step as W&B's step), or `train/global_step` when present:
transformers' W&B callback logs it with every row and `_step` then only counts `log` calls. Columns whose
name starts with `_` are W&B bookkeeping, not metrics (`_step`, `_runtime`, `_timestamp`, `_wandb...`),
and neither is an unnamed column (the index pandas writes). Names are mapped to canonical ones from verl's
vocabulary or TRL's under `train/`. Cells `nan` / `inf` / `-inf` / `Infinity` are kept as NaN / inf; note
that pandas writes a NaN it holds as an empty cell, which reads as "not logged". Cells holding W&B media or
table references (`{"_type": ...}`) are not scalars and are skipped; any other text is reported with its
line, as are rows with the wrong number of cells and rows without a step. Streamed row by row.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from typing import Final

from contracts.trainer_keys import TRACKER
from monitor.importers.parsed import FileColumns, ParsedLog, Paths
from monitor.importers.reading import (
    PROGRESS_EVERY,
    Diagnostics,
    LogImportError,
    ProgressCallback,
    StepRecords,
    load_files,
    parse_number,
    parse_step,
    short,
)

STEP_COLUMNS: Final = ("train/global_step", "_step")
"""Step columns in order of preference."""


def _decoded_lines(path: str, progress: ProgressCallback | None) -> Iterator[str]:
    pending = 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle):
            pending += len(raw)
            if progress is not None and pending >= PROGRESS_EVERY:
                progress(pending)
                pending = 0
            yield raw.decode("utf-8-sig" if number == 0 else "utf-8", errors="replace")
    if progress is not None and pending:
        progress(pending)


def _is_media(cell: str) -> bool:
    return cell.startswith("{") and '"_type"' in cell


def parse_wandb_csv_file(
    path: str, diagnostics: Diagnostics, progress: ProgressCallback | None = None
) -> FileColumns:
    """Step records (canonical names) of one W&B CSV export."""
    reader = csv.reader(_decoded_lines(path, progress))
    try:
        header = next(reader)
    except StopIteration:
        raise LogImportError(f"{path}: empty file, expected a header with a _step column") from None
    except csv.Error as exc:
        raise LogImportError(f"{path}:1: unreadable CSV header: {exc}") from None
    step_column = next((c for c in STEP_COLUMNS if c in header), None)
    if step_column is None:
        raise LogImportError(
            f"{path}: no _step column (a W&B history export has one); columns: {short(header, 200)}"
        )
    step_index = header.index(step_column)
    metrics = [
        (i, name)
        for i, name in enumerate(header)
        if name and not name.startswith("_") and name not in STEP_COLUMNS
    ]
    records = StepRecords(path, diagnostics, TRACKER)
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
            value = parse_number(cell)
            if value is None:
                diagnostics.report(path, start, f"step {step}: {name} is not a number: {short(cell)}")
                continue
            records.add(step, start, name, value)
    return records.columns()


def load_wandb_csv(
    paths: Paths, *, strict: bool = False, progress: ProgressCallback | None = None
) -> ParsedLog:
    """Columns of one run from its CSV export(s), in order (a later file wins per step)."""
    return load_files(paths, parse_wandb_csv_file, strict=strict, progress=progress)

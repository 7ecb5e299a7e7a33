"""What `lldmon export` writes, read back (`--format lldmon`): a wide table, CSV or Parquet, with a `step`
column and one column per metric.

The metric names are taken as they are: they are stored names already, and the trainer vocabulary the
other importers apply would rename some of them (`critic/score/mean` -> `reward/mean`, `actor/entropy` ->
`entropy/mean`) or re-assemble lldmon's weighted loss metrics. An empty CSV cell or a Parquet null is "not
logged"; NaN and +-inf (CSV `nan`, `inf`, `-inf`; Parquet IEEE floats) are logged values, kept. `auto`
picks this format for any Parquet file (its magic bytes); an export's CSV is also read by the generic
`csv` importer, which gives the same result unless a column has a trainer key's name.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from contracts.trainer_keys import Family
from monitor.importers.csv_table import read_csv_table
from monitor.importers.parsed import FileColumns, FloatArray, IntArray, ParsedLog, Paths
from monitor.importers.reading import (
    MAX_STEP,
    Diagnostics,
    LogImportError,
    ProgressCallback,
    load_files,
    name_problem,
    short,
)

STEP_COLUMN: Final = "step"
PARQUET_MAGIC: Final = b"PAR1"
PARQUET_METADATA_KEY: Final = b"lldmon"
"""Parquet schema metadata key of an export: JSON with the run's id, name and project."""
BATCH_ROWS: Final = 65_536


def _verbatim(row: Mapping[str, object]) -> dict[str, float]:
    return {name: float(value) for name, value in row.items() if isinstance(value, (int, float))}


VERBATIM: Final = Family("lldmon", _verbatim, lambda keys: set())
"""Names as they are: no key depends on another, so `StepRecords` keeps every column under its name."""


def is_parquet(head: bytes) -> bool:
    return head.startswith(PARQUET_MAGIC)


def _export_step(path: str, header: list[str]) -> str:
    if STEP_COLUMN not in header:
        raise LogImportError(
            f"{path}: not an lldmon export: no {STEP_COLUMN!r} column; columns: {short(header, 200)}"
        )
    return STEP_COLUMN


def parse_export_file(
    path: str, diagnostics: Diagnostics, progress: ProgressCallback | None = None
) -> FileColumns:
    """One exported file, CSV or Parquet (told apart by the Parquet magic bytes)."""
    with open(path, "rb") as handle:
        head = handle.read(len(PARQUET_MAGIC))
    if is_parquet(head):
        return _parse_parquet(path, diagnostics, progress)
    return read_csv_table(
        path,
        diagnostics,
        progress,
        choose_step=_export_step,
        not_metrics=(STEP_COLUMN,),
        is_metric=lambda name: True,
        family=VERBATIM,
    )


def load_lldmon_export(
    paths: Paths, *, strict: bool = False, progress: ProgressCallback | None = None
) -> ParsedLog:
    """Columns of one run from its export(s), in the order given (a later file wins per step)."""
    return load_files(paths, parse_export_file, strict=strict, progress=progress)


def _pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise LogImportError(
            "reading Parquet needs pyarrow, which comes with lldmon's formats extra (or: pip install pyarrow)"
        ) from None
    return pa, pq


def _parse_parquet(path: str, diagnostics: Diagnostics, progress: ProgressCallback | None) -> FileColumns:
    """Streamed by record batches; a row without a usable step and a column that is not numeric are
    reported (the row number is the line) and skipped."""
    pa, pq = _pyarrow()
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise LogImportError(f"{path}: not a readable Parquet file: {exc}") from None
    schema = parquet.schema_arrow
    if STEP_COLUMN not in schema.names:
        raise LogImportError(
            f"{path}: not an lldmon export: no {STEP_COLUMN!r} column; columns: {short(schema.names, 200)}"
        )
    step_type = schema.field(STEP_COLUMN).type
    if not (pa.types.is_integer(step_type) or pa.types.is_floating(step_type)):
        raise LogImportError(f"{path}: the {STEP_COLUMN!r} column holds {step_type}, not integers")
    metrics: list[str] = []
    for field in schema:
        if field.name == STEP_COLUMN:
            continue
        problem = name_problem(field.name)
        if problem is None and not (pa.types.is_integer(field.type) or pa.types.is_floating(field.type)):
            problem = f"column {short(field.name)} is not numeric ({field.type}): skipped"
        if problem is not None:
            diagnostics.report(path, 1, problem)
        else:
            metrics.append(field.name)
    size = os.path.getsize(path)
    total_rows = max(parquet.metadata.num_rows, 1)
    pieces: dict[str, list[tuple[IntArray, FloatArray]]] = {name: [] for name in metrics}
    row = 0
    for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=[STEP_COLUMN, *metrics]):
        steps, ok = _steps(batch.column(0), pa)
        for i in np.flatnonzero(~ok).tolist():
            value = batch.column(0)[i].as_py()
            diagnostics.report(
                path, row + i + 1, f"{STEP_COLUMN} is not a non-negative integer: {short(value)}"
            )
        for j, name in enumerate(metrics, start=1):
            column = batch.column(j)
            logged = ok & ~np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
            values = np.asarray(column.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
            if logged.any():
                pieces[name].append((steps[logged], values[logged]))
        row += batch.num_rows
        if progress is not None:
            progress(size * batch.num_rows // total_rows)
    series: dict[str, tuple[IntArray, FloatArray]] = {}
    for name, parts in pieces.items():
        if not parts:
            continue
        steps = np.concatenate([s for s, _ in parts])
        values = np.concatenate([v for _, v in parts])
        order = np.argsort(steps, kind="stable")  # a step on several rows: the later row wins
        steps, values = steps[order], values[order]
        last = np.append(steps[1:] != steps[:-1], True)
        series[name] = (steps[last], values[last])
    return FileColumns(series)


def _steps(column: Any, pa: Any) -> tuple[IntArray, np.ndarray[Any, np.dtype[np.bool_]]]:
    """The step of each row and whether it is usable (an integer, or an integral float, in 0..MAX_STEP)."""
    valid = ~np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
    if pa.types.is_integer(column.type):
        raw = np.asarray(column.fill_null(0).to_numpy(zero_copy_only=False))
        ok = valid & ((raw <= MAX_STEP) if raw.dtype == np.uint64 else (raw >= 0))
        return np.where(ok, raw, 0).astype(np.int64), ok
    if pa.types.is_floating(column.type):
        raw = np.asarray(column.cast(pa.float64()).fill_null(math.nan).to_numpy(zero_copy_only=False))
        with np.errstate(invalid="ignore"):
            ok = valid & np.isfinite(raw) & (raw >= 0) & (raw < 2.0**63) & (np.floor(raw) == raw)
        return np.where(ok, raw, 0).astype(np.int64), ok
    return np.zeros(len(column), dtype=np.int64), np.zeros(len(column), dtype=np.bool_)


__all__ = ["PARQUET_METADATA_KEY", "is_parquet", "load_lldmon_export", "parse_export_file"]

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

from typing import Final

from monitor.importers.csv_table import is_metric_column, read_csv_table
from monitor.importers.parsed import FileColumns, ParsedLog, Paths
from monitor.importers.reading import (
    Diagnostics,
    LogImportError,
    ProgressCallback,
    load_files,
    short,
)

STEP_COLUMNS: Final = ("train/global_step", "_step")
"""Step columns in order of preference."""


def _wandb_step(path: str, header: list[str]) -> str:
    found = next((c for c in STEP_COLUMNS if c in header), None)
    if found is None:
        raise LogImportError(
            f"{path}: no _step column (a W&B history export has one; --format csv reads a CSV with a step, "
            f"global_step or iteration column); columns: {short(header, 200)}"
        )
    return found


def parse_wandb_csv_file(
    path: str, diagnostics: Diagnostics, progress: ProgressCallback | None = None
) -> FileColumns:
    """Step records (canonical names) of one W&B CSV export."""
    return read_csv_table(
        path,
        diagnostics,
        progress,
        choose_step=_wandb_step,
        not_metrics=STEP_COLUMNS,
        is_metric=is_metric_column,
    )


def load_wandb_csv(
    paths: Paths, *, strict: bool = False, progress: ProgressCallback | None = None
) -> ParsedLog:
    """Columns of one run from its CSV export(s), in order (a later file wins per step)."""
    return load_files(paths, parse_wandb_csv_file, strict=strict, progress=progress)

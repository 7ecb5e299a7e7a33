"""One entry point over every format: `load_log(paths, fmt)` -> `ParsedLog`."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from monitor.importers.csv_table import load_csv
from monitor.importers.detect import (
    AUTO,
    BINARY_FORMATS,
    CSV,
    LAB_FIXTURE,
    LLDMON,
    MS_SWIFT,
    TENSORBOARD,
    TRL_LOG,
    TRL_STATE,
    VERL_CONSOLE,
    VERL_JSONL,
    WANDB_CSV,
    resolve_format,
)
from monitor.importers.lab_fixture import load_lab_fixture
from monitor.importers.lldmon_export import load_lldmon_export
from monitor.importers.parsed import ParsedLog
from monitor.importers.reading import GZIP_MAGIC, LogImportError, ProgressCallback, is_gzip
from monitor.importers.swift_jsonl import load_swift_jsonl
from monitor.importers.tensorboard_events import event_files, load_tensorboard
from monitor.importers.trl_state import load_trl_state
from monitor.importers.trl_stdout import load_trl_stdout
from monitor.importers.verl_console import load_verl_console
from monitor.importers.verl_jsonl import load_verl_jsonl
from monitor.importers.wandb_csv import load_wandb_csv

PathList = Sequence[str | os.PathLike[str]]
Loader = Callable[..., ParsedLog]

LOADERS: Final[dict[str, Loader]] = {
    VERL_JSONL: load_verl_jsonl,
    VERL_CONSOLE: load_verl_console,
    TRL_LOG: load_trl_stdout,
    TRL_STATE: load_trl_state,
    WANDB_CSV: load_wandb_csv,
    CSV: load_csv,
    MS_SWIFT: load_swift_jsonl,
    TENSORBOARD: load_tensorboard,
    LLDMON: load_lldmon_export,
    LAB_FIXTURE: load_lab_fixture,
}


def input_files(paths: PathList, fmt: str) -> list[str]:
    """The files a load reads (directories expanded), e.g. to size a progress bar."""
    files: list[str] = []
    for path in paths:
        p = Path(path)
        if fmt == TENSORBOARD:
            files += event_files(p)
        elif fmt == TRL_STATE and p.is_dir():
            files.append(os.fspath(p / "trainer_state.json"))
        else:
            files.append(os.fspath(p))
    return files


def load_log(
    paths: PathList,
    fmt: str = AUTO,
    *,
    strict: bool = False,
    progress: ProgressCallback | None = None,
    first_step: int | Sequence[int] | None = None,
) -> ParsedLog:
    """Columns of one run from its files in the order written (a later file wins per step).

    `first_step` is for `trl-log` only (TRL prints dicts without a step): the step of each file's first
    dict. Raises `LogImportError` for a file that cannot be read at all and, with `strict`, `MalformedLog`
    at the first malformed line.
    """
    resolved = resolve_format(list(paths), fmt)
    for path in paths:
        if not Path(path).exists():
            raise LogImportError(f"{os.fspath(path)}: no such file or directory")
    for file in input_files(paths, resolved):
        if not Path(file).is_file():
            raise LogImportError(f"{file}: not a file")
        if resolved in BINARY_FORMATS and _is_gzip_file(file):
            raise LogImportError(
                f"{file}: gzip-compressed, but {resolved} files are read as they are written: gunzip it first "
                "(gzip is read transparently for the text formats)"
            )
    if first_step is not None and resolved != TRL_LOG:
        raise LogImportError(f"a first step is only needed for trl-log (TRL stdout), not {resolved}")
    if resolved == TRL_LOG and first_step is not None:
        return load_trl_stdout(list(paths), first_step, strict=strict, progress=progress)
    return LOADERS[resolved](list(paths), strict=strict, progress=progress)


def _is_gzip_file(path: str) -> bool:
    with open(path, "rb") as handle:
        return is_gzip(handle.read(len(GZIP_MAGIC)))

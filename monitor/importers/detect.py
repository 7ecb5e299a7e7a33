"""`--format auto`: tell a log's format from its name, then from its first lines.

A gzip file (its magic bytes, whatever its name) is told by its decompressed content and by its name
without `.gz`; every text format is read through the gzip layer (`reading.LogFile`).

Order of evidence: a directory or a `*tfevents*` name is TensorBoard; a Parquet file (its magic bytes) is
lldmon (`lldmon export`'s table, `lldmon_export.py`); a first line that is a lab fixture's header
(`{"format": "lldmon-lab-run/1", ...}`) is lab-fixture; `trainer_state.json`, or any JSON
whose head has `"log_history"`, is trl-state; a `.jsonl` / `.ndjson` name or a first line that is a JSON
object is ms-swift when that object has ms-swift's step (`"global_step/max_steps": "12/500"`, Megatron's
`"iteration"`, old ms-swift's `"global_step"`) and no "step", else verl-jsonl (a first line without a
`.jsonl` name must then have a "step"); a `.csv` name or a first line that is a CSV header is wandb-csv when
the header names `_step` (a W&B history export), else csv (for a header without `.csv` name: one naming a
step column of `csv_table.STEP_COLUMNS`). Other text is read, up to `SNIFF_BYTES`, until the first verl
metrics line (`step:N - key:value`) or the first TRL log dict (`{'loss': ..., 'epoch': ...}`).
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from monitor.importers.csv_table import step_column_of
from monitor.importers.lab_fixture import is_lab_header
from monitor.importers.lldmon_export import is_parquet
from monitor.importers.reading import LogFile, LogImportError
from monitor.importers.swift_jsonl import is_swift_object
from monitor.importers.tensorboard_events import EVENT_FILE_MARKER, event_files

VERL_JSONL: Final = "verl-jsonl"
VERL_CONSOLE: Final = "verl-console"
TRL_LOG: Final = "trl-log"
TRL_STATE: Final = "trl-state"
WANDB_CSV: Final = "wandb-csv"
CSV: Final = "csv"
MS_SWIFT: Final = "ms-swift"
TENSORBOARD: Final = "tensorboard"
LLDMON: Final = "lldmon"
LAB_FIXTURE: Final = "lab-fixture"
FORMATS: Final = (
    VERL_JSONL,
    VERL_CONSOLE,
    TRL_LOG,
    TRL_STATE,
    WANDB_CSV,
    CSV,
    MS_SWIFT,
    TENSORBOARD,
    LLDMON,
    LAB_FIXTURE,
)
BINARY_FORMATS: Final = (TENSORBOARD, LLDMON)
"""Formats read by their own binary readers, so never through the gzip layer."""
NAMING_FORMATS: Final = (LAB_FIXTURE,)
"""Formats whose files record their run's name (`ParsedLog.run_name`), so `--run` may be left out."""
AUTO: Final = "auto"

SNIFF_BYTES: Final = 64 << 20
"""How far into a text log to look for the first metrics line (model loading can print a lot first)."""
HEAD_BYTES: Final = 64 << 10

_ANSI: Final = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_VERL_LINE: Final = re.compile(r"(?:^|\)\s*|\r)step:\d+\s+-\s+[^:\s]+:")
_TRL_DICT: Final = re.compile(r"\{'[^{}']+':\s*[-+0-9.naif][^{}]*\}")


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format of one log file or directory; a clear error when it cannot be told."""
    p = Path(path)
    if not p.exists():
        raise LogImportError(f"{p}: no such file or directory")
    if p.is_dir():
        if (p / "trainer_state.json").is_file():
            return TRL_STATE
        if event_files(p):
            return TENSORBOARD
        raise LogImportError(f"{p} is a directory without TensorBoard event files or trainer_state.json")
    name = p.name.lower()
    if EVENT_FILE_MARKER in name:
        return TENSORBOARD
    with LogFile(p) as log:
        head = log.read(HEAD_BYTES)
        compressed = log.gzip
    if compressed:
        name = name.removesuffix(".gz")
    elif is_parquet(head):
        return LLDMON
    if name == "trainer_state.json" or (name.endswith(".json") and b'"log_history"' in head):
        return TRL_STATE
    first = next((ln for ln in head.decode("utf-8", "replace").split("\n") if ln.strip()), "").strip()
    obj = _json_object(first) if first.startswith("{") else None
    if is_lab_header(obj):
        return LAB_FIXTURE
    if name.endswith((".jsonl", ".ndjson")):
        return MS_SWIFT if is_swift_object(obj) else VERL_JSONL
    if is_swift_object(obj):
        return MS_SWIFT
    if isinstance(obj, dict) and "step" in obj:
        return VERL_JSONL
    header = _csv_header(first)
    if name.endswith(".csv"):
        return WANDB_CSV if "_step" in header else CSV
    if "_step" in header:
        return WANDB_CSV
    if len(header) > 1 and step_column_of(header) is not None:
        return CSV
    if b'"log_history"' in head:
        return TRL_STATE
    found = _sniff_text(p)
    if found is None:
        what = f"{p} (gzip-compressed; its decompressed content was read)" if compressed else str(p)
        raise LogImportError(
            f"cannot tell the format of {what}: no verl `step:N - key:value` line or TRL log dict in its "
            f"first {SNIFF_BYTES >> 20} MiB; pass --format ({', '.join(FORMATS)})"
        )
    return found


def _json_object(line: str) -> object:
    """The JSON value of a line, or None if it is not JSON."""
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


def _csv_header(line: str) -> list[str]:
    """The cells of a first line read as a CSV header (quotes and the BOM removed)."""
    try:
        cells = next(csv.reader([line.lstrip("\ufeff")]), [])
    except csv.Error:
        return []
    return [cell.strip() for cell in cells]


def _sniff_text(path: Path) -> str | None:
    """verl console as soon as a verl metrics line shows up, TRL stdout as soon as a dict with `'epoch'`
    does (`Trainer.log` adds it to every dict). Other dicts are weaker evidence: verl prints its config as
    Python dicts before the first step, so they only decide when nothing else is found."""
    read = 0
    dicts = False
    with LogFile(path) as handle:
        for raw in handle:
            read += len(raw)
            text = _ANSI.sub("", raw.decode("utf-8", "replace"))
            if _VERL_LINE.search(text):
                return VERL_CONSOLE
            for match in _TRL_DICT.finditer(text):
                if "'epoch':" in match.group(0):
                    return TRL_LOG
                dicts = True
            if read >= SNIFF_BYTES:
                break
    return TRL_LOG if dicts else None


def resolve_format(paths: Sequence[str | os.PathLike[str]], fmt: str = AUTO) -> str:
    """The one format of the files of a run: `fmt` itself, or what every path is detected as."""
    if fmt != AUTO:
        if fmt not in FORMATS:
            raise LogImportError(f"unknown format {fmt!r}; one of {AUTO}, {', '.join(FORMATS)}")
        return fmt
    if not paths:
        raise LogImportError("no files to import")
    found = {os.fspath(p): detect_format(p) for p in paths}
    kinds = set(found.values())
    if len(kinds) > 1:
        detail = ", ".join(f"{p}: {k}" for p, k in found.items())
        raise LogImportError(f"the files of one run must have one format, found {detail}; pass --format")
    return kinds.pop()

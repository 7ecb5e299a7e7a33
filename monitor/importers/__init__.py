"""Importers of trainer logs into canonical metric columns (`lldmon import`).

One module per format (verl console and `file` JSONL, TRL stdout and trainer_state.json, W&B CSV,
generic CSV with a step column, ms-swift `logging.jsonl`, TensorBoard, lldmon's own export, lldmon's
recorded lab runs), all returning a `ParsedLog`:
aligned columns, where each value was logged (so a logged NaN grad norm is told apart from a missing one),
and the malformed lines met (file, line, reason).
`load_log(paths, fmt)` picks the format (`detect.py` for `auto`); `read_*` return `(steps, values)`.
A gzip-compressed text log is read as it is (`reading.LogFile`), with or without `--format`.
"""

from monitor.importers.csv_table import load_csv
from monitor.importers.detect import AUTO, FORMATS, LAB_FIXTURE, NAMING_FORMATS, detect_format, resolve_format
from monitor.importers.lab_fixture import load_lab_fixture
from monitor.importers.lldmon_export import load_lldmon_export
from monitor.importers.names import TRL_NAMES, VERL_NAMES
from monitor.importers.parsed import ParsedLog, merge_records, to_columns
from monitor.importers.reading import Diagnostic, Diagnostics, LogImportError, MalformedLog, ProgressCallback
from monitor.importers.registry import input_files, load_log
from monitor.importers.swift_jsonl import load_swift_jsonl
from monitor.importers.tensorboard_events import load_tensorboard
from monitor.importers.trl_state import load_trl_state
from monitor.importers.trl_stdout import load_trl_stdout, parse_trl_stdout, read_trl_stdout
from monitor.importers.verl_console import load_verl_console, parse_verl_console, read_verl_console
from monitor.importers.verl_jsonl import load_verl_jsonl
from monitor.importers.wandb_csv import load_wandb_csv

__all__ = [
    "AUTO",
    "FORMATS",
    "LAB_FIXTURE",
    "NAMING_FORMATS",
    "TRL_NAMES",
    "VERL_NAMES",
    "Diagnostic",
    "Diagnostics",
    "LogImportError",
    "MalformedLog",
    "ParsedLog",
    "ProgressCallback",
    "detect_format",
    "input_files",
    "load_csv",
    "load_lab_fixture",
    "load_lldmon_export",
    "load_log",
    "load_swift_jsonl",
    "load_tensorboard",
    "load_trl_state",
    "load_trl_stdout",
    "load_verl_console",
    "load_verl_jsonl",
    "load_wandb_csv",
    "merge_records",
    "parse_trl_stdout",
    "parse_verl_console",
    "read_trl_stdout",
    "read_verl_console",
    "resolve_format",
    "to_columns",
]

"""verl console logs: `step:N - key:value - key:value ...` lines.

Lines may carry ANSI colour codes and Ray actor prefixes such as `\\x1b[36m(TaskRunner pid=7283)\\x1b[0m`;
everything else in the file (config dumps, warnings, tracebacks) is skipped: it is not a metrics line.
Inside a metrics line, a pair without `key:value` shape or a value that is not a number is reported as
malformed (file, line). Values printed as numpy scalars (`np.float64(0.4)`, `np.int32(3)`: verl >= 0.5
under numpy 2) are read as their number. A step printed on several lines (verl prints validation scores on
their own line) is merged; NaN / inf values are kept as data.

W&B's console capture (`files/output.log`) cuts lines at `WANDB_LINE_LIMIT` characters: in a metrics line
of exactly that length the last pair may be cut off, so it is dropped (reported once per line) and the
keys that did not fit are missing at that step, not zero.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

import numpy as np
import numpy.typing as npt

from contracts.trainer_keys import VERL
from monitor.importers.parsed import FileColumns, ParsedLog, Paths
from monitor.importers.reading import (
    Diagnostics,
    Line,
    ProgressCallback,
    StepRecords,
    iter_lines,
    load_files,
    parse_number,
    short,
    text_lines,
)

_ANSI: Final = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_RAY_PREFIX: Final = re.compile(r"^\s*\([^()]*pid=\d+[^()]*\)\s*")
_STEP_LINE: Final = re.compile(r"^step:(\d+)\s+-\s+(.*)$")
_NUMPY_SCALAR: Final = re.compile(r"^(?:np|numpy)\.(?:float|int|uint|bool_?)\d*\((.*)\)$")
WANDB_LINE_LIMIT: Final = 4096
"""W&B's console capture cuts longer lines to this many characters."""


def parse_value(raw: str) -> float | None:
    """A printed metric value as a float: a number, nan/inf, or a numpy scalar repr (`np.float64(0.4)`)."""
    text = raw.strip()
    match = _NUMPY_SCALAR.match(text)
    return parse_number(match.group(1) if match else text)


def _split_step_line(segment: str) -> tuple[int, list[str]] | None:
    """(step, raw `key:value` pairs) of a metrics line, or None if it is not one."""
    clean = _RAY_PREFIX.sub("", _ANSI.sub("", segment)).strip()
    match = _STEP_LINE.match(clean)
    if match is None:
        return None
    return int(match.group(1)), [pair.strip() for pair in match.group(2).split(" - ")]


def parse_verl_line(line: str) -> tuple[int, dict[str, float]] | None:
    """(step, {raw name: value}) of one console line, or None if it is not a metrics line; pairs that
    are not `key:number` are left out (`parse_verl_console` reports them)."""
    parsed = _split_step_line(line)
    if parsed is None:
        return None
    step, pairs = parsed
    row: dict[str, float] = {}
    for pair in pairs:
        name, sep, raw = pair.rpartition(":")
        value = parse_value(raw)
        if sep and name and value is not None:
            row[name] = value
    return step, row


def parse_verl_lines(lines: Iterable[Line], path: str, diagnostics: Diagnostics) -> FileColumns:
    """Step records (canonical names) of one console log."""
    records = StepRecords(path, diagnostics, VERL)
    for line in lines:
        if "step:" not in line.text:
            continue
        segments = line.text.split("\r")  # progress bars redraw with carriage returns
        cut = len(line.text) == WANDB_LINE_LIMIT
        for k, segment in enumerate(segments):
            parsed = _split_step_line(segment)
            if parsed is None:
                continue
            step, pairs = parsed
            if cut and k == len(segments) - 1 and pairs:
                diagnostics.report(
                    path,
                    line.number,
                    f"step {step}: line cut at {WANDB_LINE_LIMIT} characters (W&B console capture): "
                    f"last pair {short(pairs[-1], 40)} dropped, later keys missing",
                )
                pairs = pairs[:-1]
            for pair in pairs:
                name, sep, raw = pair.rpartition(":")
                if not sep or not name:
                    diagnostics.report(
                        path, line.number, line.reason(f"step {step}: {short(pair)} is not key:value")
                    )
                    continue
                value = parse_value(raw)
                if value is None:
                    diagnostics.report(
                        path, line.number, line.reason(f"step {step}: {name} is not a number: {short(raw)}")
                    )
                    continue
                records.add(step, line.number, name, value)
    return records.columns()


def parse_verl_console(
    text: str, diagnostics: Diagnostics | None = None, path: str = "<text>"
) -> dict[int, dict[str, float]]:
    """Step records (canonical names) of a console log already in memory."""
    lines = text_lines(text)
    return parse_verl_lines(
        lines, path, diagnostics if diagnostics is not None else Diagnostics()
    ).to_records()


def parse_verl_console_file(
    path: str, diagnostics: Diagnostics, progress: ProgressCallback | None = None
) -> FileColumns:
    """Step records of one console log, streamed line by line."""
    return parse_verl_lines(iter_lines(path, progress), path, diagnostics)


def load_verl_console(
    paths: Paths, *, strict: bool = False, progress: ProgressCallback | None = None
) -> ParsedLog:
    """Columns of one run from its console log(s); for a resumed run pass the files in order (a step
    logged by a later file replaces the earlier file's step)."""
    return load_files(paths, parse_verl_console_file, strict=strict, progress=progress)


def read_verl_console(
    paths: Paths,
) -> tuple[npt.NDArray[np.int64], dict[str, npt.NDArray[np.float64]]]:
    """(steps, {canonical name: values}) with NaN where a metric was not logged."""
    return load_verl_console(paths).as_tuple()


__all__ = [
    "load_verl_console",
    "parse_value",
    "parse_verl_console",
    "parse_verl_console_file",
    "parse_verl_line",
    "read_verl_console",
]

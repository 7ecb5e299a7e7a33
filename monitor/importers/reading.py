"""Plumbing shared by the importers: streamed lines with byte progress, diagnostics of malformed input,
value and step parsing, and the per-file step records every format fills.

Every text format is read through `LogFile`, which gunzips a gzip-compressed file (told by its magic
bytes, whatever its name) on the fly: `lldmon import run.jsonl.gz` needs no separate `gunzip`.

A malformed line or record is never skipped silently: it becomes a `Diagnostic` (file, line, reason) and
the import goes on; in strict mode the first one raises `MalformedLog`, before anything is written.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import BinaryIO, Final, cast

import numpy as np

from contracts.metrics import metric_name_problem
from contracts.trainer_keys import Family
from monitor.importers.parsed import (
    FileColumns,
    FloatArray,
    IntArray,
    ParsedLog,
    Paths,
    as_path_list,
    merge_columns,
)

ProgressCallback = Callable[[int], None]
"""Called with the number of bytes read since the previous call (to advance a progress bar)."""

PROGRESS_EVERY: Final = 1 << 20
"""Bytes between two progress calls: per-line calls would cost more than the parsing."""

MAX_STEP: Final = 2**63 - 1

GZIP_MAGIC: Final = b"\x1f\x8b"


class LogImportError(ValueError):
    """A log that cannot be imported at all (unknown format, missing step column, no such file)."""


@dataclass(frozen=True)
class Diagnostic:
    """A malformed line or record. `line` is 1-based (a record number for binary event files)."""

    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


class MalformedLog(LogImportError):
    """Strict mode: the first malformed line or record."""

    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(str(diagnostic))
        self.diagnostic = diagnostic


class Diagnostics:
    """The diagnostics of one import, in the order found; strict mode raises on the first."""

    def __init__(self, strict: bool = False) -> None:
        self.strict = strict
        self.items: list[Diagnostic] = []

    def report(self, path: str, line: int, reason: str) -> None:
        diagnostic = Diagnostic(path, line, reason)
        if self.strict:
            raise MalformedLog(diagnostic)
        self.items.append(diagnostic)


@dataclass(frozen=True)
class Line:
    number: int
    text: str
    complete: bool
    """False for a last line without a newline: possibly cut off while the trainer was writing."""

    def reason(self, text: str) -> str:
        """A diagnostic text that says when the line may have been cut off."""
        return text if self.complete else f"{text} (last line has no newline: truncated?)"


def is_gzip(head: bytes) -> bool:
    """Whether a file's first bytes are gzip's magic number (the name is no evidence either way)."""
    return head.startswith(GZIP_MAGIC)


class LogFile:
    """A log file opened for reading its content: the bytes themselves, or decompressed ones when the file
    is gzip. `consumed()` counts the bytes of the file on disk read so far, so that a progress bar sized by
    the file's size ends at its size for a compressed file too. A damaged or truncated gzip stream raises
    `LogImportError` naming the file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._raw = open(path, "rb")  # noqa: SIM115  # closed by close()
        try:
            self.gzip = is_gzip(self._raw.read(len(GZIP_MAGIC)))
            self._raw.seek(0)
        except BaseException:
            self._raw.close()
            raise
        self._stream = cast(BinaryIO, gzip.GzipFile(fileobj=self._raw, mode="rb") if self.gzip else self._raw)

    def __enter__(self) -> LogFile:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._raw.close()

    def consumed(self) -> int:
        return self._raw.tell()

    def read(self, size: int = -1) -> bytes:
        try:
            return self._stream.read(size)
        except (OSError, EOFError, zlib.error) as exc:
            raise self._damaged(exc) from None

    def __iter__(self) -> Iterator[bytes]:
        """The raw lines, each with its line ending."""
        try:
            yield from self._stream
        except (OSError, EOFError, zlib.error) as exc:
            raise self._damaged(exc) from None

    def _damaged(self, exc: BaseException) -> LogImportError:
        if self.gzip:
            return LogImportError(f"{self.path}: damaged gzip file: {exc}")
        return LogImportError(f"{self.path}: cannot read: {exc}")


def iter_raw_lines(path: str | os.PathLike[str], progress: ProgressCallback | None = None) -> Iterator[bytes]:
    """The raw lines of a file (decompressed if gzip) one by one, never the whole file in memory; progress
    in bytes of the file on disk."""
    done = 0
    pending = 0
    with LogFile(path) as log:
        for raw in log:
            pending += len(raw)
            if progress is not None and pending >= PROGRESS_EVERY:
                position = log.consumed()
                if position > done:
                    progress(position - done)
                    done = position
                pending = 0
            yield raw
        if progress is not None and log.consumed() > done:
            progress(log.consumed() - done)


def iter_lines(path: str | os.PathLike[str], progress: ProgressCallback | None = None) -> Iterator[Line]:
    """The lines of a file one by one (never the whole file in memory; gzip decompressed), decoded as UTF-8
    with undecodable bytes replaced (binary progress bars, truncated multi-byte characters)."""
    for number, raw in enumerate(iter_raw_lines(path, progress), start=1):
        yield Line(number, raw.decode("utf-8", errors="replace").rstrip("\r\n"), raw.endswith(b"\n"))


def read_log_bytes(path: str | os.PathLike[str], progress: ProgressCallback | None = None) -> bytes:
    """A whole (small) log file's content, decompressed if gzip."""
    with LogFile(path) as log:
        data = log.read()
        if progress is not None:
            progress(log.consumed())
    return data


def iter_json_objects(
    path: str, diagnostics: Diagnostics, progress: ProgressCallback | None = None
) -> Iterator[tuple[Line, dict[str, object]]]:
    """The JSON-object lines of a JSON-per-line log with their line, blank lines skipped; a line that is not
    valid JSON or not an object is reported to `diagnostics` with its number and skipped."""
    return json_objects(iter_lines(path, progress), path, diagnostics)


def json_objects(
    lines: Iterable[Line], path: str, diagnostics: Diagnostics
) -> Iterator[tuple[Line, dict[str, object]]]:
    """`iter_json_objects` over lines read elsewhere (`lldmon watch` reads a growing file itself)."""
    for line in lines:
        if not line.text.strip():
            continue
        try:
            obj = json.loads(line.text)
        except json.JSONDecodeError as exc:
            diagnostics.report(
                path, line.number, line.reason(f"invalid JSON at column {exc.colno}: {exc.msg}")
            )
            continue
        except (ValueError, RecursionError) as exc:
            diagnostics.report(path, line.number, f"invalid JSON: {short(str(exc))}")
            continue
        if not isinstance(obj, dict):
            diagnostics.report(path, line.number, f"not a JSON object: {short(obj)}")
            continue
        yield line, obj


def text_lines(text: str) -> Iterator[Line]:
    """`iter_lines` for text already in memory (same numbering: only newlines end a line)."""
    parts = text.split("\n")
    for i, part in enumerate(parts, start=1):
        yield Line(i, part.rstrip("\r"), i < len(parts))


def parse_number(value: object) -> float | None:
    """A logged value as a float (NaN and +-inf kept, also as the strings nan/inf/-inf/Infinity);
    None if it is not a number (booleans, lists, text)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return value
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return None
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def parse_step(value: object) -> int | None:
    """A step: a non-negative integer (an integral float such as 10.0 or the text "10" too)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        value = int(text) if text.isascii() and text.isdigit() else parse_number(text)
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            return None
        value = int(value)
    if isinstance(value, int) and 0 <= value <= MAX_STEP:
        return value
    return None


def short(value: object, limit: int = 60) -> str:
    """repr() of a bad value, cut to fit a one-line diagnostic."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def name_problem(name: str) -> str | None:
    """Why a metric name cannot be stored (`contracts.metrics.metric_name_problem`, the ingest API's
    rule), with the name escaped by repr(), or None."""
    problem = metric_name_problem(name)
    if problem is None or not name:
        return problem
    return f"{problem}: {short(name)}"


class StepRecords:
    """The values of one file per trainer key, appended to flat arrays as they are read, and put under
    canonical names at the end by the trainer family's contract (`contracts.trainer_keys`), the one the
    live adapters use too.

    A step logged on several lines is merged first (the later line wins per key), then mapped as one
    dict, so precedence between keys of one step (verl's `actor/entropy` over `actor/entropy_loss`) and
    derived metrics (TRL's valid searches, lldmon's re-assembled verl loss metrics) are the adapters'.
    Keys the contract maps on their own (`Family.row_keys`: most of them) are mapped column-wise; only the
    others go through `Family.canonical` step by step. A step exists only once a value was added, so a
    later file's empty line cannot wipe a step.
    """

    def __init__(self, path: str, diagnostics: Diagnostics, family: Family) -> None:
        self.path = path
        self.diagnostics = diagnostics
        self.family = family
        self._columns: dict[str, _RawColumn] = {}
        self._problems: dict[str, str] = {}
        self._seq = 0

    def add(self, step: int, line: int, raw_name: str, value: float) -> None:
        column = self._columns.get(raw_name)
        if column is None:
            if raw_name in self._problems:
                self.diagnostics.report(self.path, line, self._problems[raw_name])
                return
            problem = name_problem(raw_name)
            if problem is not None:
                self._problems[raw_name] = problem
                self.diagnostics.report(self.path, line, problem)
                return
            column = self._columns[raw_name] = _RawColumn()
        column.steps.append(step)
        column.values.append(value)
        column.seq.append(self._seq)
        self._seq += 1

    def add_logged(self, step: int, line: int, raw_name: str, value: object) -> None:
        """A value as the log wrote it: a number (NaN and inf kept, also as text) is added; anything else is
        reported with its step and name and skipped."""
        number = parse_number(value)
        if number is None:
            self.diagnostics.report(
                self.path, line, f"step {step}: {raw_name} is not a number: {short(value)}"
            )
            return
        self.add(step, line, raw_name, number)

    def add_row(self, step: int, line: int, row: Mapping[str, float]) -> None:
        for raw_name, value in row.items():
            self.add(step, line, raw_name, value)

    def columns(self) -> FileColumns:
        raw: dict[str, tuple[IntArray, FloatArray]] = {}
        for key, column in self._columns.items():
            steps = np.frombuffer(column.steps, dtype=np.int64)
            values = np.frombuffer(column.values, dtype=np.float64)
            seq = np.frombuffer(column.seq, dtype=np.int64)
            order = np.lexsort((seq, steps))  # by step, then logged last
            steps, values = steps[order], values[order]
            last = np.append(steps[1:] != steps[:-1], True)
            raw[key] = (steps[last], values[last])
        row_keys = self.family.row_keys(raw)
        series = {key: columns for key, columns in raw.items() if key not in row_keys}
        if row_keys:
            rows: dict[int, dict[str, float]] = {}
            for key in row_keys:
                steps, values = raw[key]
                for step, value in zip(steps.tolist(), values.tolist(), strict=True):
                    rows.setdefault(step, {})[key] = value
            out: dict[str, tuple[list[int], list[float]]] = {}
            for step in sorted(rows):
                for name, value in self.family.canonical(rows[step]).items():
                    steps_out, values_out = out.setdefault(name, ([], []))
                    steps_out.append(step)
                    values_out.append(value)
            for name, (steps_out, values_out) in out.items():
                series[name] = (np.array(steps_out, dtype=np.int64), np.array(values_out, dtype=np.float64))
        return FileColumns(series)

    @property
    def records(self) -> dict[int, dict[str, float]]:
        """step -> {canonical name: value} (small files and tests)."""
        return self.columns().to_records()


class _RawColumn:
    """What one trainer key logged in one file, in the order read."""

    __slots__ = ("seq", "steps", "values")

    def __init__(self) -> None:
        self.steps = array("q")
        self.values = array("d")
        self.seq = array("q")


FileParser = Callable[[str, Diagnostics, "ProgressCallback | None"], FileColumns]
"""Reads one file: (path, diagnostics, progress) -> its values under canonical names."""


def load_files(
    paths: Paths, parse_file: FileParser, *, strict: bool = False, progress: ProgressCallback | None = None
) -> ParsedLog:
    """Columns of one run from its file(s) in the order written: a step a later file logs replaces that
    step of the earlier files (a run resumed from a checkpoint logs the overlapping steps again)."""
    diagnostics = Diagnostics(strict)
    files = [parse_file(os.fspath(p), diagnostics, progress) for p in as_path_list(paths)]
    return merge_columns(files, diagnostics.items)

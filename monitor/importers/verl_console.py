"""verl console logs: `step:N - key:value - key:value ...` lines.

Lines may carry ANSI colour codes and Ray actor prefixes such as `\\x1b[36m(TaskRunner pid=7283)\\x1b[0m`;
everything else in the file (config dumps, warnings, tracebacks) is skipped. A step printed on several
lines (verl prints validation scores on their own line) is merged; NaN / inf values are kept as data.
"""

from __future__ import annotations

import re
from typing import Final

import numpy as np
import numpy.typing as npt

from monitor.importers.names import VERL_NAMES, VERL_PREFERRED, canonical_name
from monitor.importers.parsed import ParsedLog, Paths, as_path_list, merge_records, read_text, to_columns

_ANSI: Final = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_RAY_PREFIX: Final = re.compile(r"^\s*\([^()]*pid=\d+[^()]*\)\s*")
_STEP_LINE: Final = re.compile(r"^step:(\d+)\s+-\s+(.*)$")


def _parse_value(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def parse_verl_line(line: str) -> tuple[int, dict[str, float]] | None:
    """(step, {raw name: value}) of one console line, or None if it is not a metrics line."""
    clean = _RAY_PREFIX.sub("", _ANSI.sub("", line)).strip()
    match = _STEP_LINE.match(clean)
    if match is None:
        return None
    row: dict[str, float] = {}
    for pair in match.group(2).split(" - "):
        name, sep, raw = pair.strip().rpartition(":")
        if not sep or not name:
            continue
        value = _parse_value(raw)
        if value is not None:
            row[name] = value
    return int(match.group(1)), row


def parse_verl_console(text: str) -> dict[int, dict[str, float]]:
    """Step records (canonical names) of one console log."""
    records: dict[int, dict[str, float]] = {}
    sources: dict[int, dict[str, str]] = {}
    for line in text.splitlines():
        parsed = parse_verl_line(line)
        if parsed is None:
            continue
        step, raw_row = parsed
        row = records.setdefault(step, {})
        origin = sources.setdefault(step, {})
        for raw_name, value in raw_row.items():
            name = canonical_name(raw_name, VERL_NAMES)
            previous = origin.get(name)
            if (
                previous is not None
                and previous != raw_name
                and previous in VERL_PREFERRED
                and raw_name not in VERL_PREFERRED
            ):
                continue  # e.g. keep `actor/entropy` over the older `actor/entropy_loss`
            row[name] = value
            origin[name] = raw_name
    return records


def load_verl_console(paths: Paths) -> ParsedLog:
    """Columns of one run from its console log(s); for a resumed run pass the files in order (a step
    logged by a later file replaces the earlier file's step)."""
    return to_columns(merge_records(parse_verl_console(read_text(p)) for p in as_path_list(paths)))


def read_verl_console(
    paths: Paths,
) -> tuple[npt.NDArray[np.int64], dict[str, npt.NDArray[np.float64]]]:
    """(steps, {canonical name: values}) with NaN where a metric was not logged."""
    return load_verl_console(paths).as_tuple()


__all__ = ["load_verl_console", "parse_verl_console", "parse_verl_line", "read_verl_console"]

"""TRL / transformers `trainer_state.json`: the `log_history` list of a checkpoint or output directory.

Each entry is one `Trainer.log` call with its `step` (`{"loss": 0.13, "reward": 1.06, ..., "epoch": 0.01,
"step": 10}`). The end-of-training summary (`train_runtime`, `train_loss`, ...) is skipped; evaluation
entries (`eval_*`) are merged into their step, as `trl-log` does with evaluation dicts, so both formats give
the same metrics. `epoch` stays an ordinary metric. Python's json writes NaN / Infinity as bare tokens:
they are kept. An entry that is not an object, has no usable step or holds a non-number is reported with
the line it starts on; a file cut off mid-write keeps the entries before the cut.

The file is one JSON document, small next to a JSONL log (one entry per logging step), so it is read
whole; entries are decoded one by one so that each diagnostic can name its line.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Final

from contracts.trainer_keys import TRL
from monitor.importers.parsed import FileColumns, ParsedLog, Paths
from monitor.importers.reading import (
    Diagnostics,
    LogImportError,
    ProgressCallback,
    StepRecords,
    load_files,
    parse_step,
    read_log_bytes,
    short,
)

_LOG_HISTORY: Final = re.compile(r'"log_history"\s*:\s*\[')
_SPACE: Final = re.compile(r"\s*")
_SUMMARY_KEYS: Final = frozenset({"train_runtime", "train_loss", "train_samples_per_second", "total_flos"})
STEP_KEY: Final = "step"


class _LineCounter:
    """Line numbers of offsets met in increasing order, without rescanning the text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.offset = 0
        self.line = 1

    def at(self, offset: int) -> int:
        self.line += self.text.count("\n", self.offset, offset)
        self.offset = offset
        return self.line


def parse_trl_state_file(
    path: str, diagnostics: Diagnostics, progress: ProgressCallback | None = None
) -> FileColumns:
    """Step records (canonical names) of one trainer_state.json."""
    raw = read_log_bytes(path, progress)
    text = raw.decode("utf-8", errors="replace")
    found = _LOG_HISTORY.search(text)
    if found is None:
        raise LogImportError(f'{path}: no "log_history" list: not a trainer_state.json')
    records = StepRecords(path, diagnostics, TRL)
    lines = _LineCounter(text)
    decoder = json.JSONDecoder()
    pos = found.end()
    while True:
        pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]  # \s* always matches
        if pos >= len(text):
            diagnostics.report(path, lines.at(pos), "file ends inside log_history (truncated?)")
            break
        if text[pos] == "]":
            break
        line = lines.at(pos)
        try:
            entry, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            diagnostics.report(path, lines.at(exc.pos), f"invalid JSON in log_history: {exc.msg}")
            break
        _add_entry(records, entry, path, line, diagnostics)
        pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
        if pos < len(text) and text[pos] == ",":
            pos += 1
        elif pos >= len(text) or text[pos] != "]":
            diagnostics.report(path, lines.at(pos), "expected ',' or ']' after a log_history entry")
            break
    return records.columns()


def _add_entry(records: StepRecords, entry: object, path: str, line: int, diagnostics: Diagnostics) -> None:
    if not isinstance(entry, dict):
        diagnostics.report(path, line, f"log_history entry is not an object: {short(entry)}")
        return
    if _SUMMARY_KEYS & entry.keys():
        return
    if STEP_KEY not in entry:
        diagnostics.report(path, line, 'log_history entry has no "step"')
        return
    step = parse_step(entry[STEP_KEY])
    if step is None:
        diagnostics.report(path, line, f"step is not a non-negative integer: {short(entry[STEP_KEY])}")
        return
    for key, value in entry.items():
        if key == STEP_KEY:
            continue
        records.add_logged(step, line, key, math.nan if value is None else value)


def load_trl_state(
    paths: Paths, *, strict: bool = False, progress: ProgressCallback | None = None
) -> ParsedLog:
    """Columns of one run from trainer_state.json file(s) in order (a later file wins per step). A
    directory stands for the trainer_state.json inside it (a checkpoint folder)."""
    files = [_state_file(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
    return load_files(files, parse_trl_state_file, strict=strict, progress=progress)


def _state_file(path: str | os.PathLike[str]) -> str:
    path = os.fspath(path)
    return os.path.join(path, "trainer_state.json") if os.path.isdir(path) else path

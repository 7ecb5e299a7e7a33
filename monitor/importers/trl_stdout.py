"""TRL trainer stdout: one Python-dict line per logged step among tqdm progress noise.

`Trainer.log` prints e.g. `{'loss': 0.13, 'grad_norm': 1.49, 'reward': 1.06, ..., 'epoch': 0.0}`; tqdm
redraws with carriage returns, so a dict can sit in the middle of a physical line. Dicts are read with
`ast.literal_eval` (bare `nan` / `inf` are turned into floats first). Steps are the order of the training
dicts starting at `first_step` (1: the first optimizer step), unless a dict carries a `step` or
`global_step` key. `epoch` is fractional in TRL logs (it cannot give a step without the dataset size), so
it stays an ordinary metric. Evaluation dicts (only `eval_*` keys) belong to the current step and the
end-of-training summary (`train_runtime`, ...) is skipped.

A dict with at least one number is a log dict; its other values (text, lists) are reported as malformed,
as is a log dict that is cut off or not a valid literal. Dicts without any number are not log dicts.
"""

from __future__ import annotations

import ast
import math
import os
import re
from collections.abc import Iterable, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from contracts.trainer_keys import TRL
from monitor.importers.parsed import FileColumns, ParsedLog, Paths, as_path_list, merge_columns
from monitor.importers.reading import (
    Diagnostics,
    Line,
    ProgressCallback,
    StepRecords,
    iter_lines,
    parse_number,
    short,
    text_lines,
)

_DICT: Final = re.compile(r"\{'[^{}]*\}")
_OPEN_LOG_DICT: Final = re.compile(r"\{'[^{}']*':\s*[-+0-9.naif][^{}]*$")
"""A log dict that starts but never closes on its line (the process died mid-print)."""
_BARE_NONFINITE: Final = re.compile(r"(:\s*)(-?(?:nan|inf))(?=\s*[,}])")
_STEP_KEYS: Final = ("step", "global_step")
_SUMMARY_KEYS: Final = frozenset({"train_runtime", "train_loss", "train_samples_per_second"})
_PASSIVE_KEYS: Final = frozenset({"epoch", *_STEP_KEYS})


def _literal(text: str) -> dict[object, object] | None:
    try:
        parsed = ast.literal_eval(_BARE_NONFINITE.sub(r"\1'\2'", text))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None


def _numeric_entries(parsed: dict[object, object]) -> tuple[dict[str, float], list[tuple[object, object]]]:
    """(numeric entries, other entries) of a printed dict."""
    row: dict[str, float] = {}
    other: list[tuple[object, object]] = []
    for key, value in parsed.items():
        number = (
            parse_number(value) if not isinstance(value, str) or value in ("nan", "inf", "-inf") else None
        )
        if isinstance(key, str) and number is not None:
            row[key] = number
        else:
            other.append((key, value))
    return row, other


def parse_trl_lines(
    lines: Iterable[Line], path: str, diagnostics: Diagnostics, first_step: int = 1
) -> FileColumns:
    """Step records (canonical names) of one stdout capture."""
    records = StepRecords(path, diagnostics, TRL)
    step = first_step - 1
    for line in lines:
        if "{'" not in line.text:
            continue
        for segment in line.text.split("\r"):
            if "{'" not in segment:
                continue
            end = 0
            for match in _DICT.finditer(segment):
                end = match.end()
                parsed = _literal(match.group(0))
                if parsed is None:
                    if re.search(r"':\s*[-+0-9]", match.group(0)):
                        diagnostics.report(
                            path, line.number, f"not a valid Python dict: {short(match.group(0))}"
                        )
                    continue
                row, other = _numeric_entries(parsed)
                if not row or _SUMMARY_KEYS & row.keys():
                    continue
                for key, value in other:
                    diagnostics.report(path, line.number, f"{key!s} is not a number: {short(value)}")
                explicit = next((row[k] for k in _STEP_KEYS if k in row and math.isfinite(row[k])), None)
                is_eval = all(k.startswith("eval_") or k in _PASSIVE_KEYS for k in row)
                if explicit is not None:
                    step = int(explicit)
                elif not is_eval:
                    step += 1
                if step < 0:
                    diagnostics.report(path, line.number, f"negative step {step}")
                    continue
                records.add_row(step, line.number, {k: v for k, v in row.items() if k not in _STEP_KEYS})
            if _OPEN_LOG_DICT.search(segment, end):
                diagnostics.report(path, line.number, line.reason("log dict is cut off (no closing brace)"))
    return records.columns()


def parse_trl_stdout(
    text: str, first_step: int = 1, diagnostics: Diagnostics | None = None, path: str = "<text>"
) -> dict[int, dict[str, float]]:
    """Step records (canonical names) of a stdout capture already in memory."""
    found = diagnostics if diagnostics is not None else Diagnostics()
    return parse_trl_lines(text_lines(text), path, found, first_step).to_records()


def parse_trl_stdout_file(
    path: str, diagnostics: Diagnostics, progress: ProgressCallback | None = None, first_step: int = 1
) -> FileColumns:
    """Step records of one stdout capture, streamed line by line."""
    return parse_trl_lines(iter_lines(path, progress), path, diagnostics, first_step)


def load_trl_stdout(
    paths: Paths,
    first_step: int | Sequence[int] = 1,
    *,
    strict: bool = False,
    progress: ProgressCallback | None = None,
) -> ParsedLog:
    """Columns of one run from its stdout capture(s). For a resumed run pass the files in order and, when
    the dicts carry no step, the first step of each file (a later file wins for overlapping steps)."""
    files = [os.fspath(p) for p in as_path_list(paths)]
    firsts = [first_step] * len(files) if isinstance(first_step, int) else list(first_step)
    if len(firsts) != len(files):
        raise ValueError(f"first_step has {len(firsts)} entries for {len(files)} files")
    diagnostics = Diagnostics(strict)
    columns = [parse_trl_stdout_file(p, diagnostics, progress, f) for p, f in zip(files, firsts, strict=True)]
    return merge_columns(columns, diagnostics.items)


def read_trl_stdout(
    paths: Paths, first_step: int | Sequence[int] = 1
) -> tuple[npt.NDArray[np.int64], dict[str, npt.NDArray[np.float64]]]:
    """(steps, {canonical name: values}) with NaN where a metric was not logged."""
    return load_trl_stdout(paths, first_step).as_tuple()

"""verl `file` logger JSONL (`trainer.logger=['file']`, verl/utils/tracking.py `FileLogger`).

One JSON object per line, `{"step": N, "data": {"actor/entropy": 0.4, ...}}`; a flat
`{"step": N, "actor/entropy": 0.4, ...}` is read too. verl writes with orjson, which turns NaN and inf into
`null`: a key present with `null` is therefore a logged non-finite value and is kept as NaN (the JSON
tokens `NaN` / `Infinity` and the strings "nan" / "inf" / "-inf" are kept as they are). Nested objects are
flattened with `/`. Blank lines are skipped; a line that is not a JSON object, has no usable step or holds
a value that is not a number is reported with its file and line. Streamed line by line.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Final

from contracts.trainer_keys import VERL
from monitor.importers.parsed import FileColumns, ParsedLog, Paths
from monitor.importers.reading import (
    Diagnostics,
    Line,
    ProgressCallback,
    StepRecords,
    iter_lines,
    json_objects,
    load_files,
    parse_step,
    short,
)

STEP_KEY: Final = "step"
DATA_KEY: Final = "data"


def _flatten(data: Mapping[str, object], prefix: str = "") -> Iterator[tuple[str, object]]:
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, name + "/")
        else:
            yield name, value


def parse_verl_jsonl_file(
    path: str, diagnostics: Diagnostics, progress: ProgressCallback | None = None
) -> FileColumns:
    """Step records (canonical names) of one JSONL file."""
    return parse_verl_jsonl_lines(iter_lines(path, progress), path, diagnostics)


def parse_verl_jsonl_lines(lines: Iterable[Line], path: str, diagnostics: Diagnostics) -> FileColumns:
    """Step records (canonical names) of JSONL lines read elsewhere (`lldmon watch` follows a file)."""
    records = StepRecords(path, diagnostics, VERL)
    for line, obj in json_objects(lines, path, diagnostics):
        if STEP_KEY not in obj:
            diagnostics.report(path, line.number, 'no "step"')
            continue
        step = parse_step(obj[STEP_KEY])
        if step is None:
            diagnostics.report(
                path, line.number, f"step is not a non-negative integer: {short(obj[STEP_KEY])}"
            )
            continue
        nested = obj.get(DATA_KEY)
        data = nested if isinstance(nested, dict) else {k: v for k, v in obj.items() if k != STEP_KEY}
        for name, value in _flatten(data):
            records.add_logged(step, line.number, name, math.nan if value is None else value)
    return records.columns()


def load_verl_jsonl(
    paths: Paths, *, strict: bool = False, progress: ProgressCallback | None = None
) -> ParsedLog:
    """Columns of one run from its JSONL file(s), in the order written (a later file wins per step)."""
    return load_files(paths, parse_verl_jsonl_file, strict=strict, progress=progress)

"""TRL trainer stdout: one Python-dict line per logged step among tqdm progress noise.

`Trainer.log` prints e.g. `{'loss': 0.13, 'grad_norm': 1.49, 'reward': 1.06, ..., 'epoch': 0.0}`; tqdm
redraws with carriage returns, so a dict can sit in the middle of a physical line. Dicts are read with
`ast.literal_eval` (bare `nan` / `inf` are turned into floats first). Steps are the order of the training
dicts starting at `first_step` (1: the first optimizer step), unless a dict carries a `step` or
`global_step` key. `epoch` is fractional in TRL logs (it cannot give a step without the dataset size), so
it stays an ordinary metric. Evaluation dicts (only `eval_*` keys) belong to the current step and the
end-of-training summary (`train_runtime`, ...) is skipped.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from monitor.importers.names import TRL_NAMES, canonical_name
from monitor.importers.parsed import ParsedLog, Paths, as_path_list, merge_records, read_text, to_columns

_DICT: Final = re.compile(r"\{'[^{}]*\}")
_BARE_NONFINITE: Final = re.compile(r"(:\s*)(-?(?:nan|inf))(?=\s*[,}])")
_STEP_KEYS: Final = ("step", "global_step")
_SUMMARY_KEYS: Final = frozenset({"train_runtime", "train_loss", "train_samples_per_second"})
_PASSIVE_KEYS: Final = frozenset({"epoch", *_STEP_KEYS})


def parse_trl_dict(text: str) -> dict[str, float] | None:
    """The numeric entries of one printed log dict, or None if `text` is not a dict literal."""
    try:
        parsed = ast.literal_eval(_BARE_NONFINITE.sub(r"\1'\2'", text))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(parsed, dict):
        return None
    row: dict[str, float] = {}
    for key, value in parsed.items():
        if not isinstance(key, str) or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) or (isinstance(value, str) and value in ("nan", "inf", "-inf")):
            row[key] = float(value)
    return row


def parse_trl_stdout(text: str, first_step: int = 1) -> dict[int, dict[str, float]]:
    """Step records (canonical names) of one stdout capture."""
    records: dict[int, dict[str, float]] = {}
    step = first_step - 1
    for segment in re.split(r"[\r\n]", text):
        if "{'" not in segment:
            continue
        for match in _DICT.finditer(segment):
            row = parse_trl_dict(match.group(0))
            if not row or _SUMMARY_KEYS & row.keys():
                continue
            explicit = next((row[k] for k in _STEP_KEYS if k in row and math.isfinite(row[k])), None)
            is_eval = all(k.startswith("eval_") or k in _PASSIVE_KEYS for k in row)
            if explicit is not None:
                step = int(explicit)
            elif not is_eval:
                step += 1
            target = records.setdefault(step, {})
            for key, value in row.items():
                if key not in _STEP_KEYS:
                    target[canonical_name(key, TRL_NAMES)] = value
    return records


def load_trl_stdout(paths: Paths, first_step: int | Sequence[int] = 1) -> ParsedLog:
    """Columns of one run from its stdout capture(s). For a resumed run pass the files in order and, when
    the dicts carry no step, the first step of each file (a later file wins for overlapping steps)."""
    files = as_path_list(paths)
    firsts = [first_step] * len(files) if isinstance(first_step, int) else list(first_step)
    if len(firsts) != len(files):
        raise ValueError(f"first_step has {len(firsts)} entries for {len(files)} files")
    return to_columns(
        merge_records(parse_trl_stdout(read_text(p), f) for p, f in zip(files, firsts, strict=True))
    )


def read_trl_stdout(
    paths: Paths, first_step: int | Sequence[int] = 1
) -> tuple[npt.NDArray[np.int64], dict[str, npt.NDArray[np.float64]]]:
    """(steps, {canonical name: values}) with NaN where a metric was not logged."""
    return load_trl_stdout(paths, first_step).as_tuple()

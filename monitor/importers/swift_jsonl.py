"""ms-swift `logging.jsonl` (`swift rlhf --rlhf_type grpo ...`, written to the output directory).

One JSON object per line: TRL's GRPOTrainer log dict (ms-swift's trainers are TRL subclasses: `loss`,
`grad_norm`, `learning_rate`, `reward`, `reward_std`, `frac_reward_zero_std`, `rewards/<func>/mean`,
`completions/mean_length`, `kl`, `clip_ratio/*`, `entropy/mean`, `epoch`, ...) plus ms-swift's progress
fields: `"global_step/max_steps": "12/500"` (the step), `percentage`, `elapsed_time`, `remaining_time`
(text, not metrics), `memory(GiB)` and `train_speed(iter/s)` / `train_speed(s/it)` (numbers, kept as
metrics). Megatron-SWIFT writes the step as `"iteration": "12/500"`, old ms-swift as `"global_step": 12`.
Names are mapped through TRL's vocabulary of `contracts.trainer_keys` (`TRL`); unknown keys keep their
name. Evaluation lines (`eval_*`) join their step; the end-of-training lines (`train_runtime`, ... and the
final summary with `log_history`) are skipped. NaN / Infinity (JSON tokens or the strings "nan" / "inf")
are kept; a line that is not a JSON object, has no step, or holds another value that is not a number is
reported with its file and line. A step logged on several lines is merged (a later line wins per key).
Streamed line by line.
"""

from __future__ import annotations

from typing import Final

from contracts.trainer_keys import TRL
from monitor.importers.parsed import FileColumns, ParsedLog, Paths
from monitor.importers.reading import (
    Diagnostics,
    ProgressCallback,
    StepRecords,
    iter_json_objects,
    load_files,
    parse_step,
    short,
)

PROGRESS_STEP_KEYS: Final = ("global_step/max_steps", "iteration")
"""Keys holding the step as "N/M" text (ms-swift, Megatron-SWIFT)."""
PLAIN_STEP_KEY: Final = "global_step"
"""Older ms-swift: the step as a number."""
PROGRESS_TEXT_KEYS: Final = frozenset({"percentage", "elapsed_time", "remaining_time"})
"""ms-swift's progress fields: text, not metrics."""
SUMMARY_KEYS: Final = frozenset({"train_runtime", "log_history", "last_model_checkpoint"})
"""A line with one of these is an end-of-training summary, not a step's log."""
MARKER_KEYS: Final = (*PROGRESS_STEP_KEYS, PLAIN_STEP_KEY)
"""Keys that tell an ms-swift line (`--format auto`)."""


def swift_step(obj: dict[str, object]) -> tuple[int | None, str | None]:
    """(step, the key it came from) of one ms-swift log object; (None, key) when that key's value is not
    a usable step, (None, None) when the object has no step key at all."""
    for key in PROGRESS_STEP_KEYS:
        if key in obj:
            value = obj[key]
            text = value.split("/", 1)[0] if isinstance(value, str) else value
            return parse_step(text), key
    if PLAIN_STEP_KEY in obj:
        return parse_step(obj[PLAIN_STEP_KEY]), PLAIN_STEP_KEY
    return None, None


def is_swift_object(obj: object) -> bool:
    """True for a JSON object that looks like an ms-swift log line (a step key of ms-swift's, no "step")."""
    return isinstance(obj, dict) and "step" not in obj and any(k in obj for k in MARKER_KEYS)


def parse_swift_jsonl_file(
    path: str, diagnostics: Diagnostics, progress: ProgressCallback | None = None
) -> FileColumns:
    """Step records (canonical names) of one `logging.jsonl`."""
    records = StepRecords(path, diagnostics, TRL)
    for line, obj in iter_json_objects(path, diagnostics, progress):
        if SUMMARY_KEYS & obj.keys():
            continue
        step, key = swift_step(obj)
        if key is None:
            diagnostics.report(
                path, line.number, f'no step ("{PROGRESS_STEP_KEYS[0]}" or "{PLAIN_STEP_KEY}")'
            )
            continue
        if step is None:
            diagnostics.report(path, line.number, f"{key} does not start with a step: {short(obj[key])}")
            continue
        for name, value in obj.items():
            if name in MARKER_KEYS or name in PROGRESS_TEXT_KEYS:
                continue
            records.add_logged(step, line.number, name, value)
    return records.columns()


def load_swift_jsonl(
    paths: Paths, *, strict: bool = False, progress: ProgressCallback | None = None
) -> ParsedLog:
    """Columns of one run from its `logging.jsonl` file(s), in the order written (a later file wins per
    step: a run resumed from a checkpoint logs the overlapping steps again)."""
    return load_files(paths, parse_swift_jsonl_file, strict=strict, progress=progress)


__all__ = ["is_swift_object", "load_swift_jsonl", "parse_swift_jsonl_file", "swift_step"]

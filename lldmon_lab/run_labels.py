"""Labels of real training logs for `lldmon eval --labels FILE`: which runs collapse, and where.

A labels file is TOML, one `[[run]]` table per run:

```toml
[[run]]
name = "aopd-retool-qwen3-4b-grpo"                  # unique, shown in the report
path = "aopd_retool_qwen3_4b_grpo_collapse/run-20251129_221801-i80f2v90_output.log"
format = "verl-console"                             # optional, default "auto" (`lldmon import --format`)
collapses = true
collapse_step = 11                                  # optional (only with collapses = true)
note = "PROVENANCE.md: ..."                         # where the label comes from
```

`path` is one file or a list of files (the files of a resumed run, in the order written: a later file wins
per step), each relative to the real-runs root (`lldmon eval --real-runs DIR`; without it, the folder of the
labels file) or absolute. `collapses = false` marks a control. Without `collapse_step` a collapsing run is
labelled with the one collapse rule (`lldmon_lab.labels.collapse_step`) on its imported `reward/mean`;
a run the rule finds no collapse in must then give `collapse_step`. Every field is checked; a mistake is a
`LabelsError` naming the file, the entry (number and name) and the field. Unknown fields are refused (a
misspelt `colapses` would otherwise silently make a control).

The repo's labels of ../shared/datasets/real_runs ship as package data: `DEFAULT_LABELS`.
Pure apart from reading the labels file (the logs are read by `lldmon_lab.evaluation`).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from monitor.importers.detect import AUTO, FORMATS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_LABELS: Final = Path(__file__).resolve().parent / "eval_labels" / "real_runs.toml"
"""The labels of every log in ../shared/datasets/real_runs (package data)."""

RUN_TABLE: Final = "run"
REQUIRED: Final = ("name", "path", "collapses", "note")
OPTIONAL: Final = ("format", "collapse_step", "reward_floor")
FIELDS: Final = (*REQUIRED, *OPTIONAL)


class LabelsError(ValueError):
    """A labels file that cannot be used: unreadable, not TOML, or an entry with a bad or missing field."""


@dataclass(frozen=True)
class RunLabel:
    """One `[[run]]` entry, paths resolved."""

    name: str
    paths: tuple[Path, ...]
    fmt: str
    collapses: bool
    collapse_step: int | None
    """As written in the file (None: computed with the collapse rule when `collapses`)."""
    note: str
    entry: int
    """1-based position in the file (for messages)."""
    source: str
    """The labels file (for messages)."""
    reward_floor: float | None = None
    """The floor of the run's reward design where it is documented (0 for a success rate or exact match,
    -1 for a score of +-1): the detector's `reward_floor` for this run. None: judged scale-free."""

    def where(self) -> str:
        return f"{self.source}: run {self.entry} ({self.name!r})"

    def missing_files(self) -> list[Path]:
        return [p for p in self.paths if not p.exists()]


def _entry_error(source: str, entry: int, name: object, message: str) -> LabelsError:
    label = f" ({name!r})" if isinstance(name, str) and name else ""
    return LabelsError(f"{source}: run {entry}{label}: {message}")


def _paths(raw: object, root: Path) -> tuple[Path, ...] | None:
    items: Sequence[object] = [raw] if isinstance(raw, str) else raw if isinstance(raw, list) else []
    if not items or not all(isinstance(p, str) and p.strip() for p in items):
        return None
    out: list[Path] = []
    for item in items:
        path = Path(os.path.expanduser(str(item).strip()))
        out.append(path if path.is_absolute() else root / path)
    return tuple(out)


def parse_labels(text: str, source: str, root: Path) -> list[RunLabel]:
    """The entries of a labels file's text; relative paths are resolved against `root`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LabelsError(f"{source}: not valid TOML: {exc}") from None
    unknown_top = sorted(set(data) - {RUN_TABLE})
    if unknown_top:
        raise LabelsError(
            f"{source}: unknown top-level key(s) {', '.join(unknown_top)}; runs are [[{RUN_TABLE}]] tables"
        )
    entries = data.get(RUN_TABLE)
    if not isinstance(entries, list) or not entries:
        raise LabelsError(f"{source}: no [[{RUN_TABLE}]] entries")
    labels: list[RunLabel] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries, start=1):
        if not isinstance(entry, Mapping):
            raise _entry_error(source, i, None, f"not a table (write it as [[{RUN_TABLE}]])")
        labels.append(_parse_entry(entry, i, source, root))
        name = labels[-1].name
        if name in seen:
            raise _entry_error(source, i, name, f"field 'name': {name!r} is already run {seen[name]}'s name")
        seen[name] = i
    return labels


def _parse_entry(entry: Mapping[str, object], i: int, source: str, root: Path) -> RunLabel:
    name = entry.get("name")

    def fail(field: str, message: str) -> LabelsError:
        return _entry_error(source, i, name, f"field {field!r}: {message}")

    unknown = sorted(set(entry) - set(FIELDS))
    if unknown:
        raise fail(unknown[0], f"unknown field (fields: {', '.join(FIELDS)})")
    for field in REQUIRED:
        if field not in entry:
            raise fail(field, "missing (required)")
    if not isinstance(name, str) or not name.strip():
        raise fail("name", f"expected a non-empty string, got {entry['name']!r}")
    paths = _paths(entry["path"], root)
    if paths is None:
        raise fail("path", f"expected a file name or a non-empty list of file names, got {entry['path']!r}")
    fmt = entry.get("format", AUTO)
    if fmt not in (AUTO, *FORMATS):
        raise fail("format", f"{fmt!r} is not one of {AUTO}, {', '.join(FORMATS)}")
    collapses = entry["collapses"]
    if not isinstance(collapses, bool):
        raise fail("collapses", f"expected true or false, got {collapses!r}")
    step = entry.get("collapse_step")
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise fail("collapse_step", f"expected an integer >= 0, got {step!r}")
        if not collapses:
            raise fail(
                "collapse_step", "given for a run with collapses = false (a control has no collapse step)"
            )
    note = entry["note"]
    if not isinstance(note, str) or not note.strip():
        raise fail("note", "expected a non-empty string: where the label comes from")
    floor = entry.get("reward_floor")
    if floor is not None and (
        isinstance(floor, bool) or not isinstance(floor, (int, float)) or not math.isfinite(floor)
    ):
        raise fail("reward_floor", f"expected a finite number (the reward design's floor), got {floor!r}")
    return RunLabel(
        name=name.strip(),
        paths=paths,
        fmt=str(fmt),
        collapses=collapses,
        collapse_step=step,
        note=note.strip(),
        entry=i,
        source=source,
        reward_floor=None if floor is None else float(floor),
    )


def read_labels(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> list[RunLabel]:
    """The entries of a labels file; relative paths resolve against `root` (default: the file's folder)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LabelsError(f"{file}: cannot read the labels file: {exc}") from None
    return parse_labels(text, os.fspath(file), Path(root) if root is not None else file.resolve().parent)


__all__ = ["DEFAULT_LABELS", "LabelsError", "RunLabel", "parse_labels", "read_labels"]

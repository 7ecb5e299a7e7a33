"""Recorded lab runs as fixtures: real GRPO collapses (and controls) as the detector's ground truth.

Format: one gzip JSONL file per run, `<key>.jsonl.gz`, strict JSON (non-finite values as the strings
"NaN", "Infinity", "-Infinity", as on the ingest wire):
- line 1, the header: `{"format": "lldmon-lab-run/1", "name", "key", "group", "seed", "source": "lab",
  "label": {"collapses": bool, "collapse_step": int | null, "rule": RULE[, "series": name]},
  "settings": {...},
  "command": the exact training command that made the run, "lab_command": the `lldmon lab run` command,
  "steps": number of step lines, "lldmon_live": what the live service said (alerts, phase events,
  directives)}`;
- then one line per step, ascending: `{"step": s, "metrics": {canonical name: value}}` with every metric
  the hooks sent at that step (TRL's scalars, `lld/*`, `llds/*`, ...), exactly as the example script's
  `--metrics-jsonl` wrote them.

The label is `lldmon_lab.labels.collapse_step` (the one collapse rule) of one series of the step
lines, recomputed by `export`: `reward/mean`, or, for a run whose reward design (`settings.reward_design`,
the script's `--reward-design`) is not `exact`, the task's success `rewards/exact_match/mean` where the
run logged it (`lldmon_lab.lab.results.label_metric`, which says why). A label on the task success names
it in `"series"`; a label without `"series"` is on `reward/mean` (every fixture made before reward
designs, unchanged). `load_fixtures` returns the runs as `lldmon_lab.evaluation.LabelledRun`s with source
"lab"; the detector sees every metric, the optimised reward under `reward/mean` as always.

Reading a fixture is `monitor.importers.lab_fixture`'s (the same reader `lldmon import` uses for
`--format lab-fixture`); this module adds the labels, the export from a lab directory and the writer.

The fixtures of the repository live in `tests/fixtures/lab/` (test data of a source checkout, like the
third-party logs in ../shared/datasets: not shipped in the wheel); `lldmon eval` finds them there in a
checkout (`--lab DIR` elsewhere). Export from a lab directory::

    python -m lldmon_lab.lab.fixtures export LABDIR --out tests/fixtures/lab [--runs KEY1,KEY2]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from contracts import metrics as M
from lldmon_lab.evaluation import SOURCE_LAB, LabelledRun, is_damaged
from lldmon_lab.lab.grid import REWARD_FLOORS
from lldmon_lab.lab.results import FINISHED, TASK_SUCCESS, analyse, label_metric, read_records
from lldmon_lab.labels import RULE, collapse_step
from monitor.importers.lab_fixture import FORMAT, SUFFIX, FixtureError, read_lab_run, step_line

__all__ = [
    "FORMAT",
    "FixtureError",
    "RecordedRun",
    "default_fixture_dir",
    "export_lab",
    "label_of",
    "load_fixtures",
    "main",
    "read_fixture",
    "write_fixture",
]


@dataclass(frozen=True)
class RecordedRun:
    """One fixture: its header and its per-step metrics (`rows[i]` belongs to `steps[i]`)."""

    header: Mapping[str, Any]
    steps: list[int]
    rows: list[dict[str, float]]

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """(steps, values) where `name` was logged."""
        pairs = [(s, r[name]) for s, r in zip(self.steps, self.rows, strict=True) if name in r]
        return [s for s, _ in pairs], [v for _, v in pairs]

    def to_labelled_run(self) -> LabelledRun:
        """The run for `lldmon_lab.evaluation`: every metric as a column (NaN where not logged), `present`
        True where a value was logged (NaN included), the header's label and group, source "lab"."""
        label = self.header["label"]
        settings = self.header.get("settings") or {}
        steps = np.asarray(self.steps, dtype=np.int64)
        names = sorted({k for r in self.rows for k in r})
        values: dict[str, np.ndarray] = {}
        present: dict[str, np.ndarray] = {}
        for name in names:
            col = np.full(steps.size, np.nan)
            mask = np.zeros(steps.size, dtype=np.bool_)
            for i, row in enumerate(self.rows):
                if name in row:
                    col[i] = row[name]
                    mask[i] = True
            values[name] = col
            present[name] = mask
        declared = _declared_reward(label.get("series"), settings)
        series = values.get(str(label.get("series") or M.REWARD_MEAN))
        return LabelledRun(
            name=str(self.header["name"]),
            group=str(self.header.get("group") or self.header["name"]),
            steps=steps,
            values=values,
            present=present,
            collapses=bool(label["collapses"]),
            collapse_step=label["collapse_step"],
            source=str(self.header.get("source", SOURCE_LAB)),
            damaged=is_damaged(bool(label["collapses"]), steps, series),
            **declared,
        )


TASK_SUCCESS_FLOOR: Final = 0.0
"""Exact match scores 0 or 1 per response, so its batch mean's floor is 0."""


def _declared_reward(series: str | None, settings: Mapping[str, Any]) -> dict[str, Any]:
    """What a user of this reward design declares in the run's detector overrides: the series the reward
    rules judge (the task success the run is labelled on, when its optimised reward is shaped) and that
    series' floor where it is fixed."""
    if series is not None and series != M.REWARD_MEAN:
        floor = TASK_SUCCESS_FLOOR if series == TASK_SUCCESS else None
        return {"reward_metric": series, "reward_floor": floor}
    return {"reward_floor": REWARD_FLOORS.get(str(settings.get("reward_design") or "exact"))}


def _wire(value: float) -> float | str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def label_of(
    steps: Sequence[int], rows: Sequence[Mapping[str, float]], settings: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The label of a recorded run: the one collapse rule on the series `label_metric(settings)` names
    (`reward/mean` unless the reward design is not `exact`); `"series"` names it when it is not
    `reward/mean`."""
    logged = {name for row in rows for name in row}
    name = label_metric(settings, logged)
    pairs = [(s, r[name]) for s, r in zip(steps, rows, strict=True) if name in r]
    step = collapse_step([s for s, _ in pairs], [v for _, v in pairs])
    label: dict[str, Any] = {"collapses": step is not None, "collapse_step": step, "rule": RULE}
    if name != M.REWARD_MEAN:
        label["series"] = name
    return label


def read_metrics_jsonl(path: Path) -> tuple[list[int], list[dict[str, float]]]:
    """The example script's `--metrics-jsonl` file (NaN as a JSON literal or a string; a step written
    twice is merged, the later value winning)."""
    by_step: dict[int, dict[str, float]] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise FixtureError(f"{path}: {exc.strerror or exc}") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        step, metrics = step_line(line, f"{path}:{n}")
        by_step.setdefault(step, {}).update(metrics)
    ordered = sorted(by_step)
    return ordered, [by_step[s] for s in ordered]


def write_fixture(
    path: Path, header: Mapping[str, Any], steps: Sequence[int], rows: Sequence[Mapping[str, float]]
) -> None:
    """Write one fixture (reproducible bytes: no timestamp in the gzip header, sorted metric names)."""
    buf = io.StringIO()
    buf.write(json.dumps(dict(header), allow_nan=False) + "\n")
    for step, row in zip(steps, rows, strict=True):
        metrics = {k: _wire(float(row[k])) for k in sorted(row)}
        buf.write(json.dumps({"step": int(step), "metrics": metrics}, allow_nan=False) + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with (
        tmp.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz,
    ):
        gz.write(buf.getvalue().encode("utf-8"))
    tmp.replace(path)


def read_fixture(path: Path) -> RecordedRun:
    run = read_lab_run(path)
    return RecordedRun(header=run.header, steps=run.steps, rows=run.rows)


def default_fixture_dir() -> Path | None:
    """`tests/fixtures/lab` of the source checkout this package runs from (an editable install), or
    None (an installed wheel does not ship them: pass the directory)."""
    path = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "lab"
    return path if path.is_dir() else None


def load_fixtures(directory: Path) -> list[LabelledRun]:
    """Every `*.jsonl.gz` fixture under `directory` (sorted by file name) as a labelled run."""
    return [read_fixture(p).to_labelled_run() for p in sorted(directory.glob(f"*{SUFFIX}"))]


def _lab_command(lab_dir: Path) -> str | None:
    try:
        summary = json.loads((lab_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    command = summary.get("command") if isinstance(summary, dict) else None
    return command if isinstance(command, str) else None


def export_lab(lab_dir: Path, out: Path, keys: Iterable[str] | None = None, log: Any = None) -> list[Path]:
    """Write one fixture per finished run of a lab directory (`runs/<key>.json` and
    `work/<run-name>/metrics.jsonl`); `keys`: only these runs (an unknown or unfinished one is an
    error). Returns the files written."""
    records = read_records(lab_dir / "runs")
    if not records:
        raise FixtureError(f"{lab_dir / 'runs'}: no run records")
    wanted = list(keys) if keys is not None else sorted(records)
    unknown = [k for k in wanted if k not in records]
    if unknown:
        raise FixtureError(f"no such run in {lab_dir / 'runs'}: {', '.join(unknown)}")
    lab_command = _lab_command(lab_dir)
    written: list[Path] = []
    for key in wanted:
        record = records[key]
        if record.get("status") != FINISHED:
            if keys is not None:
                raise FixtureError(f"{key}: status {record.get('status')!r}, not {FINISHED!r}")
            continue
        name = str(record.get("run_name") or key)
        metrics_path = lab_dir / "work" / name / "metrics.jsonl"
        steps, rows = read_metrics_jsonl(metrics_path)
        label = label_of(steps, rows, record.get("setting"))
        live = analyse(record).collapse_step
        if live != label["collapse_step"] and log is not None:
            log(
                f"note: {key}: label {label['collapse_step']} from metrics.jsonl, {live} from the service's series"
            )
        header = {
            "format": FORMAT,
            "name": name,
            "key": key,
            "group": record.get("group"),
            "seed": record.get("seed"),
            "source": SOURCE_LAB,
            "label": label,
            "settings": record.get("setting", {}),
            "command": record.get("command"),
            "lab_command": lab_command,
            "steps": len(steps),
            "lldmon_live": {
                "alerts": record.get("alerts", []),
                "phases": record.get("phases", []),
                "directives": record.get("directives", []),
                "final_phase": (record.get("run") or {}).get("phase"),
            },
        }
        path = out / f"{key}{SUFFIX}"
        write_fixture(path, header, steps, rows)
        written.append(path)
        if log is not None:
            step = label["collapse_step"]
            log(
                f"{path}: {len(steps)} steps, "
                + (f"collapses at {step}" if step is not None else "no collapse")
                + f", {path.stat().st_size / 1024:.1f} KiB"
            )
    return written


def write_csv(run: RecordedRun, out: Path) -> int:
    """The fixture as a generic CSV (`step` + one column per metric; empty = not logged, non-finite as
    `nan` / `inf`), which `lldmon import --format csv` reads back: a recorded run into any service.
    Returns the number of rows."""
    names = sorted({k for row in run.rows for k in row})
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", *names])
        for step, row in zip(run.steps, run.rows, strict=True):
            writer.writerow([step, *["" if k not in row else repr(float(row[k])) for k in names]])
    return len(run.steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lldmon_lab.lab.fixtures", description="Recorded lab runs as gzip JSONL fixtures."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="write one fixture per finished run of a lab directory")
    exp.add_argument("lab_dir", type=Path, help="a `lldmon lab run --out` directory")
    exp.add_argument("--out", type=Path, required=True, help="fixture directory (tests/fixtures/lab)")
    exp.add_argument("--runs", help="comma-separated run keys (default: every finished run)")
    show = sub.add_parser("show", help="print the header and label of fixtures")
    show.add_argument("paths", type=Path, nargs="+")
    to_csv = sub.add_parser("csv", help="write a fixture as a CSV for `lldmon import --format csv`")
    to_csv.add_argument("path", type=Path)
    to_csv.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "export":
            keys = [k.strip() for k in args.runs.split(",") if k.strip()] if args.runs else None
            written = export_lab(args.lab_dir, args.out, keys, log=print)
            print(f"{len(written)} fixtures in {args.out}")
        elif args.command == "csv":
            rows = write_csv(read_fixture(args.path), args.out)
            print(f"wrote {args.out}: {rows} steps")
        else:
            for path in args.paths:
                run = read_fixture(path)
                print(json.dumps({k: v for k, v in run.header.items() if k != "lldmon_live"}))
    except FixtureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

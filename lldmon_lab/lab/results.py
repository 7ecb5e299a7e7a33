"""What the lab keeps of a run, and the summary over runs (pure: no I/O apart from `read_records`).

A run's record (`DIR/runs/<key>.json`) holds its spec, how the process ended, and the raw data read
back from the lldmon service when it ended: the reward series, the task-success series
(`TASK_SUCCESS`, where logged), phase events, alerts and directive history. Everything derived
(labelled collapse step, first warning, lead time, best and final reward) is recomputed from that raw
data by `analyse`, so changing the rule relabels old runs (`lldmon lab summary DIR`).

Derived per run, from the labelled series (`label_metric`: the reward, or the task success for a run
whose reward design is not `exact`):
- `collapse_step`: `lldmon_lab.labels.collapse_step` of that series (the one collapse rule);
- `first_alert` (and its kind): the smallest `first_step` of any lldmon alert;
- `first_decay`: the first phase event into `decay` or `collapse`; `first_collapse_phase`: into
  `collapse` (phase III);
- `first_warning`: the earlier of `first_alert` and `first_decay`;
- `first_directive`: the step of the first directive that switched LLDS on (any source);
- `lead_time`: `collapse_step - first_warning` when both exist (> 0: warned before the collapse);
- `best_reward` / `final_reward`: the largest and the last 10-step trailing mean of that series.
Per setting group (every seed of one setting): collapse rate over the runs that finished, median
collapse step, median lead time, median best and final reward.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from contracts import metrics as M
from lldmon_lab.labels import RULE_TEXT, collapse_step, trailing_means

__all__ = [
    "RULE_TEXT",
    "TASK_SUCCESS",
    "Derived",
    "GroupStats",
    "analyse",
    "group_stats",
    "label_metric",
    "read_records",
    "render_markdown",
    "summary_payload",
]

FINISHED: Final = "finished"

TASK_SUCCESS: Final = "rewards/exact_match/mean"
"""The task's success (mean exact match) of every rollout batch: TRL's `rewards/<function>/mean` of the
script's `exact_match` reward function, which every reward design keeps (with weight 0 where it is not
part of the optimised reward). It is no canonical name: `contracts.trainer_keys` passes TRL's
per-function rewards through under their own names, and this is that name."""


def label_metric(setting: Mapping[str, Any] | None, available: Iterable[str] = (TASK_SUCCESS,)) -> str:
    """The series the collapse rule labels a run on: `TASK_SUCCESS` when the run's reward design is not
    `exact` and that series is among `available`, else `reward/mean` (as for every run before reward
    designs; for `exact` the two are the same numbers).

    Why: a shaped or centred reward is not the task. A centred reward (exact match minus a running
    baseline) is signed and near 0 whatever the task does, so the rule's "below 20 % of its peak" says
    nothing about it, and a format or penalty term can hold the reward up while answers stop being
    right. The rule is the same; only its input is the task's success."""
    design = (setting or {}).get("reward_design") or "exact"
    if design != "exact" and TASK_SUCCESS in set(available):
        return TASK_SUCCESS
    return M.REWARD_MEAN


@dataclass(frozen=True)
class Derived:
    steps_done: int | None
    collapse_step: int | None
    first_alert: int | None
    first_alert_kind: str | None
    first_decay: int | None
    first_collapse_phase: int | None
    first_warning: int | None
    first_directive: int | None
    lead_time: int | None
    best_reward: float | None
    final_reward: float | None
    final_phase: str | None


def _series(data: Mapping[str, Any] | None) -> tuple[list[int], list[float]]:
    data = data or {}
    steps = [int(s) for s in data.get("steps", [])]
    values = [math.nan if v is None else float(v) for v in data.get("values", [])]
    return steps, values


def _labelled_series(record: Mapping[str, Any]) -> tuple[list[int], list[float]]:
    """The series `label_metric` names: the record's `task_success` or its `reward`."""
    task = record.get("task_success")
    available = [TASK_SUCCESS] if task and task.get("steps") else []
    if label_metric(record.get("setting"), available) == TASK_SUCCESS:
        return _series(task)
    return _series(record.get("reward"))


def _min(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def analyse(record: Mapping[str, Any]) -> Derived:
    """The derived fields of a run record (module docstring)."""
    steps, values = _labelled_series(record)
    _, means = trailing_means(steps, values)
    alerts = sorted(record.get("alerts", []), key=lambda a: (int(a["first_step"]), str(a["kind"])))
    phases = sorted(record.get("phases", []), key=lambda e: int(e["step"]))
    first_alert = int(alerts[0]["first_step"]) if alerts else None
    first_decay = _min(int(e["step"]) for e in phases if e["phase"] in ("decay", "collapse"))
    first_collapse = _min(int(e["step"]) for e in phases if e["phase"] == "collapse")
    first_directive = _min(
        None if d.get("step") is None else int(d["step"])
        for d in record.get("directives", [])
        if d.get("enabled")
    )
    collapse = collapse_step(steps, values)
    first_warning = _min([first_alert, first_decay])
    lead = None if collapse is None or first_warning is None else collapse - first_warning
    run = record.get("run") or {}
    steps_done = run.get("last_step")
    return Derived(
        steps_done=None if steps_done is None else int(steps_done),
        collapse_step=collapse,
        first_alert=first_alert,
        first_alert_kind=str(alerts[0]["kind"]) if alerts else None,
        first_decay=first_decay,
        first_collapse_phase=first_collapse,
        first_warning=first_warning,
        first_directive=first_directive,
        lead_time=lead,
        best_reward=max(means) if means else None,
        final_reward=means[-1] if means else None,
        final_phase=run.get("phase"),
    )


@dataclass(frozen=True)
class GroupStats:
    group: str
    setting: Mapping[str, Any]
    runs: int
    finished: int
    collapsed: int
    collapse_rate: float | None
    """collapsed / finished (None without a finished run)."""
    collapse_steps: tuple[int, ...]
    median_collapse_step: float | None
    lead_times: tuple[int, ...]
    median_lead_time: float | None
    warned_before: int
    """Collapsed runs with a warning strictly before the labelled step."""
    median_best_reward: float | None
    median_final_reward: float | None
    seeds: tuple[int, ...] = field(default=())


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def group_stats(records: Sequence[Mapping[str, Any]]) -> list[GroupStats]:
    """One row per setting group, in order of first appearance."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault(str(r["group"]), []).append(r)
    out: list[GroupStats] = []
    for name, members in groups.items():
        done = [(r, analyse(r)) for r in members if r.get("status") == FINISHED]
        collapse_steps = sorted(d.collapse_step for _, d in done if d.collapse_step is not None)
        leads = sorted(d.lead_time for _, d in done if d.lead_time is not None)
        best = [d.best_reward for _, d in done if d.best_reward is not None]
        final = [d.final_reward for _, d in done if d.final_reward is not None]
        out.append(
            GroupStats(
                group=name,
                setting=dict(members[0].get("setting", {})),
                runs=len(members),
                finished=len(done),
                collapsed=len(collapse_steps),
                collapse_rate=len(collapse_steps) / len(done) if done else None,
                collapse_steps=tuple(collapse_steps),
                median_collapse_step=_median(collapse_steps),
                lead_times=tuple(leads),
                median_lead_time=_median(leads),
                warned_before=sum(1 for lead in leads if lead > 0),
                median_best_reward=_median(best),
                median_final_reward=_median(final),
                seeds=tuple(sorted(int(r["seed"]) for r in members)),
            )
        )
    return out


def _run_row(record: Mapping[str, Any]) -> dict[str, Any]:
    d = analyse(record)
    return {
        "key": record["key"],
        "group": record["group"],
        "run_name": record.get("run_name"),
        "run_id": record.get("run_id"),
        "seed": record["seed"],
        "setting": record.get("setting", {}),
        "status": record.get("status"),
        "returncode": record.get("returncode"),
        "seconds": record.get("seconds"),
        "steps_planned": (record.get("setting") or {}).get("steps"),
        **asdict(d),
    }


def summary_payload(
    records: Sequence[Mapping[str, Any]], meta: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """`summary.json`: the rule, one row per run and one per setting group (strict JSON)."""
    return {
        **(dict(meta) if meta else {}),
        "rule": RULE_TEXT,
        "runs": [_run_row(r) for r in records],
        "groups": [asdict(g) for g in group_stats(records)],
    }


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.3f}"
    if isinstance(value, list | tuple):
        return " ".join(str(v) for v in value) or "-"
    return str(value).replace("|", "\\|")


def _md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def render_markdown(payload: Mapping[str, Any]) -> str:
    """`summary.md`: the per-group table, then the per-run table."""
    lines = ["# Collapse lab summary", ""]
    if payload.get("command"):
        lines += [f"Command: `{payload['command']}`", ""]
    lines += [f"Rule: {payload['rule']}.", ""]
    lines += ["## Per setting (over seeds)", ""]
    lines += _md_table(
        [
            "setting",
            "seeds",
            "finished",
            "collapsed",
            "rate",
            "median collapse",
            "collapse steps",
            "median lead",
            "warned before",
            "best (med)",
            "final (med)",
        ],
        [
            [
                g["group"],
                g["seeds"],
                f"{g['finished']}/{g['runs']}",
                g["collapsed"],
                None if g["collapse_rate"] is None else f"{g['collapse_rate']:.0%}",
                g["median_collapse_step"],
                g["collapse_steps"],
                g["median_lead_time"],
                f"{g['warned_before']}/{g['collapsed']}",
                g["median_best_reward"],
                g["median_final_reward"],
            ]
            for g in payload["groups"]
        ],
    )
    lines += ["", "## Per run", ""]
    lines += _md_table(
        [
            "run",
            "seed",
            "status",
            "steps",
            "collapse",
            "first alert",
            "decay",
            "phase III",
            "directive",
            "lead",
            "best",
            "final",
            "phase",
        ],
        [
            [
                r["run_name"] or r["key"],
                r["seed"],
                r["status"],
                f"{_cell(r['steps_done'])}/{_cell(r['steps_planned'])}",
                r["collapse_step"],
                None if r["first_alert"] is None else f"{r['first_alert']} ({r['first_alert_kind']})",
                r["first_decay"],
                r["first_collapse_phase"],
                r["first_directive"],
                r["lead_time"],
                r["best_reward"],
                r["final_reward"],
                r["final_phase"],
            ]
            for r in payload["runs"]
        ],
    )
    return "\n".join(lines) + "\n"


def read_records(runs_dir: Path) -> dict[str, dict[str, Any]]:
    """Every readable run record under `runs_dir`, by key (a corrupt file is skipped: it reruns)."""
    out: dict[str, dict[str, Any]] = {}
    if not runs_dir.is_dir():
        return out
    for path in sorted(runs_dir.glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("key"), str):
            out[record["key"]] = record
    return out

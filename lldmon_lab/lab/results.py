"""What the lab keeps of a run, and the summary over runs (pure: no I/O apart from `read_records`).

A run's record (`DIR/runs/<key>.json`) holds its spec, how the process ended, and the raw data read
back from the lldmon service when it ended: the reward series, the task-success series
(`TASK_SUCCESS`, where logged), phase events, alerts and directive history. Everything derived
(labelled collapse step, first warning, lead time, best and final reward) is recomputed from that raw
data by `analyse`, so changing the rule relabels old runs (`lldmon lab summary DIR`).

Derived per run, from the labelled series (`label_metric`: the reward, or the task success for a run
whose reward design is not `exact`):
- `collapse_step`: `lldmon_lab.labels.collapse_step` of that series (the one collapse rule); for a run
  that ended before its planned steps in phase `collapse` (`stopped_in_collapse`: the service stopped
  it, e.g. policy `heal` out of rollbacks), where the rule cannot see a collapse in the shortened
  series, the step it entered phase III. A run stopped because it collapsed is a collapse: counting it
  as healthy would credit the policy that stopped it;
- `first_alert` (and its kind): the smallest `first_step` of an lldmon alert that may announce a
  collapse (`announces_collapse`: a collapse warning of the detector or any critical alert; a
  diagnosis such as `advantage_collapse`, which most lab runs get at step 86, is no warning of one);
- `first_decay`: the first phase event into `decay` or `collapse`; `first_collapse_phase`: into
  `collapse` (phase III);
- `first_warning`: the earlier of `first_alert` and `first_decay`;
- `first_directive`: the step of the first directive that switched LLDS on (any source);
- `lead_time`: `collapse_step - first_warning` when both exist (> 0: warned before the collapse);
- `best_reward` / `final_reward`: the largest and the last 10-step trailing mean of that series;
- `rollbacks`, `steps_redone`: the record's rollbacks (below) and the steps they made the run train
  again; `steps_after_collapse`: `steps_done - collapse_step` when the run collapsed and trained on
  (0 otherwise); `steps_wasted`: the two together (the compute a collapse cost that run).

Rollbacks (written by a trainer or supervisor that restores a checkpoint; optional, none when absent):
a record may carry `"rollbacks": [{"from_step": int, "to_step": int, ...}, ...]`, one entry per
rollback: the run trained up to `from_step`, then restored the checkpoint of `to_step` (0 <= to_step
<= from_step) and continued from there, so it trained `from_step - to_step` steps again. Other keys of
an entry (why, what changed) are kept but not read here. A malformed entry is an error naming the run.
The labelled series keeps the later value of a step logged twice (`labels.trailing_means`): after a
rollback, the steps trained again replace the ones rolled back.

Per setting group (every seed of one setting): collapse rate over the runs that finished, median
collapse step, median lead time, median best and final reward; and the statistics of the group as an
arm (`lldmon_lab.lab.stats`, over the finished runs):
- `collapse_ci`: Wilson score 95 % interval of the collapse rate;
- `p_vs_off`: one-sided Fisher exact p that this arm collapses less often than the `off` arm (LLDS
  off) of the same other settings (`block`: every setting but the LLDS mode, its lambda and policy);
- best and final reward: mean with a Student t 95 % interval (none below two runs);
- steps wasted: sum and mean per run.
`compare_arms` lists every test: each arm against `off`, and static `on` against `auto` and `auto`
against `heal` (two-sided, same block and lambda) where both exist.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from contracts import metrics as M
from lldmon_lab.lab.grid import MODE_POLICY, Setting
from lldmon_lab.lab.stats import Alternative, fisher_p, mean_interval, rate_interval
from lldmon_lab.labels import RULE_TEXT, collapse_step, trailing_means
from monitor.detector import COLLAPSE_WARNINGS, SEVERITY

__all__ = [
    "RULE_TEXT",
    "STATISTICS_TEXT",
    "TASK_SUCCESS",
    "Comparison",
    "Derived",
    "GroupStats",
    "Rollback",
    "analyse",
    "compare_arms",
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
    stopped_in_collapse: bool = False
    rollbacks: int = 0
    steps_redone: int = 0
    steps_after_collapse: int = 0
    steps_wasted: int = 0


@dataclass(frozen=True)
class Rollback:
    from_step: int
    to_step: int

    @property
    def redone(self) -> int:
        return self.from_step - self.to_step


def rollbacks_of(record: Mapping[str, Any]) -> list[Rollback]:
    """The record's `rollbacks` (module docstring); [] when absent or null."""
    raw = record.get("rollbacks")
    if raw is None:
        return []
    where = f"run record {record.get('key')!r}: rollbacks"
    if not isinstance(raw, list):
        raise ValueError(f"{where}: expected a list of {{from_step, to_step}} objects, got {raw!r}")
    out: list[Rollback] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where}[{i}]: expected an object with from_step and to_step, got {entry!r}")
        steps: dict[str, int] = {}
        for name in ("from_step", "to_step"):
            value = entry.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{where}[{i}]: {name} must be an integer >= 0, got {value!r}")
            steps[name] = value
        if steps["to_step"] > steps["from_step"]:
            raise ValueError(
                f"{where}[{i}]: to_step {steps['to_step']} is after from_step {steps['from_step']} "
                "(a rollback restores an earlier checkpoint)"
            )
        out.append(Rollback(**steps))
    return out


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


def announces_collapse(alert: Mapping[str, Any]) -> bool:
    """A collapse warning of the detector (`COLLAPSE_WARNINGS`) or a critical alert: what may count as a
    warning before a collapse. The severity is today's for the detector's kinds (records keep the one
    their service gave), the recorded one for other alerts (liveness, heal)."""
    kind = str(alert.get("kind"))
    return kind in COLLAPSE_WARNINGS or SEVERITY.get(kind, alert.get("severity")) == "critical"


def _min(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def analyse(record: Mapping[str, Any]) -> Derived:
    """The derived fields of a run record (module docstring)."""
    steps, values = _labelled_series(record)
    _, means = trailing_means(steps, values)
    alerts = sorted(
        (a for a in record.get("alerts", []) if announces_collapse(a)),
        key=lambda a: (int(a["first_step"]), str(a["kind"])),
    )
    phases = sorted(record.get("phases", []), key=lambda e: int(e["step"]))
    first_alert = int(alerts[0]["first_step"]) if alerts else None
    first_decay = _min(int(e["step"]) for e in phases if e["phase"] in ("decay", "collapse"))
    first_collapse = _min(int(e["step"]) for e in phases if e["phase"] == "collapse")
    first_directive = _min(
        None if d.get("step") is None else int(d["step"])
        for d in record.get("directives", [])
        if d.get("enabled")
    )
    run = record.get("run") or {}
    steps_done = None if run.get("last_step") is None else int(run["last_step"])
    planned = (record.get("setting") or {}).get("steps")
    stopped = (
        run.get("phase") == "collapse"
        and first_collapse is not None
        and steps_done is not None
        and planned is not None
        and steps_done < int(planned)
    )
    collapse = collapse_step(steps, values)
    stopped_in_collapse = collapse is None and stopped
    if stopped_in_collapse:
        collapse = first_collapse
    first_warning = _min([first_alert, first_decay])
    lead = None if collapse is None or first_warning is None else collapse - first_warning
    rollbacks = rollbacks_of(record)
    redone = sum(r.redone for r in rollbacks)
    after = max(0, steps_done - collapse) if steps_done is not None and collapse is not None else 0
    return Derived(
        steps_done=steps_done,
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
        stopped_in_collapse=stopped_in_collapse,
        rollbacks=len(rollbacks),
        steps_redone=redone,
        steps_after_collapse=after,
        steps_wasted=after + redone,
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
    arm: str = "off"
    """The LLDS mode (`off`, `on`, `auto`, `heal`), with `(policy P)` when the setting overrides the
    mode's policy."""
    block: str = ""
    """The settings but LLDS (the group key without its `llds-`/`pol-` parts): arms of one block are
    compared."""
    collapse_ci: tuple[float, float] | None = None
    """Wilson score 95 % interval of `collapse_rate`."""
    p_vs_off: float | None = None
    """One-sided Fisher exact p that this arm collapses less often than `off_group`."""
    off_group: str | None = None
    best_reward_mean: float | None = None
    best_reward_ci: tuple[float, float] | None = None
    """Student t 95 % interval of the mean (None below two finished runs)."""
    final_reward_mean: float | None = None
    final_reward_ci: tuple[float, float] | None = None
    rollbacks: int = 0
    steps_redone: int = 0
    steps_after_collapse: int = 0
    steps_wasted: int = 0
    """Over the finished runs: steps after the labelled collapse plus steps redone after rollbacks."""
    steps_wasted_mean: float | None = None


@dataclass(frozen=True)
class Comparison:
    """Fisher's exact test of two arms' collapse counts (collapsed of finished)."""

    block: str
    a: str
    b: str
    group_a: str
    group_b: str
    collapsed_a: int
    finished_a: int
    collapsed_b: int
    finished_b: int
    alternative: Alternative
    """"less": arm a collapses less often than arm b (one-sided); "two-sided": they differ."""
    p: float


STATISTICS_TEXT: Final = (
    "Collapse rate: collapsed of n finished runs (a run the service stopped in phase collapse before "
    "its planned steps counts as collapsed at the step it entered that phase), with a Wilson score 95 % "
    "interval. "
    "p vs off: one-sided Fisher exact test that the arm collapses less often than LLDS off with the same "
    "other settings; static on vs auto and auto vs heal: two-sided Fisher exact; p-values are not "
    "corrected for multiple comparisons. Rewards: mean over the finished runs of each run's best and "
    "final 10-step mean reward, with a Student t 95 % interval (n/a below 2 runs). Steps wasted: steps "
    "trained after the labelled collapse plus steps redone after rollbacks, sum (mean per run)"
)
"""How the per-arm statistics are computed (in summary.json and under the table in summary.md)."""

_ARM_FIELDS: Final = frozenset({"llds", "llds_lambda", "policy"})
_SETTING_DEFAULTS: Final = Setting().as_dict()
_MODE_PAIRS: Final = (("on", "auto"), ("auto", "heal"))
"""Arms compared two-sided (same block and lambda): static LLDS vs the detector's switch, and the
switch alone vs the switch with rollbacks."""


def _mode(setting: Mapping[str, Any]) -> str:
    return str(setting.get("llds") or "off")


def _arm_label(setting: Mapping[str, Any]) -> str:
    mode = _mode(setting)
    policy = setting.get("policy")
    if policy is not None and policy != MODE_POLICY.get(mode):
        return f"{mode} (policy {policy})"
    return mode


def _block_id(setting: Mapping[str, Any]) -> str:
    """Identity of the settings but LLDS; a record's missing keys take `Setting`'s defaults, so records
    written before an axis existed pair with newer ones of the same values."""
    merged = {**_SETTING_DEFAULTS, **setting}
    return json.dumps({k: v for k, v in merged.items() if k not in _ARM_FIELDS}, sort_keys=True, default=str)


def _block_label(group: str) -> str:
    return "_".join(p for p in group.split("_") if not p.startswith(("llds-", "pol-"))) or group


def _pair(ci: tuple[float | None, float | None] | None) -> tuple[float, float] | None:
    if ci is None or ci[0] is None or ci[1] is None:
        return None
    return ci[0], ci[1]


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def group_stats(records: Sequence[Mapping[str, Any]]) -> list[GroupStats]:
    """One row per setting group, in order of first appearance (module docstring)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault(str(r["group"]), []).append(r)
    blocks: dict[str, str] = {}  # block id -> label (of its first group)
    out: list[GroupStats] = []
    for name, members in groups.items():
        setting = dict(members[0].get("setting", {}))
        done = [(r, analyse(r)) for r in members if r.get("status") == FINISHED]
        collapse_steps = sorted(d.collapse_step for _, d in done if d.collapse_step is not None)
        leads = sorted(d.lead_time for _, d in done if d.lead_time is not None)
        best = [d.best_reward for _, d in done if d.best_reward is not None]
        final = [d.final_reward for _, d in done if d.final_reward is not None]
        best_ci, final_ci = mean_interval(best), mean_interval(final)
        wasted = sum(d.steps_wasted for _, d in done)
        out.append(
            GroupStats(
                group=name,
                setting=setting,
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
                arm=_arm_label(setting),
                block=blocks.setdefault(_block_id(setting), _block_label(name)),
                collapse_ci=rate_interval(len(collapse_steps), len(done)),
                best_reward_mean=None if best_ci is None else best_ci.mean,
                best_reward_ci=None if best_ci is None else _pair((best_ci.low, best_ci.high)),
                final_reward_mean=None if final_ci is None else final_ci.mean,
                final_reward_ci=None if final_ci is None else _pair((final_ci.low, final_ci.high)),
                rollbacks=sum(d.rollbacks for _, d in done),
                steps_redone=sum(d.steps_redone for _, d in done),
                steps_after_collapse=sum(d.steps_after_collapse for _, d in done),
                steps_wasted=wasted,
                steps_wasted_mean=wasted / len(done) if done else None,
            )
        )
    vs_off = {c.group_a: c for c in compare_arms(out) if c.alternative == "less"}
    return [
        replace(g, p_vs_off=vs_off[g.group].p, off_group=vs_off[g.group].group_b) if g.group in vs_off else g
        for g in out
    ]


def _reference_off(arms: Sequence[GroupStats]) -> GroupStats | None:
    """The block's `off` arm: LLDS off with its own policy (alert), else any LLDS-off arm."""
    off = [g for g in arms if _mode(g.setting) == "off"]
    plain = [g for g in off if g.arm == "off"]
    return next(iter(plain or off), None)


def _test(block: str, a: GroupStats, b: GroupStats, alternative: Alternative) -> Comparison | None:
    p = fisher_p(a.collapsed, a.finished, b.collapsed, b.finished, alternative)
    if p is None:
        return None
    return Comparison(
        block,
        a.arm,
        b.arm,
        a.group,
        b.group,
        a.collapsed,
        a.finished,
        b.collapsed,
        b.finished,
        alternative,
        p,
    )


def compare_arms(groups: Sequence[GroupStats]) -> list[Comparison]:
    """Fisher's exact tests between the arms of each block (settings equal but LLDS): every arm against
    the block's `off` arm (one-sided: collapses less), then `on` vs `auto` and `auto` vs `heal` of the
    same lambda (two-sided). A pair where an arm has no finished run is left out."""
    blocks: dict[str, list[GroupStats]] = {}
    for g in groups:
        blocks.setdefault(_block_id(g.setting), []).append(g)
    out: list[Comparison] = []
    for arms in blocks.values():
        label = arms[0].block or _block_label(arms[0].group)
        off = _reference_off(arms)
        tests: list[tuple[GroupStats, GroupStats, Alternative]] = []
        if off is not None:
            tests += [(g, off, "less") for g in arms if g is not off]
        for mode_a, mode_b in _MODE_PAIRS:
            tests += [
                (a, b, "two-sided")
                for a in arms
                if a.arm == mode_a
                for b in arms
                if b.arm == mode_b and a.setting.get("llds_lambda") == b.setting.get("llds_lambda")
            ]
        out += [t for a, b, alternative in tests if (t := _test(label, a, b, alternative)) is not None]
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
    """`summary.json`: the rule, one row per run, one per setting group (an arm, with its statistics),
    the tests between arms and how they are computed (strict JSON)."""
    groups = group_stats(records)
    return {
        **(dict(meta) if meta else {}),
        "rule": RULE_TEXT,
        "statistics": STATISTICS_TEXT,
        "runs": [_run_row(r) for r in records],
        "groups": [asdict(g) for g in groups],
        "comparisons": [asdict(c) for c in compare_arms(groups)],
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


def _rate_cell(g: Mapping[str, Any]) -> str | None:
    if g["collapse_rate"] is None or g["collapse_ci"] is None:
        return None
    low, high = g["collapse_ci"]
    return f"{g['collapse_rate']:.1%} [{low:.1%}, {high:.1%}]"


def _p_cell(p: float | None) -> str | None:
    if p is None:
        return None
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _mean_cell(mean: float | None, ci: Sequence[float] | None) -> str | None:
    if mean is None:
        return None
    return f"{mean:.3f} [n/a]" if ci is None else f"{mean:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def _arm_rows(groups: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    order = {block: i for i, block in enumerate(dict.fromkeys(g["block"] for g in groups))}
    return [
        [
            g["block"],
            g["arm"],
            g["finished"],
            f"{g['collapsed']}/{g['finished']}",
            _rate_cell(g),
            _p_cell(g["p_vs_off"]),
            _mean_cell(g["best_reward_mean"], g["best_reward_ci"]),
            _mean_cell(g["final_reward_mean"], g["final_reward_ci"]),
            None
            if g["steps_wasted_mean"] is None
            else f"{g['steps_wasted']} ({g['steps_wasted_mean']:.1f}/run)",
        ]
        for g in sorted(groups, key=lambda g: order[g["block"]])
    ]


def render_markdown(payload: Mapping[str, Any]) -> str:
    """`summary.md`: the per-arm statistics and tests, the per-group table, then the per-run table."""
    lines = ["# Collapse lab summary", ""]
    if payload.get("command"):
        lines += [f"Command: `{payload['command']}`", ""]
    lines += [f"Rule: {payload['rule']}.", ""]
    lines += ["## Per arm (over seeds)", ""]
    lines += _md_table(
        [
            "settings (LLDS aside)",
            "arm",
            "n",
            "collapsed",
            "rate [95 % CI, Wilson]",
            "p vs off (Fisher, one-sided)",
            "best reward, mean [95 % CI, t]",
            "final reward, mean [95 % CI, t]",
            "steps wasted, sum (mean)",
        ],
        _arm_rows(payload["groups"]),
    )
    lines += ["", f"Statistics: {payload['statistics']}.", ""]
    if payload["comparisons"]:
        lines += ["## Between arms (Fisher exact test of collapsed / finished)", ""]
        lines += _md_table(
            ["settings (LLDS aside)", "arm a", "arm b", "a collapsed", "b collapsed", "test", "p"],
            [
                [
                    c["block"],
                    c["a"],
                    c["b"],
                    f"{c['collapsed_a']}/{c['finished_a']}",
                    f"{c['collapsed_b']}/{c['finished_b']}",
                    "one-sided (a less)" if c["alternative"] == "less" else c["alternative"],
                    _p_cell(c["p"]),
                ]
                for c in payload["comparisons"]
            ],
        )
        lines += [""]
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
            "rollbacks",
            "steps wasted",
        ],
        [
            [
                r["run_name"] or r["key"],
                r["seed"],
                r["status"],
                f"{_cell(r['steps_done'])}/{_cell(r['steps_planned'])}",
                f"{r['collapse_step']} (stopped)" if r.get("stopped_in_collapse") else r["collapse_step"],
                None if r["first_alert"] is None else f"{r['first_alert']} ({r['first_alert_kind']})",
                r["first_decay"],
                r["first_collapse_phase"],
                r["first_directive"],
                r["lead_time"],
                r["best_reward"],
                r["final_reward"],
                r["final_phase"],
                r["rollbacks"],
                f"{r['steps_wasted']} ({r['steps_after_collapse']} + {r['steps_redone']} redone)"
                if r["steps_redone"]
                else r["steps_wasted"],
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

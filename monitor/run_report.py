"""`lldmon runs show`: a RunSummary as rich text for people and as strict JSON for scripts."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from contracts import metrics as m
from contracts.wire import encode_float, encode_json
from monitor.cli._common import shown
from monitor.detector.explain import reopened_text
from monitor.domain import AlertInfo, DirectiveInfo, RunSummary

KEY_METRICS: Final = (
    m.REWARD_MEAN,
    m.LOGP_POS,
    m.LOGP_NEG,
    m.LOGP_CORRECT,
    m.ANCHOR_LOGP,
    m.DELTA_TRAJ_POS,
    m.DELTA_ACTION_POS,
    m.FRAC_TRAJ_DECREASED_POS,
    m.XMB_DELTA_TRAJ_POS,
    m.ENTROPY_MEAN,
    m.GRAD_NORM,
    m.LOSS,
    m.KL_REF,
    m.KL_OLD,
    m.CLIP_FRAC,
    m.RESPONSE_LENGTH_MEAN,
    m.SEARCH_VALID_PER_TRAJ,
    m.LLDS_ACTIVE,
    m.LLDS_LAMBDA,
)
"""Printed in this order when the run has them; `--json` carries every metric."""


def summary_json(s: RunSummary) -> dict[str, Any]:
    """Strict JSON (no NaN tokens): non-finite values are the wire strings 'NaN', 'Infinity', ..."""
    run = s.run
    return {
        "id": run.id,
        "name": run.name,
        "project": run.project,
        "status": run.status,
        "phase": run.phase,
        "directive_policy": run.directive_policy,
        "tags": run.tags,
        "config": encode_json(run.config),
        "created_at": _iso(run.created_at),
        "last_seen_at": _iso(run.last_seen_at),
        "finished_at": _iso(run.finished_at),
        "steps": {"count": s.n_steps, "first": s.first_step, "last": s.last_step},
        "metrics": {
            x.name: {
                "last_step": x.last_step,
                "last_value": encode_float(x.last_value),
                "first_step": x.first_step,
                "points": x.points,
            }
            for x in s.metrics
        },
        "phases": [
            {
                "phase": e.phase,
                "step": e.step,
                "previous_phase": e.previous_phase,
                "created_at": _iso(e.created_at),
                "evidence": encode_json(e.evidence),
            }
            for e in s.phases
        ],
        "alerts": [_alert_json(a) for a in s.alerts],
        "directive": _directive_json(s.directive),
        "directives": [_directive_json(d) for d in s.directives],
        "rollbacks": [
            {
                "from_step": r.from_step,
                "to_step": r.to_step,
                "steps_redone": r.steps_redone,
                "version": r.version,
                "undone_phases": r.undone_phases,
                "created_at": _iso(r.created_at),
            }
            for r in s.rollbacks
        ],
    }


def render_summary(s: RunSummary, console: Console) -> None:
    run = s.run
    console.print(
        f"[bold]run {run.id}[/bold]  {shown(run.project)} / [bold]{shown(run.name)}[/bold]  "
        f"status {run.status}, phase [bold]{run.phase or 'none yet'}[/bold], policy {run.directive_policy}"
    )
    console.print(
        f"created {_when(run.created_at)}, last seen {_when(run.last_seen_at)}"
        + (f", finished {_when(run.finished_at)}" if run.finished_at else "")
        + (f"; tags: {shown(', '.join(run.tags))}" if run.tags else "")
    )
    if s.n_steps:
        console.print(
            f"{_n(s.n_steps, 'step')} logged (steps {s.first_step}-{s.last_step}), "
            f"{_n(len(s.metrics), 'metric')}"
        )
    else:
        console.print("no metrics logged yet")

    by_name = {x.name: x for x in s.metrics}
    key = [by_name[name] for name in KEY_METRICS if name in by_name]
    if key:
        table = Table("metric", "last value", "at step", title="Last values", title_justify="left")
        for x in key:
            table.add_row(shown(x.name), format_value(x.last_value), str(x.last_step))
        console.print(table)
    others = len(s.metrics) - len(key)
    if others:
        console.print(f"{_n(others, 'more metric')}: --json, or lldmon export {run.id}")

    if s.phases:
        table = Table("phase", "from step", "previous", "detected at", title="Phases", title_justify="left")
        for e in s.phases:
            table.add_row(e.phase, str(e.step), e.previous_phase or "", _when(e.created_at))
        console.print(table)
    else:
        console.print("no phase changes yet")
    for r in s.rollbacks:
        undone = ", ".join(f"{p['phase']} at {p['step']}" for p in r.undone_phases) or "no phase changes"
        console.print(
            f"rolled back {_when(r.created_at)}: trained to step {r.from_step}, restored step {r.to_step} "
            f"({_n(r.steps_redone, 'step')} redone; undone: {shown(undone)})"
        )

    if s.alerts:
        table = Table(
            "id",
            "rule",
            "severity",
            "steps",
            "state",
            "acked",
            "message",
            title="Alerts",
            title_justify="left",
        )
        for a in s.alerts:
            table.add_row(
                str(a.id),
                a.kind,
                a.severity,
                f"{a.first_step}-{a.last_step}",
                a.status + (f", {reopened_text(a.reopen_count)}" if a.reopen_count else ""),
                _when(a.acknowledged_at) if a.acknowledged_at else "no",
                shown(a.message),
            )
        console.print(table)
    else:
        console.print("no alerts")

    if s.directives:
        table = Table(
            "v", "when", "step", "by", "LLDS", "lambda", "reason", title="Directives", title_justify="left"
        )
        for d in s.directives:
            table.add_row(
                str(d.version),
                _when(d.updated_at),
                "" if d.step is None else str(d.step),
                shown(d.source),
                "on" if d.llds.enabled else "off",
                f"{d.llds.lam:g}",
                shown(d.reason),
            )
        console.print(table)
    else:
        d = s.directive
        console.print(f"directive: default (LLDS {'on' if d.llds.enabled else 'off'}, lambda {d.llds.lam:g})")


def format_value(value: float) -> str:
    """Six significant digits; NaN and +-inf spelled out (they are collapse signals, not gaps)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.6g}"


def _alert_json(a: AlertInfo) -> dict[str, Any]:
    return {
        "id": a.id,
        "kind": a.kind,
        "severity": a.severity,
        "status": a.status,
        "first_step": a.first_step,
        "last_step": a.last_step,
        "resolved_step": a.resolved_step,
        "reopen_count": a.reopen_count,
        "message": a.message,
        "acknowledged": a.acknowledged_at is not None,
        "acknowledged_at": _iso(a.acknowledged_at),
        "resolved_at": _iso(a.resolved_at),
        "created_at": _iso(a.created_at),
    }


def _directive_json(d: DirectiveInfo) -> dict[str, Any]:
    """The API's directive (`DirectiveOut`): its wire body plus when it was made and acknowledged."""
    return {**d.to_wire(), "updated_at": _iso(d.updated_at), "applied_step": d.applied_step}


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def _when(t: datetime | None) -> str:
    return "" if t is None else t.strftime("%Y-%m-%d %H:%M:%S")

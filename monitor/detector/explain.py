"""Detector evidence as sentences a person can read (pure: no I/O, no state).

The detector stores its evidence as JSON for machines: indicator dicts (`fired`, `metric`, `statistic`,
`threshold`, `window`, `statistic_is` and details such as `recent_median` or `reference_level`), nested
under `signals` for phase changes and phase findings, next to bookkeeping keys (`active_at`,
`phase_since`, `degraded`, `confirmations`, ...). This module turns any such dict into short lines for the
API, the alert payloads and the dashboard:

    likelihood of A>0 responses declining: Mann-Kendall Z = -6.67 (threshold -3) over the last 30 steps
    (steps 81-110); lld/logp_pos now -0.42 vs baseline -0.29, Theil-Sen slope -0.00121 per step

Every statistic is named next to its value, the metric's own recent value sits next to its baseline, and
no internal key is printed. The renderer is tolerant: unknown keys are ignored, missing keys skipped,
malformed values never raise (evidence comes from the database and may predate today's detector).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

SIGNAL_NAMES: Final[dict[str, str]] = {
    # phase I / II (likelihood, hook metrics)
    "logp_pos_flat": "likelihood of A>0 responses flat",
    "logp_pos_decline": "likelihood of A>0 responses declining",
    "logp_pos_sharp_drop": "likelihood of A>0 responses dropping sharply",
    "logp_correct_decline": "likelihood of correct responses declining",
    "logp_correct_sharp_drop": "likelihood of correct responses dropping sharply",
    "anchor_decline": "likelihood of the anchor responses declining",
    "anchor_sharp_drop": "likelihood of the anchor responses dropping sharply",
    "frac_decreased_rising": "share of A>0 responses losing likelihood rising",
    "frac_correct_decreased_rising": "share of correct responses losing likelihood rising",
    "frac_decreased_majority": "most A>0 responses losing likelihood",
    "frac_majority": "most responses losing likelihood",
    "delta_traj_pos_negative": "A>0 responses' likelihood change mostly negative",
    "delta_traj_correct_negative": "correct responses' likelihood change mostly negative",
    # reward
    "reward_rising": "reward still rising",
    "reward_rising_long": "reward rising over the long window",
    "reward_trend": "reward trend",
    "reward_crash": "reward crash",
    "reward_slide": "reward slid below half its range with a pathology active",
    "reward_zero": "reward dropped to about zero",
    "reward_decline": "reward lost half of its gains",
    # phase III surges and terminal signatures
    "grad_surge": "gradient-norm surge",
    "entropy_surge": "entropy surge",
    "entropy_explosion": "entropy explosion",
    "entropy_collapse": "entropy collapse",
    "length_explosion": "response-length explosion",
    "length_collapse": "response-length collapse",
    "invalid_action_surge": "surge of invalid actions",
    "training_collapse": "training collapse",
    "dead_run": "run no longer learning",
    "kl_blowup": "KL divergence blow-up",
    "ratio_blowup": "importance-ratio blow-up",
    "clip_ratio_saturated": "clip fraction saturated",
    "garbled_outputs": "garbled outputs",
    "advantage_collapse": "advantage collapse (no gradient signal)",
    "lld_crash": "likelihood crash of A>0 responses with an entropy / length surge",
    "entropy_rise": "sustained entropy rise",
    "length_surge": "response-length surge",
    "not_learning": "not learning",
    "nonfinite_grad": "non-finite gradient norm",
    "nonfinite_loss": "non-finite loss",
    # phase findings and reasons
    "lld_decay": "likelihood decay (phase II)",
    "lld_collapse": "likelihood collapse (phase III)",
    "warmup_done": "warm-up done",
}
"""Display names of detector signals and finding kinds; `display_name` turns unknown snake_case into words."""

PHASE_DESCRIPTIONS: Final[dict[str, str]] = {
    "warmup": "warm-up: collecting baselines, no verdict yet",
    "healthy": "healthy: no sign of likelihood displacement",
    "stagnation": "phase I (stagnation): likelihood of A>0 responses flat while the reward rises",
    "decay": "phase II (decay): likelihood of A>0 responses declining while the reward still rises",
    "collapse": "phase III (collapse): the outcome is damaged (reward crash or at its floor, valid actions gone, "
    "dead run, garbled or empty outputs after a healthy start)",
    "not_learning": "not learning: no reward rise, outputs garbled or empty since the start (nothing to collapse)",
}
"""What each detector phase means (the run page's legend and the phase-change headline)."""

INTERNAL_KEYS: Final = frozenset(
    {"active_at", "phase_since", "degraded", "confirmations", "baselines", "fired", "cache", "explanation"}
)
"""Bookkeeping keys never printed as such (some are rendered as words, e.g. `degraded` + `explanation`)."""

_RECENT_KEYS: Final = ("recent", "recent_median", "smoothed", "median", "value")
_BASELINE_KEYS: Final = ("baseline", "baseline_median", "reference_level")
_DETAIL_LABELS: Final = (
    ("running_peak", "peak"),
    ("zero_level", "zero level"),
    ("decline_level", "half-way level"),
    ("clear_below", "clears below"),
)
_STAT_FALLBACK: Final = (
    # a detail key that holds the same number as `statistic` names it when `statistic_is` is missing
    ("ratio", "ratio of recent median to baseline median"),
    ("slope_z", "Mann-Kendall Z"),
    ("smoothed", "smoothed recent value"),
    ("recent_median", "median of recent points"),
    ("median", "median of recent points"),
    ("robust_z", "robust z-score"),
)
_SLOPE_NOTE = re.compile(r"^(?P<name>.+?)\s*\(slope:\s*(?P<slope>[^)]+)\)\s*$")
_INDICATOR_KEYS: Final = frozenset({"fired", "metric", "statistic", "statistic_is"})
_NONFINITE_TEXT: Final = {"NaN": "NaN", "Infinity": "+inf", "-Infinity": "-inf", "nan": "NaN", "inf": "+inf"}


# --- small formatters -------------------------------------------------------------------------------------


def display_name(name: str) -> str:
    """A signal's or finding's display name ("grad_surge" -> "gradient-norm surge"); unknown names in words."""
    known = SIGNAL_NAMES.get(name)
    if known is not None:
        return known
    return re.sub(r"[_\s]+", " ", name).strip() or name


def fmt_number(value: Any) -> str:
    """3 significant digits without exponent where readable (5.512 -> "5.51", 3.0 -> "3", 0.00576)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _NONFINITE_TEXT.get(value, value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+inf" if value > 0 else "-inf"
        rounded = float(f"{value:.3g}")
        if rounded == 0:
            return "0"
        if rounded.is_integer() and abs(rounded) < 1e15:
            return str(int(rounded))
        if abs(rounded) >= 1e-4:
            return repr(rounded)  # plain decimals down to 1e-4 (repr switches to exponents below)
        return f"{rounded:.2e}"
    return str(value)


def _signed(value: Any) -> str:
    text = fmt_number(value)
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return "+" + text
    return text


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int | float) or (isinstance(value, str) and value in _NONFINITE_TEXT)


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _is_indicator(value: Any) -> bool:
    return isinstance(value, Mapping) and any(k in value for k in _INDICATOR_KEYS)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _restates(meaning: str, subject: str) -> bool:
    """The detector's sentence only repeats the display name ("likelihood dropping sharply")."""
    words, known = _words(meaning), set(_words(subject))
    return bool(words) and sum(w in known for w in words) >= 0.6 * len(words)


# --- one indicator ----------------------------------------------------------------------------------------


def _statistic_name(ind: Mapping[str, Any]) -> tuple[str, str | None]:
    """(name of the statistic, name of the slope estimator if the name mentions one)."""
    named = ind.get("statistic_is")
    if isinstance(named, str) and named.strip():
        match = _SLOPE_NOTE.match(named.strip())
        if match:
            return match["name"], match["slope"].strip()
        return named.strip(), None
    stat = ind.get("statistic")
    for key, label in _STAT_FALLBACK:
        other = ind.get(key)
        if _is_number(stat) and _is_number(other) and fmt_number(other) == fmt_number(stat):
            return label, None
    return "statistic", None


def _window_text(ind: Mapping[str, Any], end: int | None) -> str:
    window = _as_int(ind.get("window"))
    if window is None or window <= 0:
        return ""
    if window == 1:
        return f" at step {end}" if end is not None else " at the last step"
    text = f" over the last {window} steps"
    if end is not None:
        text += f" (steps {max(0, end - window + 1)}-{end})"
    return text


def _value_clause(ind: Mapping[str, Any]) -> str:
    metric = ind.get("metric")
    metric_text = metric if isinstance(metric, str) and metric else "the metric"
    recent = next((ind[k] for k in _RECENT_KEYS if _is_number(ind.get(k))), None)
    baseline = next((ind[k] for k in _BASELINE_KEYS if _is_number(ind.get(k))), None)
    parts: list[str] = []
    if recent is not None and baseline is not None:
        parts.append(f"now {fmt_number(recent)} vs baseline {fmt_number(baseline)}")
    elif recent is not None:
        parts.append(f"now {fmt_number(recent)}")
    elif baseline is not None:
        parts.append(f"baseline {fmt_number(baseline)}")
    for key, label in _DETAIL_LABELS:
        if _is_number(ind.get(key)):
            parts.append(f"{label} {fmt_number(ind[key])}")
    if _is_number(ind.get("slope_per_step")):
        _, estimator = _statistic_name(ind)
        slope = f"{_signed(ind['slope_per_step'])} per step"
        parts.append(f"{estimator} slope {slope}" if estimator else f"slope {slope}")
    if not parts:
        return ""
    return f"; {metric_text} {', '.join(parts)}"


def explain_indicator(name: str | None, ind: Mapping[str, Any], *, step: int | None = None) -> str:
    """One line for one indicator dict: what fired, the statistic by name, the metric's own values."""
    metric = _as_text(ind.get("metric")) or None
    subject = display_name(name) if name else ("signal" if metric is None else f"signal on {metric}")
    names_metric = not name and metric is not None
    tag = " (not fired)" if ind.get("fired") is False else ""
    meaning = _as_text(ind.get("meaning"))
    meaning = meaning.strip().rstrip(".") if meaning else ""
    lead = f"{meaning}; " if meaning and not _restates(meaning, subject) else ""
    stat = ind.get("statistic")
    window = _window_text(ind, step)
    if _is_number(stat):
        stat_name, _ = _statistic_name(ind)
        body = f"{stat_name} = {fmt_number(stat)}"
        if _is_number(ind.get("threshold")):
            body += f" (threshold {fmt_number(ind['threshold'])})"
        clause = _value_clause(ind)
        if not clause and metric is not None and not names_metric:
            subject += f" on {metric}"  # the statistic is of this metric; no other values to show
        return f"{subject}{tag}: {lead}{body}{window}{clause}"
    value = ind.get("value")
    if value is not None and metric is not None:
        return f"{subject}{tag}: {lead}{metric} = {fmt_number(value)}{window}"
    clause = _value_clause(ind).removeprefix("; ")
    note = _as_text(ind.get("note"))  # why a signal could not be computed ("not enough data")
    if not clause and metric is not None and not names_metric:
        clause = f"{note} for {metric}" if note else f"metric {metric}"
    elif note:
        clause = f"{note}; {clause}" if clause else note
    pieces = [p for p in (lead.removesuffix("; "), window.strip(), clause) if p]
    return f"{subject}{tag}: {'; '.join(pieces)}" if pieces else subject + tag


# --- whole evidence dicts ---------------------------------------------------------------------------------


def _end_step(evidence: Mapping[str, Any], step: int | None) -> int | None:
    """The step the statistics were computed at: the finding's last active step, else the given step."""
    active = _as_int(evidence.get("active_at"))
    return active if active is not None else step


def _baselines_line(evidence: Mapping[str, Any]) -> str | None:
    baselines = evidence.get("baselines")
    if not isinstance(baselines, Mapping):
        return None
    shown = _as_text(evidence.get("metric"))
    parts = [
        f"{metric} {fmt_number(value)}"
        for metric, value in baselines.items()
        if _is_number(value) and not (metric == shown and _is_number(evidence.get("baseline")))
    ]
    return "baseline " + ", ".join(parts) if parts else None


def _as_text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def degraded_line(evidence: Mapping[str, Any]) -> str | None:
    """The degraded-mode sentence, only where the evidence says degraded is true."""
    if evidence.get("degraded") is not True:
        return None
    explanation = evidence.get("explanation")
    if isinstance(explanation, str) and explanation.strip():
        return f"degraded mode: {explanation.strip()}"
    return "degraded mode: some detector inputs are missing, so some phases cannot be detected"


def explain_evidence(
    evidence: Mapping[str, Any], *, step: int | None = None, name: str | None = None
) -> list[str]:
    """Evidence as short human lines: what fired first, then the signals that support it, then notes,
    and last one line naming the signals that were checked and did not fire (a reader must never take
    a quiet signal for a reason), then baselines and degraded mode.

    What fired is, in order: the evidence's own indicator (a finding's), then its `reasons` (the
    signals that decided a phase change, each with its statistic, and finding kinds or events such as
    a critical finding, named in a "because:" line); the other fired `signals` support it.

    `step` is where the evidence was computed (it dates the windows); `name` labels a flat indicator dict
    (a finding's kind). Unknown keys are ignored and nothing here raises on malformed input."""
    if not isinstance(evidence, Mapping):
        return []
    try:
        return _explain(evidence, step, name)
    except Exception:  # evidence is untrusted JSON: never let a display helper break a page or a payload
        return []


def _explain(evidence: Mapping[str, Any], step: int | None, name: str | None) -> list[str]:
    end = _end_step(evidence, step)
    lines: list[str] = []
    if _is_indicator(evidence):
        lines.append(explain_indicator(name, evidence, step=end))
    signals = evidence.get("signals")
    items = (
        [(str(k), v) for k, v in signals.items() if isinstance(v, Mapping)]
        if isinstance(signals, Mapping)
        else []
    )
    fired = {k: v for k, v in items if v.get("fired") is not False}
    quiet = [(k, v) for k, v in items if v.get("fired") is False]
    raw = evidence.get("reasons")
    reasons = [r for r in raw if isinstance(r, str)] if isinstance(raw, list | tuple) else []
    notes = [r.strip("() ") for r in reasons if r.startswith("(")]  # "(collapse signals not yet confirmed)"
    decided = list(dict.fromkeys(r for r in reasons if r in fired))
    checked = {k for k, _ in quiet}
    because = [
        display_name(r) for r in reasons if r not in fired and r not in checked and not r.startswith("(")
    ]
    if because:  # a reason that is no signal: a critical finding, the end of the warm-up, a recovery
        lines.append("because: " + ", ".join(because))
    lines += [explain_indicator(k, fired[k], step=end) for k in decided]
    lines += [explain_indicator(k, v, step=end) for k, v in fired.items() if k not in decided]
    lines += [n for n in notes if n]
    if quiet:
        quiet.sort(key=lambda kv: not _is_number(kv[1].get("statistic")))  # not computed: last
        lines.append("checked, not fired: " + "; ".join(_quiet_text(k, v) for k, v in quiet))
    baselines = _baselines_line(evidence)
    if baselines:
        lines.append(baselines)
    degraded = degraded_line(evidence)
    if degraded:
        lines.append(degraded)
    return lines


def _quiet_text(name: str, ind: Mapping[str, Any]) -> str:
    """A signal that did not fire, briefly: its name and how far its statistic was from the threshold
    ("gradient-norm surge 1.04 (threshold 5)"), or why it could not be computed."""
    stat = ind.get("statistic")
    if _is_number(stat):
        text = f"{display_name(name)} {fmt_number(stat)}"
        if _is_number(ind.get("threshold")):
            text += f" (threshold {fmt_number(ind['threshold'])})"
        return text
    note = _as_text(ind.get("note"))
    return f"{display_name(name)} ({note.strip()})" if note and note.strip() else display_name(name)


def explain_finding(kind: str, message: str, evidence: Mapping[str, Any], step: int | None) -> list[str]:
    """Lines for a finding / alert (its message is shown next to them, not repeated here)."""
    lines = explain_evidence(evidence, step=step, name=kind)
    active = _as_int(evidence.get("active_at")) if isinstance(evidence, Mapping) else None
    if active is not None and step is not None and active > step:
        lines.append(f"active since step {step}, last seen at step {active}")
    if not lines and message.strip():
        lines.append(message.strip())
    return lines


def alert_steps(first_step: int, last_step: int | None, reopen_count: int = 0) -> str:
    """An alert's span in words: "steps 157-256" (from the step its condition started at to the last step
    it held) or "step 157", then " (re-opened 3 times)" when it continued after resolving (a flicker)."""
    last = first_step if last_step is None else max(first_step, last_step)
    text = f"step {first_step}" if last == first_step else f"steps {first_step}-{last}"
    reopened = reopened_text(reopen_count)
    return f"{text} ({reopened})" if reopened else text


def reopened_text(reopen_count: int) -> str:
    """ "re-opened once", "re-opened 3 times"; "" for an alert that never re-opened."""
    if reopen_count <= 0:
        return ""
    return "re-opened " + ("once" if reopen_count == 1 else f"{reopen_count} times")


def explain_phase_change(
    phase: str, previous: str | None, evidence: Mapping[str, Any], step: int | None
) -> list[str]:
    """A headline ("stagnation → decay at step 74: phase II: likelihood decays") and the evidence lines."""
    note = evidence.get("note") if isinstance(evidence, Mapping) else None
    what = note.strip() if isinstance(note, str) and note.strip() else PHASE_DESCRIPTIONS.get(phase, phase)
    at = f" at step {step}" if step is not None else ""
    headline = f"{previous or 'start'} → {phase}{at}: {what}"
    return [headline, *explain_evidence(evidence, step=step)]

"""Evidence in words: statistics named, metric values next to baselines, no internal keys."""

from __future__ import annotations

import re
from typing import Any

import pytest

from monitor.detector.explain import (
    INTERNAL_KEYS,
    PHASE_DESCRIPTIONS,
    SIGNAL_NAMES,
    alert_steps,
    display_name,
    explain_evidence,
    explain_finding,
    explain_phase_change,
    fmt_number,
)
from monitor.detector.types import PHASES

DEGRADED = "likelihood metrics are absent; only phase III is detected."

# As the issue reports it: a Mann-Kendall Z that read as a log-prob, next to internal keys.
ISSUE_EVIDENCE: dict[str, Any] = {
    "degraded": False,
    "phase_since": 90,
    "active_at": 110,
    "signals": {
        "grad_surge": {
            "fired": False,
            "metric": "grad/norm",
            "statistic": 1.039212,
            "threshold": 5.0,
            "window": 5,
            "recent_median": 0.822069,
            "baseline_median": 0.79105,
            "ratio": 1.039212,
        },
        "logp_pos_decline": {
            "fired": True,
            "metric": "lld/logp_pos",
            "statistic": -6.673,
            "threshold": -3,
            "window": 30,
            "statistic_is": "Mann-Kendall Z (slope: Theil-Sen)",
            "slope_per_step": -0.00121,
            "recent": -0.4213,
            "reference_level": -0.289731,
        },
    },
}

# What today's detector stores for a phase change (monitor.detector.phases) ...
PHASE_II: dict[str, Any] = {
    "reasons": ["logp_pos_decline"],
    "confirmations": 5,
    "note": "phase II: likelihood decays",
    "signals": {
        "logp_pos_decline": ISSUE_EVIDENCE["signals"]["logp_pos_decline"],
        "reward_rising": {
            "fired": True,
            "metric": "reward/mean",
            "statistic": 6.97,
            "threshold": 3.0,
            "window": 71,
            "slope_per_step": 0.002245,
            "statistic_is": "Mann-Kendall Z (slope: Theil-Sen)",
        },
    },
    "degraded": False,
}

# ... and for a threshold finding in degraded mode (imported log, no hook metrics).
KL_DEGRADED: dict[str, Any] = {
    "degraded": True,
    "explanation": DEGRADED,
    "fired": True,
    "metric": "kl/old",
    "statistic": 0.101075,
    "threshold": 0.1,
    "window": 5,
    "direction": "above",
    "statistic_is": "median of recent points",
    "baseline": 0.004794,
    "baselines": {"kl/ref": 0.002, "kl/old": 0.004794},
    "active_at": 152,
}


def assert_no_internal_keys(lines: list[str]) -> None:
    text = "\n".join(lines).replace("checked, not fired:", "")  # the quiet signals' heading is words
    for key in INTERNAL_KEYS:  # as a key ("degraded: False"); "(not fired)", "degraded mode" are words
        assert not re.search(rf"\b{key}\b\s*[:=\]]", text), (key, text)
    for key in ("active_at", "phase_since", "confirmations", "baselines"):
        assert key not in text
    assert "False" not in text and "True" not in text
    assert "{" not in text and "[" not in text


def test_the_issue_example_names_the_statistic_and_shows_the_log_prob() -> None:
    lines = explain_evidence(ISSUE_EVIDENCE, step=90)
    assert lines[0] == (
        "likelihood of A>0 responses declining: Mann-Kendall Z = -6.67 (threshold -3) over the last 30 steps"
        " (steps 81-110); lld/logp_pos now -0.421 vs baseline -0.29, Theil-Sen slope -0.00121 per step"
    )
    # A signal that did not fire is never a line of its own: only named, last, under its heading.
    assert lines[1] == "checked, not fired: gradient-norm surge 1.04 (threshold 5)"
    assert len(lines) == 2
    assert_no_internal_keys(lines)


# What the detector stores when a critical finding puts a run in phase III: the finding is the reason, and
# the phase's own signals are checked too (here none of them fired).
DEAD_RUN_COLLAPSE: dict[str, Any] = {
    "reasons": ["dead_run"],
    "confirmations": 1,
    "note": "critical finding: dead_run",
    "signals": {
        "reward_crash": {
            "fired": False,
            "metric": "reward/mean",
            "statistic": 0.91,
            "threshold": 0.5,
            "window": 10,
            "statistic_is": "smoothed reward over its running peak",
        },
        "grad_surge": {"fired": False, "metric": "grad/norm", "statistic": None, "note": "not enough data"},
        "entropy_surge": {
            "fired": True,
            "metric": "entropy/mean",
            "statistic": 3.2,
            "threshold": 3.0,
            "window": 5,
            "ratio": 3.2,
        },
    },
}


def test_a_phase_change_opens_with_what_fired_and_never_with_a_quiet_signal() -> None:
    """Regression: the explanation of a collapse opened with "reward crash (not fired)"."""
    lines = explain_phase_change("collapse", "healthy", DEAD_RUN_COLLAPSE, 157)
    assert lines[0] == "healthy → collapse at step 157: critical finding: dead_run"
    assert lines[1] == "because: run no longer learning"  # what fired first
    assert lines[2].startswith(
        "entropy surge on entropy/mean: ratio of recent median to baseline median = 3.2"
    )
    assert (
        lines[3]
        == "checked, not fired: reward crash 0.91 (threshold 0.5); gradient-norm surge (not enough data)"
    )
    assert len(lines) == 4
    assert not any("(not fired)" in line for line in lines)
    assert_no_internal_keys(lines)


def test_reasons_come_first_in_their_order_then_supporting_signals_then_notes() -> None:
    evidence = {
        "reasons": ["reward_rising", "logp_pos_decline", "(collapse signals not yet confirmed)"],
        "signals": {**PHASE_II["signals"], "grad_surge": ISSUE_EVIDENCE["signals"]["grad_surge"]},
    }
    lines = explain_evidence(evidence, step=110)
    assert [line.split(":")[0] for line in lines] == [
        "reward still rising",
        "likelihood of A>0 responses declining",
        "collapse signals not yet confirmed",
        "checked, not fired",
    ]
    supporting = explain_evidence({**evidence, "reasons": ["logp_pos_decline"]}, step=110)
    assert [line.split(":")[0] for line in supporting][:2] == [
        "likelihood of A>0 responses declining",  # the reason
        "reward still rising",  # a fired signal that supports it
    ]


def test_phase_change_has_a_headline_and_no_bookkeeping() -> None:
    lines = explain_phase_change("decay", "stagnation", PHASE_II, 110)
    assert lines[0] == "stagnation → decay at step 110: phase II: likelihood decays"
    assert lines[2] == (
        "reward still rising: Mann-Kendall Z = 6.97 (threshold 3) over the last 71 steps (steps 40-110);"
        " reward/mean Theil-Sen slope +0.00225 per step"
    )
    assert len(lines) == 3  # reasons that are fired signals are not repeated; no degraded line
    assert_no_internal_keys(lines)
    # Without a note, the phase's own description.
    assert explain_phase_change("collapse", None, {}, 5) == [
        f"start → collapse at step 5: {PHASE_DESCRIPTIONS['collapse']}"
    ]


def test_degraded_mode_is_said_only_when_true() -> None:
    lines = explain_finding("kl_blowup", "KL blew up", KL_DEGRADED, 150)
    assert lines[0] == (
        "KL divergence blow-up: median of recent points = 0.101 (threshold 0.1) over the last 5 steps"
        " (steps 148-152); kl/old baseline 0.00479"
    )
    assert "baseline kl/ref 0.002" in lines  # the per-metric baselines, the shown one not repeated
    assert f"degraded mode: {DEGRADED}" in lines
    assert lines[-1] == "active since step 150, last seen at step 152"
    assert_no_internal_keys(lines)
    healthy = explain_finding("kl_blowup", "KL blew up", {**KL_DEGRADED, "degraded": False}, 150)
    assert not any("degraded" in line for line in healthy)
    assert DEGRADED not in "\n".join(healthy)  # the explanation belongs to degraded mode only
    warm = explain_phase_change("healthy", "warmup", {"reasons": ["warmup_done"], "degraded": True}, 19)
    assert warm[1] == "because: warm-up done" and warm[2].startswith("degraded mode: ")


def test_nonfinite_and_unknown_evidence() -> None:
    nan = {"metric": "grad/norm", "value": "NaN", "statistic": None, "threshold": None, "window": 1}
    assert explain_finding("nonfinite_grad", "Non-finite gradient norm logged.", nan, 149) == [
        "non-finite gradient norm: grad/norm = NaN at step 149"
    ]
    # Nothing explainable: the message stands in; unknown keys never show.
    assert explain_finding("x", "something odd", {"z": 4.2, "_cache": 1}, 3) == ["something odd"]
    assert explain_evidence({"z": 4.2}) == []
    # A signal that could not be computed says why, after the computed ones.
    off = {"fired": False, "metric": "lld/anchor/logp", "statistic": None, "note": "not enough data"}
    assert explain_evidence({"signals": {"anchor_decline": off, **ISSUE_EVIDENCE["signals"]}})[1] == (
        "checked, not fired: gradient-norm surge 1.04 (threshold 5);"
        " likelihood of the anchor responses declining (not enough data)"
    )
    # A statistic without `statistic_is` is named from the detail that equals it.
    line = explain_evidence(
        {
            "signals": {
                "entropy_surge": {"fired": True, "metric": "entropy/mean", "statistic": 2.62, "ratio": 2.62}
            }
        }
    )[0]
    assert line.startswith("entropy surge on entropy/mean: ratio of recent median to baseline median = 2.62")
    # The detector's own sentence comes first.
    meant = explain_evidence(
        {"metric": "reward/mean", "statistic": 0.18, "meaning": "reward fell to a third of its peak."},
        name="reward_crash",
    )
    assert meant == ["reward crash on reward/mean: reward fell to a third of its peak; statistic = 0.18"]
    # ... unless it only restates the display name.
    same = {
        "metric": "lld/logp_pos",
        "statistic": -5.17,
        "meaning": "log-likelihood of A>0 responses declining",
    }
    assert explain_evidence(same, name="logp_pos_decline") == [
        "likelihood of A>0 responses declining on lld/logp_pos: statistic = -5.17"
    ]


@pytest.mark.parametrize(
    "evidence",
    [
        {"signals": [1, 2]},
        {"signals": {"a": None, "b": {"statistic": "x", "window": "30"}}},
        {"statistic": float("nan"), "threshold": float("inf"), "window": -3, "metric": 5},
        {"reasons": "logp_pos_flat", "baselines": [1], "degraded": "yes", "active_at": "soon"},
        {"signals": {"a": {"fired": True, "window": 10**9, "statistic": 1e-9, "slope_per_step": 1e300}}},
    ],
)
def test_malformed_evidence_never_raises(evidence: dict[str, Any]) -> None:
    lines = explain_evidence(evidence, step=3)
    assert all(isinstance(line, str) for line in lines)
    explain_finding("k", "m", evidence, None)
    explain_phase_change("decay", None, evidence, None)


def test_number_format_is_three_significant_digits() -> None:
    assert [fmt_number(v) for v in (5.512069, 3.0, -4.49594, 0.00576, 1234.5, 1e-7, 30, "-Infinity")] == [
        "5.51",
        "3",
        "-4.5",
        "0.00576",
        "1230",
        "1.00e-07",
        "30",
        "-inf",
    ]


def test_display_names() -> None:
    for name in ("anchor_decline", "logp_correct_decline", "entropy_explosion", "dead_run"):
        assert name in SIGNAL_NAMES
    for name in ("training_collapse", "length_explosion", "invalid_action_surge"):
        assert "_" not in display_name(name)
    assert display_name("brand_new_signal") == "brand new signal"
    assert set(PHASE_DESCRIPTIONS) == set(PHASES)


def test_alert_steps_say_the_span_and_the_flicker() -> None:
    assert alert_steps(157, 157) == "step 157"
    assert alert_steps(157, 256) == "steps 157-256"
    assert alert_steps(157, None) == "step 157"
    assert alert_steps(157, 256, 1) == "steps 157-256 (re-opened once)"
    assert alert_steps(157, 256, 3) == "steps 157-256 (re-opened 3 times)"

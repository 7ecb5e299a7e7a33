"""The closed-loop rule: auto switches LLDS on when sliding, escalates once, and never beats a human."""

from __future__ import annotations

from contracts.directive import LLDSDirective
from monitor.domain import DirectiveInfo
from monitor.services.directive_policy import DirectiveRule, decide

RULE = DirectiveRule(trigger_phase="decay", lam=0.2, lam_max=0.3, escalate_after=40)
OFF = DirectiveInfo()


def test_auto_switches_on_when_decay_starts() -> None:
    change = decide("auto", "decay", 80, OFF, RULE)
    assert change is not None and change.llds == LLDSDirective(enabled=True, lam=0.2)
    assert "decay" in change.reason and "80" in change.reason


def test_alert_and_off_policies_never_steer() -> None:
    assert decide("alert", "collapse", 80, OFF, RULE) is None
    assert decide("off", "collapse", 80, OFF, RULE) is None


def test_healthy_or_stagnant_runs_are_left_alone() -> None:
    for phase in ("warmup", "healthy", "stagnation"):
        assert decide("auto", phase, 80, OFF, RULE) is None


def test_collapse_trigger_waits_for_collapse() -> None:
    rule = DirectiveRule(trigger_phase="collapse")
    assert decide("auto", "decay", 80, OFF, rule) is None
    assert decide("auto", "collapse", 130, OFF, rule) is not None


def test_escalates_once_if_decay_continues() -> None:
    on = DirectiveInfo(llds=LLDSDirective(True, 0.2), version=1, source="detector", step=80)
    assert decide("auto", "decay", 100, on, RULE) is None
    change = decide("auto", "decay", 120, on, RULE)
    assert change is not None and change.llds == LLDSDirective(enabled=True, lam=0.3)
    top = DirectiveInfo(llds=LLDSDirective(True, 0.3), version=2, source="detector", step=120)
    assert decide("auto", "collapse", 400, top, RULE) is None


def test_manual_directive_wins() -> None:
    manual_off = DirectiveInfo(
        llds=LLDSDirective(False, 0.2), version=3, source="manual", step=90, llds_manual=True
    )
    assert decide("auto", "collapse", 150, manual_off, RULE) is None
    # a person's checkpoint or stop request alone does not take LLDS away from the policy
    request_only = DirectiveInfo(version=3, source="manual", step=90, checkpoint=3)
    assert decide("auto", "collapse", 150, request_only, RULE) is not None


def test_levers_auto_checkpoints_when_decay_starts_and_stop_is_opt_in() -> None:
    from monitor.services.directive_policy import decide_levers

    change = decide_levers("auto", [("decay", 80)], OFF)
    assert change is not None and change.checkpoint and not change.stop and "step 80" in change.reason
    assert decide_levers("alert", [("decay", 80)], OFF) is None  # only auto steers
    assert decide_levers("auto", [("stagnation", 60)], OFF) is None
    assert decide_levers("auto", [("collapse", 150)], OFF) is None  # no stop without the opt-in
    opted_in = DirectiveInfo(version=2, stop_on_collapse=True)
    both = decide_levers("alert", [("decay", 80), ("collapse", 150)], opted_in)
    assert both is not None and both.stop and not both.checkpoint and "stop-on-collapse" in both.reason
    both = decide_levers("auto", [("decay", 80), ("collapse", 150)], opted_in)
    assert both is not None and both.stop and both.checkpoint

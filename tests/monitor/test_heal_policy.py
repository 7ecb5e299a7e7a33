"""Policy `heal` (pure rules): a collapse gets a rollback to the decay checkpoint (or the step before the
collapse), LLDS on or raised, the learning rate scaled; after `max_rollbacks` a stop that says why;
`auto` and `alert` never roll back; a person's LLDS setting is left alone."""

from __future__ import annotations

from contracts.directive import LLDSDirective
from monitor.domain import DirectiveInfo
from monitor.services.directive_policy import DirectiveRule, HealContext, decide, decide_levers

RULE = DirectiveRule(lam=0.2, lam_max=0.3, max_rollbacks=2, heal_lr_scale=0.5)
OFF = DirectiveInfo()


def test_a_collapse_rolls_back_to_the_decay_entry_with_llds_on_and_half_the_learning_rate() -> None:
    change = decide_levers("heal", [("collapse", 130)], OFF, RULE, HealContext(0, decay_entry=96))
    assert change is not None and not change.stop
    assert (change.rollback_to, change.lr_scale, change.llds) == (96, 0.5, LLDSDirective(True, 0.2))
    assert "rollback to step 96 requested" in change.reason and change.reason.startswith("heal:")


def test_without_a_decay_entry_it_rolls_back_to_the_step_before_the_collapse() -> None:
    change = decide_levers("heal", [("collapse", 20)], OFF, RULE, HealContext(0, decay_entry=None))
    assert change is not None and change.rollback_to == 19
    later = decide_levers("heal", [("collapse", 20)], OFF, RULE, HealContext(0, decay_entry=25))
    assert (
        later is not None and later.rollback_to == 19
    )  # a decay entry after the collapse is no checkpoint before it


def test_a_second_rollback_raises_lambda_and_scales_the_learning_rate_again() -> None:
    on = DirectiveInfo(llds=LLDSDirective(True, 0.2), lr_scale=0.5, rollback=3, rollback_to=96)
    change = decide_levers("heal", [("collapse", 150)], on, RULE, HealContext(1, decay_entry=96))
    assert change is not None and (change.rollback_to, change.lr_scale) == (96, 0.25)
    assert change.llds == LLDSDirective(True, 0.3)


def test_a_further_rollback_goes_before_the_checkpoint_restored_last_time() -> None:
    # the first rollback restored step 100 and the run collapsed again at 101: restoring 100 again
    # would replay the same collapse
    again = decide_levers(
        "heal", [("collapse", 101)], OFF, RULE, HealContext(1, decay_entry=None, restored=100)
    )
    assert again is not None and again.rollback_to == 99
    earlier = decide_levers(
        "heal", [("collapse", 130)], OFF, RULE, HealContext(1, decay_entry=96, restored=60)
    )
    assert earlier is not None and earlier.rollback_to == 59
    kept = decide_levers("heal", [("collapse", 130)], OFF, RULE, HealContext(1, decay_entry=96, restored=120))
    assert kept is not None and kept.rollback_to == 96  # the decay entry is before it already
    none_left = decide_levers("heal", [("collapse", 5)], OFF, RULE, HealContext(1, restored=0))
    assert none_left is not None and none_left.stop and none_left.heal_exhausted
    assert "no step before the collapse to roll back to" in none_left.reason


def test_after_the_last_rollback_heal_stops_the_run_and_says_why() -> None:
    change = decide_levers("heal", [("collapse", 180)], OFF, RULE, HealContext(2, decay_entry=96))
    assert change is not None and change.stop and change.heal_exhausted and change.rollback_to is None
    assert "2 rollbacks used (limit 2)" in change.reason
    first = decide_levers("heal", [("collapse", 0)], OFF, RULE, HealContext(0))
    assert first is not None and first.stop and "no step before the collapse" in first.reason


def test_decay_gets_a_checkpoint_under_heal_as_under_auto() -> None:
    for policy in ("auto", "heal"):
        change = decide_levers(policy, [("decay", 80)], OFF, RULE, HealContext())
        assert change is not None and change.checkpoint and change.rollback_to is None
    llds = decide("heal", "decay", 80, OFF, RULE)
    assert llds is not None and llds.llds == LLDSDirective(True, 0.2)


def test_other_policies_never_roll_back() -> None:
    for policy in ("auto", "alert", "off"):
        change = decide_levers(policy, [("collapse", 130)], OFF, RULE, HealContext(0, 96))
        assert change is None or change.rollback_to is None


def test_a_person_s_llds_is_left_alone_and_stop_on_collapse_yields_to_the_rollback() -> None:
    manual = DirectiveInfo(llds=LLDSDirective(False, 0.2), llds_manual=True, stop_on_collapse=True)
    change = decide_levers("heal", [("collapse", 130)], manual, RULE, HealContext(0, 96))
    assert change is not None and change.rollback_to == 96 and change.llds is None and not change.stop

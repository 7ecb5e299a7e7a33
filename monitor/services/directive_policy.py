"""Pure closed-loop rule: when an `auto` run slides into decay (or collapse), switch LLDS on.

Manual directives win: once a person set the directive, the detector never changes it again.
If the run is still in the trigger phase `escalate_after` steps after LLDS was switched on, lambda
is raised once to `lambda_max` (the paper uses 0.2, `DEFAULT_LLDS_LAMBDA`, and 0.3 for the 7B model; 0.01 only delays
collapse, lld-reference.md section 4).
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.directive import DEFAULT_LLDS_LAMBDA
from monitor.domain import DirectiveInfo

SLIDING = {"decay": ("decay", "collapse"), "collapse": ("collapse",)}


@dataclass(frozen=True)
class DirectiveRule:
    trigger_phase: str = "decay"
    lam: float = DEFAULT_LLDS_LAMBDA
    lam_max: float = 0.3
    escalate_after: int = 40


@dataclass(frozen=True)
class DirectiveChange:
    llds_enabled: bool
    llds_lambda: float
    reason: str


def decide(
    policy: str, phase: str, step: int, current: DirectiveInfo, rule: DirectiveRule
) -> DirectiveChange | None:
    if policy != "auto" or current.source == "manual":
        return None
    if phase not in SLIDING[rule.trigger_phase]:
        return None
    if not current.llds_enabled:
        return DirectiveChange(
            True, rule.lam, f"auto: run entered {phase} (step {step}); LLDS on, lambda {rule.lam}"
        )
    since = current.step if current.step is not None else step
    if current.llds_lambda < rule.lam_max and step - since >= rule.escalate_after:
        return DirectiveChange(
            True,
            rule.lam_max,
            f"auto: still in {phase} {step - since} steps after LLDS was switched on; lambda {rule.lam_max}",
        )
    return None

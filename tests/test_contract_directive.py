"""The directive's one parser (`contracts.directive.parse_directive`) and its users."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from contracts.directive import DEFAULT_LLDS_LAMBDA, SOURCE_MANUAL, Directive, LLDSDirective, parse_directive


def test_default_lambda_is_the_papers() -> None:
    assert DEFAULT_LLDS_LAMBDA == 0.2 and LLDSDirective().lam == DEFAULT_LLDS_LAMBDA


def test_wire_shape() -> None:
    wire = {
        "llds": {"enabled": True, "lam": 0.3},
        "version": 4,
        "reason": "phase II",
        "source": "policy",
        "step": 120,
    }
    assert parse_directive(wire) == Directive(LLDSDirective(True, 0.3), 4, "phase II", "policy", 120)
    assert parse_directive({"llds": {"enabled": False, "lam": 0}, "version": 1, "step": None}) == Directive(
        LLDSDirective(False, 0.0), 1, "", "", None
    )


def test_flat_file_form_and_objects() -> None:
    assert parse_directive({"enabled": True, "lam": 0.25}) == Directive(LLDSDirective(True, 0.25), 0, "", "")
    directive = Directive(LLDSDirective(True, 0.3), version=2)
    assert parse_directive(directive) is directive
    duck = SimpleNamespace(llds=SimpleNamespace(enabled=True, lam=0.3), version=5, reason="r")
    assert parse_directive(duck) == Directive(LLDSDirective(True, 0.3), 5, "r", "")


@pytest.mark.parametrize(
    "bad",
    [
        None,
        "llds on",
        {},
        {"llds": {"enabled": "yes", "lam": 0.2}},  # strict: a bool, not a truthy value
        {"llds": {"enabled": 1, "lam": 0.2}},
        {"llds": {"enabled": True, "lam": True}},
        {"llds": {"enabled": True, "lam": "0.2"}},
        {"llds": {"enabled": True, "lam": -0.1}},
        {"llds": {"enabled": True, "lam": math.inf}},
        {"llds": {"enabled": True, "lam": math.nan}},
        {"llds": {"enabled": True}},
        {"llds": {"enabled": True, "lam": 0.2}, "version": "3"},
        {"llds": {"enabled": True, "lam": 0.2}, "version": True},
        {"llds": {"enabled": True, "lam": 0.2}, "step": 1.5},
        {"llds": {"enabled": True, "lam": 0.2}, "reason": 3},
    ],
)
def test_malformed_is_none(bad: Any) -> None:
    assert parse_directive(bad) is None


def test_a_hostile_object_is_none() -> None:
    class Hostile:
        @property
        def llds(self) -> Any:
            raise RuntimeError("boom")

    assert parse_directive(Hostile()) is None


def test_the_trainer_side_uses_the_contract() -> None:
    from trainer_hooks import client

    assert client.Directive is Directive and client.LLDSDirective is LLDSDirective
    assert client.DEFAULT_LLDS_LAMBDA == DEFAULT_LLDS_LAMBDA


def test_the_service_side_uses_the_contract() -> None:
    from monitor.api.schemas import LLDSIn
    from monitor.config import Settings
    from monitor.domain import DirectiveInfo
    from monitor.services.directive_policy import DirectiveRule

    assert DirectiveRule().lam == DEFAULT_LLDS_LAMBDA
    assert LLDSIn(enabled=True).lam == DEFAULT_LLDS_LAMBDA
    assert Settings.model_fields["llds_lambda"].default == DEFAULT_LLDS_LAMBDA
    assert DirectiveInfo().llds.lam == DEFAULT_LLDS_LAMBDA


def test_the_api_shows_the_wire_body() -> None:
    """A service directive is the contract's; the API's (`DirectiveOut`) is its wire body plus when the
    version was made and acknowledged, so a trainer reading either gets the same directive."""
    from monitor.api.schemas import DirectiveOut
    from monitor.domain import DirectiveInfo

    made = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    d = DirectiveInfo(
        llds=LLDSDirective(True, 0.3),
        version=3,
        reason="r",
        source=SOURCE_MANUAL,
        step=9,
        checkpoint=3,
        stop=2,
        stop_reason="s",
        stop_on_collapse=True,
        applied_version=2,
        updated_at=made,
        llds_manual=True,
        applied_step=11,
    )
    assert parse_directive(d) is d
    assert set(DirectiveOut.model_fields) == {*d.to_wire(), "updated_at", "applied_step"}
    body = DirectiveOut.of(d).model_dump(mode="json")
    assert {k: body[k] for k in d.to_wire()} == d.to_wire()
    assert (datetime.fromisoformat(body["updated_at"]), body["applied_step"]) == (made, 11)
    parsed = parse_directive(body)
    assert parsed is not None and parsed.to_wire() == d.to_wire()

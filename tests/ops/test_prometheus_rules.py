"""The shipped alerting rules load in Prometheus and behave as their unit tests say (`promtool test
rules`), and every shipped alert has a test case."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.ops.conftest import require_binary

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "monitor" / "alerting" / "prometheus-rules.yml"
RULE_TESTS = Path(__file__).with_name("rules_test.yml")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_binary("promtool"), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_rules_load_in_prometheus() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_pass_their_unit_tests() -> None:
    """Alerts fire after their `for`, once per run however many replicas are scraped, and a first
    failed notification (a counter series born at 1) is not missed."""
    result = _promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test() -> None:
    alerts = {
        r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r
    }
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    tested = {
        case["alertname"] for t in tests for case in t.get("alert_rule_test", []) if case.get("exp_alerts")
    }
    assert alerts - tested == set(), "alerts without a firing test case in tests/ops/rules_test.yml"


def test_a_missing_binary_fails_in_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """In CI the rule tests must not be skipped away when promtool is missing."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="promtool is not installed"):
        require_binary("promtool")
    monkeypatch.delenv("CI")
    monkeypatch.delenv("LLDMON_REQUIRE_PROMETHEUS", raising=False)
    with pytest.raises(pytest.skip.Exception):
        require_binary("promtool")

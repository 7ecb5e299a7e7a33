"""Numeric settings from the environment: every float setting refuses NaN and +-inf, every duration
(`*_seconds`) also 0 and negatives, as the one-line error of `lldmon serve` naming the variable (exit 2),
before anything starts. The fields are read from `Settings` itself, so a new setting is covered."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from monitor.cli import app
from monitor.config import Settings

runner = CliRunner()

FLOAT_SETTINGS = sorted(name for name, f in Settings.model_fields.items() if f.annotation is float)
DURATIONS = [name for name in FLOAT_SETTINGS if name.endswith("_seconds")]
CASES = [(name, value) for name in FLOAT_SETTINGS for value in ("inf", "-inf", "nan", "Infinity", "-1")] + [
    (name, value) for name in DURATIONS for value in ("0", "-0.5", "1e300")
]


def test_the_float_settings_are_found() -> None:
    """The iteration below must see the settings it is about (a change of how fields are typed
    would otherwise leave it testing nothing)."""
    assert {
        "renotify_seconds",
        "liveness_sweep_seconds",
        "sink_timeout_seconds",
        "stall_after_seconds",
        "actions_prune_seconds",
    } <= set(DURATIONS)
    assert {"stall_step_factor", "crash_after_factor", "llds_lambda", "llds_lambda_max"} <= set(
        FLOAT_SETTINGS
    )


@pytest.mark.parametrize(("name", "value"), CASES)
def test_serve_refuses_a_non_finite_or_non_positive_setting_in_one_line(
    name: str, value: str, tmp_path: Path, monkeypatch: Any
) -> None:
    started: list[Any] = []
    monkeypatch.setattr("monitor.serving.serve", lambda *a, **k: started.append(a))
    variable = f"LLDMON_{name.upper()}"
    result = runner.invoke(
        app, ["serve", "--data-dir", str(tmp_path), "--port", "0"], env={variable: value, "COLUMNS": "200"}
    )
    assert result.exit_code == 2, (variable, value, result.output, result.exception)
    assert not started, "the server started with an invalid setting"
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(f"error: {variable}:"), result.output


@pytest.mark.parametrize("name", FLOAT_SETTINGS)
def test_finite_values_in_range_are_accepted(name: str) -> None:
    """The refusal is of non-finite values, not of the setting: its default and a small positive
    value (what the tests use for fast sweeps) pass."""
    default = Settings.model_fields[name].default
    assert math.isfinite(default)
    assert getattr(Settings(**{name: default}), name) == default
    if name in DURATIONS:
        assert getattr(Settings(**{name: 0.2}), name) == 0.2

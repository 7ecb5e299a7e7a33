"""CLI output when stdout is not a terminal (a pipe, a CI log; CliRunner is not a terminal either): table
cells print whole and lines are not wrapped, whatever width COLUMNS or the terminal claim, so that
`lldmon runs list | grep NAME` finds the run; `--json` on every list/show command."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from lldmon_lab.scenarios import collapse_scenario
from monitor.cli import app
from tests.monitor.importers.helpers import scenario_jsonl

runner = CliRunner()
NARROW = {"COLUMNS": "60", "LLDMON_URL": "", "LLDMON_TOKEN": ""}
NAME = "grpo-qwen2.5-7b-instruct-searchr1-nq-hotpotqa-lr1e-6-seed-12"


def lldmon(*args: str) -> str:
    result = runner.invoke(app, list(args), env=NARROW)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("pipe")
    log = scenario_jsonl(tmp / "collapse.jsonl", collapse_scenario(3))
    lldmon("import", str(log), "--run", NAME, "--tag", "a-long-tag-value-" * 3, "--data-dir", str(tmp))
    yield str(tmp)


def test_names_are_whole_in_runs_list(data_dir: str) -> None:
    assert len(NAME) == 60
    output = lldmon("runs", "list", "--data-dir", data_dir)
    [row] = [line for line in output.splitlines() if NAME in line]  # `| grep NAME` finds it
    assert "a-long-tag-value-" * 3 in row and "…" not in output, output


def test_messages_are_whole_in_alerts_list(data_dir: str) -> None:
    import json

    alerts = json.loads(lldmon("alerts", "list", NAME, "--json", "--data-dir", data_dir))
    assert alerts and max(len(a["message"]) for a in alerts) > 100
    output = lldmon("alerts", "list", NAME, "--data-dir", data_dir)
    lines = output.splitlines()
    for alert in alerts:
        assert any(alert["message"] in line for line in lines), (alert["message"], output)
    assert "…" not in output


def test_runs_show_prints_the_whole_name(data_dir: str) -> None:
    output = lldmon("runs", "show", NAME, "--data-dir", data_dir)
    assert any(NAME in line for line in output.splitlines()), output
    assert "…" not in output


def _leaves(command: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    commands = getattr(command, "commands", None)
    if commands is None:
        yield path, command
        return
    for name, sub in commands.items():
        yield from _leaves(sub, (*path, name))


def test_every_list_and_show_command_has_json() -> None:
    """Commands that print records (a list, one record, a state) print the API's JSON with --json."""
    listing = {"list", "show", "liveness", "directive"}
    found = []
    for path, command in _leaves(typer.main.get_command(app), ()):
        if path[0] != "lab" and path[-1] in listing:
            options = {opt for param in command.params for opt in getattr(param, "opts", [])}
            found.append(path)
            assert "--json" in options, path
    assert ("runs", "list") in found and ("alerts", "list") in found and ("token", "list") in found

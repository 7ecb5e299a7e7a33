"""The `lldmon import` summary reads the run's state after the import: importing the same file again
(`--append` locally, the same command with `--url`) lists the run's phases and alerts and says that this
import recorded none of them, rather than "phases: none recorded" / "alerts: none" for a run that has
both. Locally and over HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from lldmon_lab.scenarios import collapse_scenario
from monitor.cli import app
from tests.conftest import live_server_on
from tests.monitor.importers.helpers import scenario_jsonl

runner = CliRunner()
ENV = {"COLUMNS": "80", "LLDMON_URL": "", "LLDMON_TOKEN": ""}


def lldmon(*args: str) -> str:
    result = runner.invoke(app, list(args), env=ENV)
    assert result.exit_code == 0, result.output
    return result.output


def _listed(output: str) -> tuple[list[str], list[str]]:
    """(phase lines, alert lines) of a summary."""
    lines = output.splitlines()
    phases = [line.split()[0] for line in lines if " from step " in line]
    alerts = [line.split()[2] for line in lines if re.match(r"  #\d+ ", line)]
    return phases, alerts


def _check_second(first: str, second: str) -> None:
    phases, alerts = _listed(first)
    assert len(phases) > 2 and len(alerts) > 2, first
    assert _listed(second) == (phases, alerts), second
    assert f"phases (none of {len(phases) - 1} changes recorded by this import):" in second, second
    assert f"alerts (none of {len(alerts)} opened or updated by this import):" in second, second
    assert "phases: none recorded" not in second and "alerts: none" not in second
    assert "phases:\n" in first and "alerts:\n" in first  # a first import recorded all the run holds


def test_local_append_of_the_same_file_lists_what_the_run_holds(tmp_path: Path, db_url: str) -> None:
    log = scenario_jsonl(tmp_path / "collapse.jsonl", collapse_scenario(3))
    args = ["import", str(log), "--run", "again", "--database-url", db_url]
    first = lldmon(*args)
    second = lldmon(*args, "--append")
    _check_second(first, second)


def test_local_append_of_more_steps_counts_what_it_recorded(tmp_path: Path, db_url: str) -> None:
    lines = scenario_jsonl(tmp_path / "collapse.jsonl", collapse_scenario(3)).read_text().splitlines()
    head, tail = tmp_path / "head.jsonl", tmp_path / "tail.jsonl"
    head.write_text("\n".join(lines[:100]) + "\n")
    tail.write_text("\n".join(lines[100:]) + "\n")
    before, _ = _listed(lldmon("import", str(head), "--run", "halves", "--database-url", db_url))
    output = lldmon("import", str(tail), "--run", "halves", "--append", "--database-url", db_url)
    phases, _ = _listed(output)
    assert phases[: len(before)] == before and len(phases) > len(before), output
    added = len(phases) - len(before)
    assert f"phases ({added} of {len(phases) - 1} changes recorded by this import):" in output, output


def test_import_over_http_twice_lists_what_the_run_holds(backend: str, tmp_path: Path) -> None:
    log = scenario_jsonl(tmp_path / "collapse.jsonl", collapse_scenario(3))
    with live_server_on(backend, tmp_path) as live:
        args = ["import", str(log), "--run", "again", "--url", live.url]
        first = lldmon(*args)
        second = lldmon(*args)
    assert "sent 0 batches" in second, second
    _check_second(first, second)

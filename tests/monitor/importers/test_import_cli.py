"""`lldmon import` end to end into a database (SQLite and PostgreSQL through `db_url`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from contracts import metrics as M
from lldmon_lab.scenarios import collapse_scenario
from monitor.cli import app
from monitor.detector import detect_offline
from monitor.importers import load_verl_console, load_verl_jsonl
from tests.monitor.importers.helpers import SEARCH_R1_GRPO, needs_real, scenario_jsonl

runner = CliRunner()
WIDE = {"COLUMNS": "240"}


def count(url: str, sql: str) -> int:
    engine = create_engine(url)
    with engine.connect() as conn:
        value = int(conn.execute(text(sql)).scalar_one())
    engine.dispose()
    return value


def values(url: str, name: str) -> tuple[list[int], list[float]]:
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT step, value FROM step_metrics WHERE name = :n ORDER BY step"), {"n": name}
        ).all()
    engine.dispose()
    return [int(r[0]) for r in rows], [np.nan if r[1] is None else float(r[1]) for r in rows]


def lldmon_import(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["import", *args], env=WIDE)
    return result.exit_code, result.output


def test_import_prints_phases_and_writes_rows(tmp_path: Path, db_url: str) -> None:
    path = scenario_jsonl(tmp_path / "collapse.jsonl", collapse_scenario(3))
    code, output = lldmon_import(str(path), "--run", "collapse", "--project", "nq", "--database-url", db_url)
    assert code == 0, output

    log = load_verl_jsonl(path)
    assert count(db_url, "SELECT count(*) FROM runs WHERE status = 'finished'") == 1
    assert count(db_url, "SELECT count(*) FROM step_metrics") == log.n_points
    steps, stored = values(db_url, M.GRAD_NORM)
    assert steps == log.steps[log.present[M.GRAD_NORM]].tolist()
    np.testing.assert_array_equal(stored, log.values[M.GRAD_NORM][log.present[M.GRAD_NORM]])

    offline = detect_offline(log.steps, log.values, present=log.present)
    assert f"imported 209 steps (0-208), {log.n_points} values of {len(log.values)} metrics" in output
    assert "from 1 verl-jsonl file(s) into run 1 'collapse' of project 'nq' (new run, finished)" in output
    printed = [line.split() for line in output.splitlines() if " from step " in line]
    changes = [(c.step, c.phase) for c in offline.phase_changes]
    assert [(int(p[-1]), p[0]) for p in printed] == [(0, "warmup"), *changes]
    assert count(db_url, "SELECT count(*) FROM phase_events") == len(offline.phase_changes)
    assert "critical lld_collapse" in output and "warning lld_decay" in output
    assert count(db_url, "SELECT count(*) FROM alerts WHERE kind = 'lld_collapse'") == 1

    # a second import into the same run is refused until --append or --replace says what to do
    code, output = lldmon_import(str(path), "--run", "collapse", "--project", "nq", "--database-url", db_url)
    assert code == 1 and "already has metrics up to step 208" in output and "--replace" in output
    code, output = lldmon_import(
        str(path), "--run", "collapse", "--project", "nq", "--replace", "--database-url", db_url
    )
    assert code == 0, output
    assert "(existing run, finished)" in output
    assert count(db_url, "SELECT count(*) FROM step_metrics") == log.n_points
    assert count(db_url, "SELECT count(*) FROM phase_events") == len(offline.phase_changes)


def test_strict_writes_nothing_and_warnings_are_capped(tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "run.jsonl"
    good, bad = (
        '{{"step": {}, "data": {{"actor/grad_norm": 1.0}}}}',
        '{{"step": {}, "data": {{"actor/grad_norm": "oops"}}}}',
    )
    lines = [(bad if 3 <= s < 28 else good).format(s) for s in range(30)]  # 25 malformed lines
    path.write_text("\n".join(lines) + "\n")

    code, output = lldmon_import(str(path), "--run", "r", "--strict", "--database-url", db_url)
    assert code == 1
    assert (
        f"error: {path}:4: step 3: actor/grad_norm is not a number: 'oops' (--strict: nothing was written)"
        in output
    )
    assert count(db_url, "SELECT count(*) FROM runs") == 0
    assert count(db_url, "SELECT count(*) FROM step_metrics") == 0

    code, output = lldmon_import(str(path), "--run", "r", "--database-url", db_url)
    assert code == 0, output
    warnings = [line for line in output.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 21
    assert warnings[0] == f"warning: {path}:4: step 3: actor/grad_norm is not a number: 'oops'"
    assert warnings[-1] == "warning: … and 5 more malformed lines (25 in all, skipped)"
    assert count(db_url, "SELECT count(*) FROM step_metrics") == 5


def test_usage_errors(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "db")]
    code, output = lldmon_import(str(tmp_path / "missing.log"), "--run", "r", *data)
    assert code == 2 and "missing.log: no such file or directory" in output
    prose = tmp_path / "notes.txt"
    prose.write_text("hello\n")
    code, output = lldmon_import(str(prose), "--run", "r", *data)
    assert code == 2 and "cannot tell the format" in output
    code, output = lldmon_import(str(prose), "--run", "r", "--append", "--replace", *data)
    assert code == 2 and "--append and --replace exclude each other" in output
    jsonl = tmp_path / "run.jsonl"
    jsonl.write_text('{"step": 0, "data": {"x": 1}}\n')
    code, output = lldmon_import(str(jsonl), "--run", "r", "--first-step", "5", *data)
    assert code == 2 and "only needed for trl-log" in output
    assert not (tmp_path / "db").exists()  # nothing was opened or created


@needs_real
def test_real_resumed_searchr1_run(db_url: str) -> None:
    code, output = lldmon_import(*map(str, SEARCH_R1_GRPO), "--run", "grpo", "--database-url", db_url)
    assert code == 0, output
    assert "imported 301 steps (0-300)" in output and "2 verl-console file(s)" in output
    assert "warning" not in output
    assert count(db_url, "SELECT count(DISTINCT step) FROM step_metrics") == 301
    resumed = load_verl_console(SEARCH_R1_GRPO[1])
    steps, grad = values(db_url, M.GRAD_NORM)
    assert steps == list(range(1, 301))  # step 0 is the validation before training: no grad norm
    np.testing.assert_array_equal(grad[100:149], resumed.values[M.GRAD_NORM][:49])  # steps 101..149
    assert grad[119] == pytest.approx(0.195)  # step 120: the resume file's value (pre-resume: 0.554)


def test_webhooks_are_paged_only_with_notify(tmp_path: Path, db_url: str) -> None:
    """An old log must not page anyone: the configured webhook hears from an import only with --notify
    (the dispatcher is closed, so its queue is drained, before the command returns)."""
    from tests.monitor.alerting.test_sinks import Receiver

    receiver = Receiver(failures=0)
    env = {**WIDE, "LLDMON_WEBHOOK_URLS": f'["{receiver.url}"]'}
    path = scenario_jsonl(tmp_path / "collapse.jsonl", collapse_scenario(3))
    try:
        base = ["import", str(path), "--project", "nq", "--database-url", db_url]
        quiet = runner.invoke(app, [*base, "--run", "quiet"], env=env)
        assert quiet.exit_code == 0, quiet.output
        assert "critical lld_collapse" in quiet.output and receiver.attempts == 0
        loud = runner.invoke(app, [*base, "--run", "loud", "--notify"], env=env)
        assert loud.exit_code == 0, loud.output
        kinds = {body["kind"] for body in receiver.bodies}
        assert {"lld_collapse", "lld_decay"} <= kinds
        assert {body["run_name"] for body in receiver.bodies} == {"loud"}
    finally:
        receiver.close()

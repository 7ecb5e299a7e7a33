"""Issue 16 #12: Ctrl-C in `lldmon import` exited 130 without a word and left the run `running` at 4,500
of 20,000 steps. A real `lldmon import` process gets SIGINT part way through writing (SQLite and
PostgreSQL through `db_url`): at a point the test holds it at (`paused_import`), so the signal lands
while writing for sure, whatever the machine's load; no wait is on time."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from monitor.cli import app
from monitor.import_command import DEFERRED_NOTICE
from tests.monitor.importers.helpers import write_jsonl
from tests.monitor.importers.pause_inside_write import PAUSED_LINE, paused_import

EXE = shutil.which("lldmon") or str(Path(sys.executable).parent / "lldmon")
STEPS = 5_000


def _run_state(url: str) -> tuple[str | None, int]:
    """(status, stored steps) of run 'big'."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            status = conn.execute(text("SELECT status FROM runs WHERE name = 'big'")).scalar_one_or_none()
            steps = conn.execute(
                text(
                    "SELECT count(DISTINCT step) FROM step_metrics JOIN runs ON runs.id = step_metrics.run_id "
                    "WHERE runs.name = 'big'"
                )
            ).scalar_one()
    finally:
        engine.dispose()
    return status, int(steps)


def test_ctrl_c_marks_the_run_failed_and_says_how_to_finish(tmp_path: Path, db_url: str) -> None:
    log = write_jsonl(
        tmp_path / "big.jsonl",
        [
            {"step": s, "data": {"actor/grad_norm": 1.0 + s % 7, "critic/score/mean": 0.5}}
            for s in range(STEPS)
        ],
    )
    args = [str(log), "--run", "big", "--database-url", db_url]
    with paused_import(*args, "--chunk-steps", "2", pause_chunk=51) as child:
        child.wait_for(PAUSED_LINE)  # 100 steps written, the 51st chunk being written
        child.proc.send_signal(signal.SIGINT)  # the child's SIGINT is at its default disposition
        child.wait_for(DEFERRED_NOTICE)
        child.release()
        code, output = child.finish()
    assert code == 130, output

    status, stored = _run_state(db_url)
    assert (status, stored) == ("failed", 102)
    lines = [line for line in output.splitlines() if "interrupted" in line]
    assert len(lines) == 1 and "Traceback" not in output, output
    line = lines[0]
    assert f"of {STEPS:,} steps" in line and "marked failed" in line and "--replace" in line, line

    # As the message says: the same command with --replace imports the whole log and finishes the run.
    done = subprocess.run(
        [EXE, "import", *args, "--replace", "--chunk-steps", "500"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert _run_state(db_url) == ("finished", STEPS)


def test_ctrl_c_while_reading_writes_nothing(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the database is opened: nothing to mark, and the message says so."""
    import monitor.importers

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(monitor.importers, "load_log", interrupted)
    log = write_jsonl(tmp_path / "run.jsonl", [{"step": 0, "data": {"actor/grad_norm": 1.0}}])
    result = CliRunner().invoke(app, ["import", str(log), "--run", "big", "--database-url", db_url])
    assert result.exit_code == 130, result.output
    assert result.output.strip() == "interrupted while reading the input: nothing was written"
    assert _run_state(db_url) == (None, 0)

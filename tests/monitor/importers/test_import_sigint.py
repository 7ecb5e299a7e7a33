"""Ctrl-C in a real `lldmon import` process, at a place the test chooses: inside the write of a chunk
(on PostgreSQL inside the COPY, the connection mid-command). Expected every time: exit status 130, a
run the import started marked `failed`, one line saying how to finish it, no traceback; a run the
import did not start keeps its status. SQLite and PostgreSQL through `db_url`.

The child's SIGINT disposition is set here (default, as from a terminal), and every wait is on a
condition (a line of the child's output, rows in the database, the child's exit), never on time."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, text

from monitor.import_command import DEFERRED_NOTICE as DEFERRED
from tests.monitor.importers.helpers import write_jsonl
from tests.monitor.importers.pause_inside_write import GUARD_S, PAUSED_LINE, paused_import

EXE = shutil.which("lldmon") or str(Path(sys.executable).parent / "lldmon")
STEPS = 2_000
CHUNK = 100
PAUSE_CHUNK = 3


def run_state(url: str, name: str) -> tuple[str | None, int]:
    """(status, stored steps) of the run `name`."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            status = conn.execute(text("SELECT status FROM runs WHERE name = :n"), {"n": name}).scalar()
            steps = conn.execute(
                text(
                    "SELECT count(DISTINCT step) FROM step_metrics JOIN runs ON runs.id = step_metrics.run_id "
                    "WHERE runs.name = :n"
                ),
                {"n": name},
            ).scalar_one()
    finally:
        engine.dispose()
    return status, int(steps)


def big_log(path: Path) -> Path:
    return write_jsonl(
        path,
        [
            {"step": s, "data": {"actor/grad_norm": 1.0 + s % 7, "critic/score/mean": 0.5}}
            for s in range(STEPS)
        ],
    )


def interrupted_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("interrupted")]


def test_ctrl_c_inside_a_chunk_write_stops_at_the_chunk_boundary(tmp_path: Path, db_url: str) -> None:
    """The signal lands inside the COPY: the chunk completes, the import stops after it, the run it
    created is marked failed, and the same command with --replace completes it."""
    log = big_log(tmp_path / "big.jsonl")
    args = [str(log), "--run", "big", "--database-url", db_url]
    with paused_import(*args, "--chunk-steps", str(CHUNK), pause_chunk=PAUSE_CHUNK) as child:
        child.wait_for(PAUSED_LINE)
        assert run_state(db_url, "big") == ("running", (PAUSE_CHUNK - 1) * CHUNK)
        child.proc.send_signal(signal.SIGINT)
        child.wait_for(DEFERRED)  # the request is recorded, the write goes on
        child.release()
        code, output = child.finish()

    assert code == 130, output
    assert "Traceback" not in output, output
    assert run_state(db_url, "big") == ("failed", PAUSE_CHUNK * CHUNK)
    lines = interrupted_lines(output)
    assert len(lines) == 1, output
    assert "marked failed" in lines[0] and f"{PAUSE_CHUNK * CHUNK:,} of {STEPS:,} steps" in lines[0], lines
    assert "--replace" in lines[0], lines

    done = subprocess.run(
        [EXE, "import", *args, "--replace", "--chunk-steps", "500"],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert run_state(db_url, "big") == ("finished", STEPS)


def test_a_second_ctrl_c_stops_inside_the_write_and_still_marks_the_run(tmp_path: Path, db_url: str) -> None:
    """Ctrl-C twice: the import stops at once, inside the COPY. The busy connection is discarded, the
    chunk being written is not stored, the run is marked failed on a fresh connection."""
    log = big_log(tmp_path / "big.jsonl")
    with paused_import(
        str(log),
        "--run",
        "big",
        "--database-url",
        db_url,
        "--chunk-steps",
        str(CHUNK),
        pause_chunk=PAUSE_CHUNK,
    ) as child:
        child.wait_for(PAUSED_LINE)
        child.proc.send_signal(signal.SIGINT)
        child.wait_for(DEFERRED)
        child.proc.send_signal(signal.SIGINT)
        code, output = child.finish()

    assert code == 130, output
    assert "Traceback" not in output, output
    assert run_state(db_url, "big") == ("failed", (PAUSE_CHUNK - 1) * CHUNK)
    lines = interrupted_lines(output)
    assert len(lines) == 1 and "marked failed" in lines[0] and "--replace" in lines[0], output


def test_ctrl_c_in_an_append_into_a_live_run_leaves_it_running(tmp_path: Path, db_url: str) -> None:
    """A trainer's run, running: the import did not start it, so it does not end it."""
    from monitor.api.app import build_state
    from monitor.config import Settings
    from monitor.domain import Principal

    state = build_state(Settings(database_url=db_url, data_dir=tmp_path))
    try:
        state.runs.register(Principal(), "live", None, {}, [])
    finally:
        state.dispatcher.close()
        state.db.dispose()
    log = big_log(tmp_path / "big.jsonl")
    args = [str(log), "--run", "live", "--append", "--database-url", db_url, "--chunk-steps", str(CHUNK)]
    with paused_import(*args, pause_chunk=PAUSE_CHUNK) as child:
        child.wait_for(PAUSED_LINE)
        child.proc.send_signal(signal.SIGINT)
        child.wait_for(DEFERRED)
        child.release()
        code, output = child.finish()

    assert code == 130, output
    assert "Traceback" not in output, output
    assert run_state(db_url, "live") == ("running", PAUSE_CHUNK * CHUNK)
    lines = interrupted_lines(output)
    assert len(lines) == 1 and "left running" in lines[0] and "--append" in lines[0], output
    assert "marked failed" not in output, output

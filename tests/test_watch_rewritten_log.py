"""`lldmon watch`: a log truncated and written again in place (copytruncate: same inode; or deleted
and recreated on a reused inode), regrown past the saved offset, is recognised by its content and read
again from its start, while the watcher is down and between two of its polls. An old state file (no
content anchor) is still accepted.

A real `lldmon serve` (SQLite and, when configured, PostgreSQL) stores the batches.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contracts import metrics as M
from monitor.watch import Service, Watcher, WatchState, state_file
from tests.conftest import live_server_on
from tests.live_server import LiveServer
from tests.test_watch import expected_verl, finished, ledger_rows, n_values, series_by_step, verl_line, watch

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server_on(backend, tmp_path_factory.mktemp(f"watch-rewritten-{backend}")) as live:
        yield live


def lines_of(steps: range) -> str:
    return "".join(verl_line(s) + "\n" for s in steps)


def copytruncate(log: Path, copy: Path, new_text: str) -> None:
    """logrotate's copytruncate: copy the log, truncate it in place (same inode), then the trainer
    writes on."""
    ino = log.stat().st_ino
    shutil.copyfile(log, copy)
    with open(log, "r+") as handle:
        handle.truncate(0)
    with open(log, "a") as handle:
        handle.write(new_text)
    assert log.stat().st_ino == ino


def test_copytruncate_while_down_reads_the_new_content_from_its_start(
    server: LiveServer, tmp_path: Path
) -> None:
    """Watched up to step 29 and stopped; the trainer logs 30-34, the log is copied and truncated,
    and 100-159 are written (more bytes than before): the restart stores 30-34 from the copy (they
    were after the saved offset) and all of 100-159, without an invalid-JSON warning."""
    log = tmp_path / "metrics.jsonl"
    state = tmp_path / "state"
    log.write_text(lines_of(range(30)))
    finished(watch(server, log, "copytruncate", state, "--from-start", "--until-idle", "1"))
    with open(log, "a") as handle:
        handle.write(lines_of(range(30, 35)))
    copytruncate(log, tmp_path / "metrics.jsonl.1", lines_of(range(100, 160)))
    out = finished(watch(server, log, "copytruncate", state, "--until-idle", "1.5"))
    assert "invalid JSON" not in out, out
    series = series_by_step(server, "copytruncate")
    steps = [*range(35), *range(100, 160)]
    assert list(series[M.REWARD_MEAN]) == steps
    assert {k: {s: series[k][s] for s in range(35)} for k in expected_verl(range(35))} == expected_verl(
        range(35)
    )
    assert ledger_rows(server, "copytruncate") == n_values(series)


class RewriteAtFirstIdle(threading.Event):
    """A stop event whose first idle wait (the watcher has read everything) rewrites the log in
    place: between two polls, deterministically."""

    def __init__(self, rewrite: Callable[[], None]) -> None:
        super().__init__()
        self.rewrite: Callable[[], None] | None = rewrite

    def wait(self, timeout: float | None = None) -> bool:
        if self.rewrite is not None:
            rewrite, self.rewrite = self.rewrite, None
            rewrite()
            return self.is_set()
        return super().wait(timeout)


def test_rewritten_in_place_between_polls_is_read_from_its_start(server: LiveServer, tmp_path: Path) -> None:
    """Deleted and recreated on the same inode (simulated by rewriting it in place) between two polls,
    with more bytes than were read: the new content is stored from its first line, each value once."""
    log = tmp_path / "metrics.jsonl"
    log.write_text(lines_of(range(20)))
    state = state_file(tmp_path / "state", log, server.api, "w", "between-polls")

    def rewrite() -> None:
        with open(log, "r+") as handle:
            handle.truncate(0)
            handle.write(lines_of(range(200, 240)))

    stop = RewriteAtFirstIdle(rewrite)
    said: list[str] = []
    service = Service(server.url, "between-polls", "w", None, stop, said.append)
    try:
        summary = Watcher(
            log,
            service,
            state,
            fmt="verl-jsonl",
            from_start=True,
            until_idle=0.5,
            interval=0.02,
            stop=stop,
            echo=said.append,
        ).run()
    finally:
        service.close()
    text = "\n".join(said)
    assert stop.rewrite is None and "invalid JSON" not in text and "rewritten" in text, text
    series = series_by_step(server, "between-polls")
    assert list(series[M.REWARD_MEAN]) == [*range(20), *range(200, 240)]
    assert ledger_rows(server, "between-polls") == n_values(series)
    assert summary.steps == 60
    saved = WatchState.load(state, str(log))
    assert saved is not None and saved.offset == log.stat().st_size


def test_a_state_file_without_an_anchor_is_still_accepted(server: LiveServer, tmp_path: Path) -> None:
    """A state written before the content anchor existed resumes at its offset."""
    log = tmp_path / "metrics.jsonl"
    log.write_text(lines_of(range(10)))
    offset = log.stat().st_size
    state = state_file(tmp_path / "state", log, server.api, "w", "old-state")
    state.parent.mkdir(parents=True)
    st = os.stat(log)
    old = {
        "path": str(log),
        "format": "verl-jsonl",
        "dev": st.st_dev,
        "ino": st.st_ino,
        "offset": offset,
        "line": 10,
        "trl_step": 0,
        "pending": None,
        "version": 1,
    }
    state.write_text(json.dumps(old))
    with open(log, "a") as handle:
        handle.write(lines_of(range(10, 15)))
    service = Service(server.url, "old-state", "w", None, threading.Event(), lambda _: None)
    try:
        Watcher(log, service, state, fmt="verl-jsonl", until_idle=0.3, interval=0.02).run()
    finally:
        service.close()
    assert list(series_by_step(server, "old-state")[M.REWARD_MEAN]) == list(range(10, 15))
    saved = WatchState.load(state, str(log))
    assert saved is not None and saved.offset == log.stat().st_size

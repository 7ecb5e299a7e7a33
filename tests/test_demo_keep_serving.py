"""`lldmon demo` and the dashboard it advertises: in a terminal it keeps serving after the run until
Ctrl-C and says so; without one (CI, a pipe) it ends, having said when the dashboard closes;
`--keep-serving/--no-keep-serving` decides explicitly. `lldmon serve` names the dashboard URL.

The processes run `--no-train` (the replayed collapse only: seconds, no torch). Every wait is on a line
the child prints or on its exit, never a fixed sleep; a test that sends SIGINT sets the child's
disposition of it first (a test runner started in the background leaves it ignored)."""

from __future__ import annotations

import contextlib
import os
import pty
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
from typer.testing import CliRunner

from tests.live_server import free_port

EXE = shutil.which("lldmon") or str(Path(sys.executable).parent / "lldmon")
WAIT = 120.0
KEEP_LINE = re.compile(r"replay done; the dashboard stays at (http://\S+/dashboard/) until Ctrl-C")


def _env() -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("LLDMON_DATABASE_URL", None)
    return env


def _default_sigint() -> None:
    """In the child, before exec: SIGINT as a terminal's Ctrl-C delivers it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Lines:
    """The child's output, line by line, read by a thread; `wait_for` blocks until a line matches."""

    def __init__(self, read: Callable[[], str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._read = read
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        try:
            while line := self._read():
                self._queue.put(line)
        except (
            OSError,
            ValueError,
        ):  # closed by the test, or a pty's master reads EIO once the child closed its side
            pass
        self._queue.put(None)

    def wait_for(self, pattern: re.Pattern[str], timeout: float = WAIT) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                pytest.fail("the demo ended before printing the line:\n" + "".join(self.seen)[-4000:])
            self.seen.append(line)
            if found := pattern.search(line):
                return found
        pytest.fail("no such line in time:\n" + "".join(self.seen)[-4000:])

    def rest(self) -> str:
        """Everything, once the child has exited."""
        while (line := self._queue.get(timeout=WAIT)) is not None:
            self.seen.append(line)
        return "".join(self.seen)


def _demo_args(tmp_path: Path, port: int, *extra: str) -> list[str]:
    return [EXE, "demo", "--no-train", "--data-dir", str(tmp_path / "data"), "--port", str(port), *extra]


def _interrupt_and_check(proc: subprocess.Popen[Any], lines: Lines, dashboard: str) -> None:
    """The dashboard answers after the run; SIGINT then stops the demo and its server, exit 0."""
    assert httpx.get(dashboard, timeout=10).status_code == 200
    runs = httpx.get(dashboard.replace("/dashboard/", "/api/v1/runs"), timeout=10).json()
    assert [r["status"] for r in runs] == ["finished"]
    events = httpx.get(dashboard.replace("/dashboard/", f"/api/v1/runs/{runs[0]['id']}/events"), timeout=10)
    assert "collapse" in [e["phase"] for e in events.json()]  # the replay landed in full
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0, lines.rest()[-4000:]
    with pytest.raises(httpx.TransportError):
        httpx.get(dashboard, timeout=2)


def _wait_until_ready(url: str, proc: subprocess.Popen[Any]) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        assert proc.poll() is None
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=5).status_code == 200:
                return
        time.sleep(0.1)  # polling interval of a condition, not a wait for an outcome
    pytest.fail(f"{url} not ready in time")


@contextlib.contextmanager
def _stopped_at_exit(proc: subprocess.Popen[Any]) -> Iterator[subprocess.Popen[Any]]:
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def test_without_a_terminal_the_demo_ends_and_says_when_the_dashboard_closes(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.run(
        _demo_args(tmp_path, port),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=WAIT,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "the dashboard closes when the run ends (not a terminal); --keep-serving keeps it up" in output
    assert f"replay done; the dashboard at http://127.0.0.1:{port}/dashboard/ closes now" in output
    assert "stays at" not in output
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)


def test_keep_serving_serves_after_the_replay_until_sigint(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        _demo_args(tmp_path, port, "--keep-serving"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        preexec_fn=_default_sigint,
    )
    with _stopped_at_exit(proc):
        stdout: IO[str] = proc.stdout  # type: ignore[assignment]
        lines = Lines(stdout.readline)
        dashboard = lines.wait_for(KEEP_LINE)[1]
        assert dashboard == f"http://127.0.0.1:{port}/dashboard/"
        _interrupt_and_check(proc, lines, dashboard)


def test_in_a_terminal_the_demo_keeps_serving_by_default(tmp_path: Path) -> None:
    port = free_port()
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            _demo_args(tmp_path, port),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**_env(), "TERM": "dumb"},  # plain text: no escape codes inside the printed URL
            preexec_fn=_default_sigint,
        )
    finally:
        os.close(slave)
    reader = os.fdopen(master, "r", encoding="utf-8", errors="replace", newline="")
    with reader, _stopped_at_exit(proc):
        lines = Lines(reader.readline)
        lines.wait_for(re.compile(r"the dashboard stays up after the run; Ctrl-C stops it"))
        _interrupt_and_check(proc, lines, lines.wait_for(KEEP_LINE)[1])


@pytest.mark.parametrize(
    ("flag", "expected"), [((), None), (("--keep-serving",), True), (("--no-keep-serving",), False)]
)
def test_keep_serving_option(
    monkeypatch: pytest.MonkeyPatch, flag: tuple[str, ...], expected: bool | None
) -> None:
    import lldmon_lab.demo
    from monitor.cli import app

    given: list[lldmon_lab.demo.DemoOptions] = []

    def fake_run_demo(options: lldmon_lab.demo.DemoOptions, console: object) -> int:
        given.append(options)
        return 0

    monkeypatch.setattr(lldmon_lab.demo, "run_demo", fake_run_demo)
    result = CliRunner().invoke(app, ["demo", "--no-train", *flag])
    assert result.exit_code == 0, result.output
    assert [o.keep_serving for o in given] == [expected]


def test_interactive_needs_a_terminal_on_stdin_and_stdout(monkeypatch: pytest.MonkeyPatch) -> None:
    from lldmon_lab.demo import interactive

    class Stream:
        def __init__(self, tty: bool) -> None:
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    for stdin, stdout, expected in ((True, True, True), (True, False, False), (False, True, False)):
        monkeypatch.setattr(sys, "stdin", Stream(stdin))
        monkeypatch.setattr(sys, "stdout", Stream(stdout))
        assert interactive() is expected


def test_serve_banner_names_the_dashboard_url(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [EXE, "serve", "--data-dir", str(tmp_path), "--port", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        preexec_fn=_default_sigint,
    )
    with _stopped_at_exit(proc):
        stdout: IO[str] = proc.stdout  # type: ignore[assignment]
        lines = Lines(stdout.readline)
        lines.wait_for(re.compile(rf"^lldmon serving on http://127\.0\.0\.1:{port} "))
        dashboard = lines.wait_for(re.compile(r"^dashboard: (\S+)$"))[1]
        assert dashboard == f"http://127.0.0.1:{port}/dashboard/"
        lines.wait_for(re.compile(r"database: "))  # the banner's end: the dashboard line is part of it
        _wait_until_ready(f"http://127.0.0.1:{port}/readyz", proc)  # serving: SIGINT is a clean stop
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, lines.rest()[-4000:]

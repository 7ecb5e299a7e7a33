"""Run `lldmon` with one chunk's write held open, so that a test can signal the process exactly there
(`paused_import`, the test's side; `main`, the child's).

`python -m tests.monitor.importers.pause_inside_write ARGS...` is `lldmon ARGS...`, except that the write
of chunk number `LLDMON_TEST_PAUSE_CHUNK` (1-based) stops part way: on PostgreSQL right after the COPY
command has been sent (the connection is in COPY state, inside psycopg's wait for the server, where a
KeyboardInterrupt can leave it busy), on SQLite inside the write transaction. There it prints PAUSED_LINE and
blocks reading one byte from the file descriptor `LLDMON_TEST_PAUSE_FD` (a pipe the test holds): the
test signals the process, then writes the byte to let the write go on. A KeyboardInterrupt raised while
blocked leaves exactly as one raised by the driver's own wait would.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

PAUSED_LINE: Final = "lldmon-test: paused inside the write of a chunk"
ROOT: Final = Path(__file__).resolve().parents[3]
GUARD_S: Final = 300.0
"""Only a guard against a child that hangs (a defect the tests look for); no step waits on time."""


@dataclass
class Child:
    """A `lldmon` child whose output lines are read into a queue as they come."""

    proc: subprocess.Popen[str]
    release_fd: int
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    output: list[str] = field(default_factory=list)

    def wait_for(self, marker: str) -> None:
        """Read output until a line holds `marker`; fails if the child ends first."""
        while True:
            line = self.lines.get(timeout=GUARD_S)
            assert line is not None, f"the child ended before {marker!r}:\n{''.join(self.output)}"
            if marker in line:
                return

    def release(self) -> None:
        """Let the paused write go on."""
        os.write(self.release_fd, b"x")

    def finish(self) -> tuple[int, str]:
        try:
            code = self.proc.wait(timeout=GUARD_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"still running {GUARD_S:.0f} s after SIGINT:\n{''.join(self.output)}"
            ) from None
        while self.lines.get(timeout=GUARD_S) is not None:
            pass
        return code, "".join(self.output)


@contextmanager
def paused_import(*args: str, pause_chunk: int) -> Iterator[Child]:
    """`lldmon import ARGS` (this module as the child) that pauses inside the write of chunk
    `pause_chunk` until released."""
    read_fd, write_fd = os.pipe()
    env = {
        **os.environ,
        "COLUMNS": "200",
        "LLDMON_TEST_PAUSE_FD": str(read_fd),
        "LLDMON_TEST_PAUSE_CHUNK": str(pause_chunk),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", __name__, "import", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        pass_fds=(read_fd,),
        # SIGINT at its default disposition, as from a terminal (a shell's `cmd &` would ignore it)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    os.close(read_fd)
    child = Child(proc, write_fd)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            child.output.append(line)
            child.lines.put(line)
        child.lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        yield child
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(write_fd)
        reader.join()
        assert proc.stdout is not None
        proc.stdout.close()


def main() -> None:
    """The child: `lldmon` with the pause patched in (module docstring)."""
    import psycopg

    import monitor.store.ingest as ingest_store
    from monitor.cli import main as lldmon

    fd = int(os.environ["LLDMON_TEST_PAUSE_FD"])
    target = int(os.environ.get("LLDMON_TEST_PAUSE_CHUNK", "3"))
    seen = {"copy": 0, "upsert": 0}

    def pause() -> None:
        print(PAUSED_LINE, flush=True)
        os.read(fd, 1)

    def paused(gen: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
        """`gen` with a pause after its first step (which sends the COPY command)."""
        state = next(gen)
        pause()
        while True:
            ready = yield state
            try:
                state = gen.send(ready)
            except StopIteration as stop:
                return stop.value

    start_copy = psycopg.Cursor._start_copy_gen

    def start_copy_gen(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen["copy"] += 1
        gen = start_copy(self, *args, **kwargs)
        return paused(gen) if seen["copy"] == target else gen

    upsert_many: Callable[..., Any] = ingest_store.upsert_many  # type: ignore[attr-defined]

    def upsert(conn: Any, table: Any, *args: Any, **kwargs: Any) -> Any:
        result = upsert_many(conn, table, *args, **kwargs)
        if table == "step_metrics" and conn.dialect.name == "sqlite":
            seen["upsert"] += 1
            if seen["upsert"] == target:
                pause()
        return result

    psycopg.Cursor._start_copy_gen = start_copy_gen  # type: ignore[method-assign]
    ingest_store.upsert_many = upsert  # type: ignore[attr-defined]
    sys.argv = ["lldmon", *sys.argv[1:]]
    lldmon()


if __name__ == "__main__":
    main()

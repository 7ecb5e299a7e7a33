"""Helpers shared by the benchmarks: scratch PostgreSQL databases, an `lldmon serve` subprocess, stats."""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import httpx
import psycopg
from sqlalchemy.engine import make_url

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self needs Python 3.11


def command_line() -> str:
    """The command as typed (`-m module` kept), with the interpreter's full path."""
    return shlex.join([sys.executable, *sys.orig_argv[1:]])


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def database_url(base_url: str, name: str) -> str:
    """`base_url` (any database on the server) pointed at database `name`, SQLAlchemy psycopg form."""
    url = make_url(base_url).set(drivername="postgresql+psycopg", database=name)
    return url.render_as_string(hide_password=False)


def libpq_conninfo(url: str) -> str:
    """A SQLAlchemy URL as a plain libpq URI for psycopg.connect."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def create_database(base_url: str, name: str) -> str:
    with psycopg.connect(libpq_conninfo(base_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return database_url(base_url, name)


def drop_database(base_url: str, name: str) -> None:
    with psycopg.connect(libpq_conninfo(base_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def server_version(base_url: str) -> str:
    with psycopg.connect(libpq_conninfo(base_url)) as conn:
        row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"


def lldmon_command() -> list[str]:
    script = Path(sys.executable).with_name("lldmon")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from monitor.cli import main; main()"]


class ServerProcess:
    """A server command in a subprocess, its output in `log_path`, ready on enter (GET `health_path`
    answers 200), stopped with SIGTERM then SIGKILL on exit. `own_process_group` starts it in a
    session of its own and signals the whole group (servers that fork workers of their own)."""

    name = "server"
    health_path = "/readyz"
    poll_seconds = 0.1
    stop_timeout = 10.0
    own_process_group = False

    def __init__(
        self,
        args: list[str],
        port: int,
        log_path: Path,
        ready_timeout: float,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.args = args
        self.log_path = log_path
        self.ready_timeout = ready_timeout
        self.env = os.environ.copy() if env is None else env
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.args,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=self.own_process_group,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}{self.health_path}", timeout=2.0).status_code == 200:
                    return
            time.sleep(self.poll_seconds)
        raise TimeoutError(f"{self.name} not ready after {self.ready_timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait()

    def _signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            if self.own_process_group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class LldmonServer(ServerProcess):
    """`lldmon serve <args> --port <free>` in a subprocess."""

    name = "lldmon"

    def __init__(self, args: list[str], log_path: Path, ready_timeout: float = 60.0) -> None:
        port = free_port()
        super().__init__(
            [*lldmon_command(), "serve", *args, "--port", str(port)], port, log_path, ready_timeout
        )


def bench_run(url: str, name: str) -> int:
    """A run (project "bench") created directly in the database at `url`: the id the raw-COPY
    baselines write under, without the service."""
    from monitor.db.engine import make_engine
    from monitor.store import runs as run_store

    engine = make_engine(url)
    with engine.begin() as conn:
        project_id = run_store.get_or_create_project(conn, "bench")
        run, _ = run_store.create_run(conn, project_id, name, {}, [])
    engine.dispose()
    return int(run.id)

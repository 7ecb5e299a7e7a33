"""A private, throw-away PostgreSQL cluster for tests that stop and restart the database.

Never touches the shared cluster on 5432 (other tests use it concurrently): `initdb` into a fresh
directory, `pg_ctl` on a free loopback port, trust auth, the socket in the data directory. initdb
refuses to run as root, so as root the cluster runs as the `postgres` system user (`runuser`).
`unavailable_reason()` says why a test must skip (no binaries, no such user)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from tests.live_server import free_port


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    pg_ctl = shutil.which("pg_ctl")
    return Path(pg_ctl).parent if pg_ctl else None


def _run_as() -> str | None:
    """The user to run the cluster as (None: the current user, who is not root)."""
    return "postgres" if os.geteuid() == 0 else None


def unavailable_reason() -> str | None:
    if _bin_dir() is None:
        return "no PostgreSQL server binaries (initdb, pg_ctl) installed"
    user = _run_as()
    if user is not None:
        try:
            pwd.getpwnam(user)
        except KeyError:
            return "running as root and there is no 'postgres' user to run initdb as"
        if shutil.which("runuser") is None:
            return "running as root and runuser is missing"
    return None


class PrivatePostgres:
    """`with PrivatePostgres() as pg:` a running cluster; `pg.url`, `pg.stop_immediately()`, `pg.start()`."""

    def __init__(self) -> None:
        bin_dir = _bin_dir()
        assert bin_dir is not None, unavailable_reason()
        self.bin_dir = bin_dir
        self.user = _run_as()
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="lldmon-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._cmd("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")

    def _cmd(self, tool: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bin_dir / tool), *args]
        if self.user is not None:
            argv = ["runuser", "-u", self.user, "--", *argv]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if result.returncode != 0:
            raise RuntimeError(
                f"{tool} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n{self._log()}"
            )
        return result

    def _log(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def start(self) -> PrivatePostgres:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off"
        self._cmd(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "30", "start"
        )
        return self

    def stop_immediately(self) -> None:
        """`pg_ctl stop -m immediate`: no checkpoint, open connections cut, as in a crash."""
        self._cmd("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def running(self) -> bool:
        argv = [str(self.bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-t", "1"]
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0

    def destroy(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._cmd("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        deadline = time.monotonic() + 5
        while (self.data / "postmaster.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PrivatePostgres:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.destroy()

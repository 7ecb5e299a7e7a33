"""A real `lldmon serve` process on loopback, for client and sync tests: start, kill -9, restart.

The server runs on the embedded SQLite file of `data_dir` and keeps its port across restarts, so a
client pointed at `server.url` sees it go away and come back.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import httpx

from contracts.wire import API_PREFIX


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def blackhole() -> Iterator[str]:
    """URL of a server that accepts TCP connections and never answers (requests run into timeouts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


class LiveServer:
    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        env: dict[str, str] | None = None,
        database_url: str | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.database_url = database_url  # None: the embedded SQLite file of data_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api = self.url + API_PREFIX
        self.log_path = data_dir / "server.log"
        self._extra_env = env or {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    # lifecycle

    def start(self, timeout: float = 45.0) -> LiveServer:
        assert self._proc is None, "already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        exe = shutil.which("lldmon") or str(Path(sys.executable).parent / "lldmon")
        env = {**os.environ, **self._extra_env}
        env.pop("LLDMON_DATABASE_URL", None)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed when the process ends
        self._proc = subprocess.Popen(
            [exe, "serve", "--data-dir", str(self.data_dir), "--host", "127.0.0.1", "--port", str(self.port)]
            + (["--database-url", self.database_url] if self.database_url else []),
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self._proc.poll() is not None:
                self._reap()
                raise AssertionError(f"server exited at start:\n{self.output()}")
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"server not ready after {timeout}s:\n{self.output()}")
            time.sleep(0.1)

    def kill(self) -> None:
        """kill -9: no shutdown, open requests are cut."""
        if self._proc is not None:
            self._proc.kill()
            self._reap()

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._reap()

    def restart(self) -> LiveServer:
        self.kill()
        return self.start()

    def _reap(self) -> None:
        assert self._proc is not None
        self._proc.wait(timeout=15)
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # reading back through the HTTP API

    def get(self, path: str, **params: Any) -> Any:
        response = httpx.get(f"{self.api}{path}", params=params, timeout=10.0)
        assert response.status_code == 200, response.text
        return response.json()

    def run_id(self, name: str, project: str = "default") -> int:
        runs = [r for r in self.get("/runs", project=project, limit=1000) if r["name"] == name]
        assert len(runs) == 1, runs
        return int(runs[0]["id"])

    def series(self, run_id: int) -> dict[str, dict[str, list[Any]]]:
        series: dict[str, dict[str, list[Any]]] = self.get(f"/runs/{run_id}/metrics")["series"]
        return series

    def ledger(self, run_id: int) -> dict[str, tuple[int, int]]:
        """kind -> (batches, rows) of the server's batch ledger: rows counted twice would show here."""
        db = sqlite3.connect(f"file:{self.data_dir / 'lldmon.db'}?mode=ro", uri=True)
        try:
            rows = db.execute(
                "SELECT kind, count(*), sum(n_rows) FROM ingest_batches WHERE run_id = ? GROUP BY kind",
                (run_id,),
            ).fetchall()
        finally:
            db.close()
        return {kind: (int(n), int(total)) for kind, n, total in rows}

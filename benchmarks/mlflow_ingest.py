"""The MLflow tracking server as an ingest baseline for `benchmarks.ingest` (the `mlflow` mode).

MLflow lives in its own venv (`.venv-bench`, made by `bash benchmarks/setup_mlflow_venv.sh` from
`benchmarks/requirements-mlflow.txt`), never in the project's: it brings its own SQLAlchemy, alembic
and Flask stack. The server runs as `mlflow server --backend-store-uri postgresql://...` on a scratch
database of the same PostgreSQL server lldmon writes to, one worker process (as `lldmon serve` runs
one), and receives the same metric points (key, step, value) through its REST API:
`/api/2.0/mlflow/experiments/create`, `/runs/create`, then `/runs/log-batch` with at most 1,000 metrics
per call (MLflow's limit), so one 5,000-row lldmon batch is five log-batch calls.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any, Protocol

import httpx
import orjson

try:
    from benchmarks import _util
except ModuleNotFoundError:  # run as a script: python benchmarks/ingest.py
    import _util  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VENV = ROOT / ".venv-bench"
LOG_BATCH_MAX = 1000
"""MLflow's limit on metrics per /runs/log-batch request."""


class Columns(Protocol):
    def columns(self, k: int) -> tuple[list[int], dict[str, list[float]]]: ...


def unavailable(venv: Path) -> str | None:
    """Why the MLflow baseline cannot run here (None when it can)."""
    exe = venv / "bin" / "mlflow"
    if not exe.exists():
        return f"{exe} not found: create it with `bash benchmarks/setup_mlflow_venv.sh`"
    try:
        subprocess.run([str(exe), "--version"], check=True, capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`{exe} --version` failed: {exc}"
    return None


def version(venv: Path) -> str:
    out = subprocess.run(
        [str(venv / "bin" / "mlflow"), "--version"], capture_output=True, text=True, timeout=120
    )
    return out.stdout.strip().rsplit(" ", 1)[-1]  # "mlflow, version 3.17.2" -> "3.17.2"


class MlflowServer(_util.ServerProcess):
    """`mlflow server` on a PostgreSQL database (a libpq URL) in its own process group (SIGTERM and
    SIGKILL reach its uvicorn worker too)."""

    name = "mlflow server"
    health_path = "/health"
    poll_seconds = 0.5
    stop_timeout = 15.0
    own_process_group = True

    def __init__(self, venv: Path, db_url: str, workdir: Path, ready_timeout: float = 180.0) -> None:
        port = _util.free_port()
        store = _util.libpq_conninfo(db_url)  # postgresql://user@host:port/db
        args = [
            str(venv / "bin" / "mlflow"),
            "server",
            "--backend-store-uri",
            store,
            "--default-artifact-root",
            str(workdir / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        super().__init__(args, port, workdir / "mlflow.log", ready_timeout, env=env)


class MlflowMode:
    """Sends workload batch k as ceil(rows / 1000) log-batch calls to one MLflow run."""

    def __init__(self, server: MlflowServer, workload: Columns) -> None:
        self.client = httpx.Client(base_url=server.url + "/api/2.0/mlflow", timeout=300.0)
        experiment = self._post("/experiments/create", {"name": "lldmon-bench"})["experiment_id"]
        run = self._post("/runs/create", {"experiment_id": experiment, "start_time": _now_ms()})
        self.run_id: str = run["run"]["info"]["run_id"]
        self.workload = workload

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        response = self.client.post(path, json=body)
        response.raise_for_status()
        return response.json()

    def prepare(self, k: int) -> list[tuple[int, bytes]]:
        steps, metrics = self.workload.columns(k)
        ts = _now_ms()
        points = [
            {"key": name, "value": value, "timestamp": ts, "step": step}
            for name, values in metrics.items()
            for step, value in zip(steps, values, strict=True)
        ]
        return [
            (len(chunk), orjson.dumps({"run_id": self.run_id, "metrics": chunk}))
            for chunk in (points[i : i + LOG_BATCH_MAX] for i in range(0, len(points), LOG_BATCH_MAX))
        ]

    def send(self, calls: list[tuple[int, bytes]]) -> int:
        rows = 0
        for n, body in calls:
            response = self.client.post(
                "/runs/log-batch", content=body, headers={"content-type": "application/json"}
            )
            if response.status_code != 200:
                print(f"  ! mlflow: HTTP {response.status_code}: {response.text[:200]}")
                return 0
            rows += n
        return rows

    def stored_rows(self, db_url: str) -> int:
        """Rows in MLflow's `metrics` table for the run: what the server really committed."""
        import psycopg

        with psycopg.connect(_util.libpq_conninfo(db_url)) as conn:
            row = conn.execute("SELECT count(*) FROM metrics WHERE run_uuid = %s", (self.run_id,)).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self.client.close()


def _now_ms() -> int:
    return int(time.time() * 1000)

"""The compose stack's topology as processes (no Docker engine here): migrations once, two `lldmon
serve --workers 2` replicas on one PostgreSQL database, and a real Prometheus scraping both with the
shipped config and rules. Every worker process counts its own requests; the counters a scrape sees
must be the replica's total whichever worker answers, or Prometheus reads a counter reset on every
scrape that lands on another worker (and rate() turns to noise)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import PG_URL, drop_postgres_database, fresh_postgres_database
from tests.live_server import free_port
from tests.ops.conftest import require_binary

ROOT = Path(__file__).resolve().parents[2]
BATCHES = 12  # per replica
STORED = 'lldmon_ingest_batches_total{kind="metrics",outcome="stored"}'


def _lldmon() -> str:
    return shutil.which("lldmon") or str(Path(sys.executable).parent / "lldmon")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("LLDMON_DATABASE_URL", "LLDMON_METRICS_TOKEN", "PROMETHEUS_MULTIPROC_DIR"):
        env.pop(name, None)
    return env


def _wait(check: Any, what: str, log: Path | None = None, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError, AssertionError, KeyError, IndexError, ValueError):
            result = check()
            if result:
                return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{log.read_text()[-3000:] if log else ''}")
        time.sleep(0.25)


@contextlib.contextmanager
def _process(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=_env())
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _stored(url: str) -> float:
    """The stored-batches counter of one scrape of `url`/metrics (0 before the first batch)."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "lldmon_ingest_batches_total" and sample.labels == {
                "kind": "metrics",
                "outcome": "stored",
            }:
                return sample.value
    return 0.0


def _prometheus_config(tmp_path: Path, targets: list[str]) -> Path:
    """deploy/prometheus.yml with the two processes as static targets instead of compose's DNS
    discovery, the shipped rules from the checkout and a 1 s scrape interval."""
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(ROOT / "monitor" / "alerting" / "prometheus-rules.yml")]
    config.pop("alerting")
    [job] = config["scrape_configs"]
    job.pop("dns_sd_configs")
    job["static_configs"] = [{"targets": targets}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.postgres
@pytest.mark.skipif(PG_URL is None, reason="needs LLDMON_TEST_DATABASE_URL (PostgreSQL)")
def test_two_replicas_with_two_workers_scraped_by_prometheus(tmp_path: Path) -> None:
    prometheus = require_binary("prometheus")
    assert PG_URL is not None
    database_url = fresh_postgres_database(PG_URL)
    try:
        migrate = subprocess.run(
            [_lldmon(), "db", "upgrade", "--database-url", database_url],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert migrate.returncode == 0, migrate.stdout + migrate.stderr
        ports = [free_port(), free_port()]
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        with contextlib.ExitStack() as stack:
            for i, port in enumerate(ports):
                args = [
                    _lldmon(),
                    "serve",
                    "--database-url",
                    database_url,
                    "--workers",
                    "2",
                    "--port",
                    str(port),
                ]
                stack.enter_context(_process(args, tmp_path / f"serve-{i}.log"))
            for i, url in enumerate(urls):
                _wait(
                    lambda url=url: httpx.get(f"{url}/readyz", timeout=2).status_code == 200,
                    "readyz",
                    tmp_path / f"serve-{i}.log",
                )
            prom_port = free_port()
            prom_url = f"http://127.0.0.1:{prom_port}"
            config = _prometheus_config(tmp_path, [f"127.0.0.1:{p}" for p in ports])
            prom_log = tmp_path / "prometheus.log"
            stack.enter_context(
                _process(
                    [
                        prometheus,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{prom_port}",
                    ],
                    prom_log,
                )
            )

            def query(expr: str) -> list[dict[str, Any]]:
                reply = httpx.get(f"{prom_url}/api/v1/query", params={"query": expr}, timeout=5).json()
                assert reply["status"] == "success", reply
                result: list[dict[str, Any]] = reply["data"]["result"]
                return result

            _wait(lambda: len(query('up{job="lldmon"} == 1')) == 2, "both targets up", prom_log)
            rules = httpx.get(f"{prom_url}/api/v1/rules", timeout=5).json()["data"]["groups"]
            assert {"LLDDecay", "LLDCollapse"} <= {r["name"] for g in rules for r in g["rules"]}

            run = httpx.post(
                f"{urls[0]}/api/v1/runs", json={"name": "topology", "project": "ops"}, timeout=10
            )
            assert run.status_code == 201, run.text
            run_id = run.json()["id"]
            for step in range(BATCHES):
                for url in urls:  # a new connection per request: the replica's workers take turns
                    body = {"batch_id": uuid.uuid4().hex, "steps": [step], "metrics": {"reward/mean": [0.5]}}
                    reply = httpx.post(f"{url}/api/v1/runs/{run_id}/metrics", json=body, timeout=30)
                    assert reply.status_code == 200, reply.text
                    time.sleep(0.05)

            # every scrape of a replica, whichever worker answers it, reports the replica's total
            for url in urls:
                assert [_stored(url) for _ in range(12)] == [float(BATCHES)] * 12

            def per_instance() -> dict[str, float]:
                rows = query(f"sum by (instance) ({STORED})")
                return {r["metric"]["instance"]: float(r["value"][1]) for r in rows}

            expected = {f"127.0.0.1:{p}": float(BATCHES) for p in ports}
            _wait(lambda: per_instance() == expected, f"Prometheus to see {expected}", prom_log)
            time.sleep(3)  # a few more scrapes of each replica
            assert per_instance() == expected
            [resets] = query("sum(resets(lldmon_ingest_batches_total[5m]))")
            assert float(resets["value"][1]) == 0.0  # no scrape saw a counter go back
            # the run's phase is a database-derived gauge: both replicas report it
            phases = query(f'lldmon_run_phase{{run_id="{run_id}"}}')
            assert {r["metric"]["instance"] for r in phases} == set(expected)
    finally:
        drop_postgres_database(database_url)

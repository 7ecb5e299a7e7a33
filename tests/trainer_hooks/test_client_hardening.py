"""MonitorClient defects of issue 16: non-finite config without orjson (1), batches over the service's
body limit (2), spool order and drop logging under a frozen service (11), URL mistakes and what
close() leaves behind (14). Storage tests run against a real `lldmon serve` on every test database."""

from __future__ import annotations

import gzip
import json
import logging
import math
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts import spool
from contracts.wire import MAX_BODY_HEADER
from tests.conftest import live_server_on
from tests.live_server import LiveServer, free_port
from tests.test_lldmon_client import BAD_URLS
from trainer_hooks import _batching
from trainer_hooks.client import MonitorClient, RetryPolicy

pytestmark = pytest.mark.timeout(120)

LIMIT = 64 * 1024
"""The test server's body limit (LLDMON_MAX_BODY_BYTES), far below the client's default cap."""


@pytest.fixture(scope="module")
def server(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """`lldmon serve` with a 64 KiB body limit, on SQLite and (when configured) PostgreSQL."""
    tmp = tmp_path_factory.mktemp(f"server-{backend}")
    with live_server_on(backend, tmp, {"LLDMON_MAX_BODY_BYTES": str(LIMIT)}) as live:
        yield live


class Recorder(httpx.BaseTransport):
    """The real transport, recording (path, decompressed body size, status) of every request."""

    def __init__(self, hide_limit: bool = False) -> None:
        self.inner = httpx.HTTPTransport()
        self.seen: list[tuple[str, int, int]] = []
        self._lock = threading.Lock()
        self.hide_limit = hide_limit
        """Drop the service's body-limit header, as a proxy in front of it might."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        response = self.inner.handle_request(request)
        if self.hide_limit:
            del response.headers[MAX_BODY_HEADER]
        with self._lock:
            self.seen.append((request.url.path, len(body), response.status_code))
        return response

    def close(self) -> None:
        self.inner.close()

    def ingest(self) -> list[tuple[int, int]]:
        """(body size, status) of every metrics / actions request."""
        return [(size, status) for path, size, status in self.seen if path.endswith(("/metrics", "/actions"))]


def run_of(server: LiveServer, name: str) -> dict[str, Any]:
    runs = [r for r in server.get("/runs", name=name, limit=10)]
    assert len(runs) == 1, runs
    return runs[0]  # type: ignore[no-any-return]


def wide_metrics(step: int, n: int) -> dict[str, float]:
    """`n` metrics, some non-finite (they must survive the split like any value)."""
    out = {f"m/{i:04d}": step + i / 1000 for i in range(n)}
    out["m/0000"] = math.inf if step % 7 == 0 else float(step)
    return out


# ------------------------------------------------------------------------ 1: non-finite run config


@pytest.mark.parametrize("orjson", [False, True], ids=["without-orjson", "with-orjson"])
def test_nonfinite_config_registers_with_or_without_orjson(
    server: LiveServer,
    make_client: Callable[..., MonitorClient],
    monkeypatch: pytest.MonkeyPatch,
    orjson: bool,
) -> None:
    if not orjson:  # a `lldmon[hooks]` training image: orjson is not installed
        monkeypatch.setattr(_batching, "_orjson_dumps", None)
    name = f"cfg-inf-{orjson}"
    config = {
        "max_grad_norm": math.inf,
        "floor": -math.inf,
        "eps": math.nan,
        "lr": 1e-6,
        "nested": [math.inf],
    }
    client = make_client(server.url, name, config=config)
    for step in range(200):
        client.log(step, {"loss": 1.0 / (step + 1)})
    assert client.flush(timeout=30)
    assert client.run_id is not None, "the run never registered"
    client.close(timeout=10)
    assert client.stats.spooled == 0 and client.stats.sent > 0, client.stats
    run = run_of(server, name)
    stored = run["config"]
    assert stored["max_grad_norm"] == "Infinity" and stored["floor"] == "-Infinity"
    assert stored["eps"] == "NaN" and stored["lr"] == 1e-6 and stored["nested"] == ["Infinity"]
    assert server.series(run["id"])["loss"]["steps"] == list(range(200))


def test_dumps_without_orjson_spells_nonfinite_floats_as_the_wire_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_batching, "_orjson_dumps", None)
    assert json.loads(_batching.dumps({"a": [math.inf, -math.inf, 1.5], "b": math.nan})) == {
        "a": ["Infinity", "-Infinity", 1.5],
        "b": "NaN",
    }


# ------------------------------------------------------------------- 2: batches over the body limit


@pytest.mark.parametrize("hide_limit", [False, True], ids=["announced", "behind-a-proxy"])
def test_a_flush_window_over_the_body_limit_is_split_not_rejected(
    server: LiveServer, make_client: Callable[..., MonitorClient], hide_limit: bool
) -> None:
    """Issue 16 #2 scaled down: one flush window far over the service's limit (here 64 KiB; the
    report: 5,000 steps x 800 metrics against 32 MiB). Before: one 413, the batch filed as rejected."""
    recorder = Recorder(hide_limit=hide_limit)
    name = f"wide-{hide_limit}"
    client = make_client(server.url, name, transport=recorder, flush_interval=30.0)
    steps, width = range(300), 60  # ~18,000 values, ~400 KB of JSON in one batch
    for step in steps:
        client.log(step, wide_metrics(step, width))
    assert client.flush(timeout=60)
    client.close(timeout=10)
    assert client.stats.rejected == 0 and client.stats.spooled == 0, client.stats
    assert spool.spool_size(client.spool_dir / spool.REJECTED_DIR) == (0, 0)
    statuses = [status for _, status in recorder.ingest()]
    # The limit the service announces on every answer is adopted at registration: no 413 at all.
    # Where a proxy drops the header, it is learnt from the one 413 that names it.
    assert statuses.count(413) == (1 if hide_limit else 0)
    assert all(size <= LIMIT for size, status in recorder.ingest() if status == 200)
    series = server.series(run_of(server, name)["id"])
    assert len(series) == width
    assert series["m/0000"]["steps"] == list(steps)
    assert series["m/0000"]["values"] == ["Infinity" if s % 7 == 0 else float(s) for s in steps]
    assert series["m/0059"]["values"] == [s + 59 / 1000 for s in steps]


def test_batches_stay_under_the_clients_byte_cap(
    server: LiveServer, make_client: Callable[..., MonitorClient]
) -> None:
    """With a cap under the service's limit no 413 happens at all; one step with very many metrics
    is split by names."""
    recorder = Recorder()
    cap = 16 * 1024
    client = make_client(server.url, "capped", transport=recorder, flush_interval=30.0, max_batch_bytes=cap)
    for step in range(100):
        client.log(step, wide_metrics(step, 40))
    client.log(100, wide_metrics(100, 3000))  # one step alone is ~80 KB
    actions = {
        "traj_index": list(range(2000)),
        "action_index": [0] * 2000,
        "n_tokens": [3] * 2000,
        "delta": [-0.5] * 2000,
        "is_answer": [False] * 2000,
    }
    client.log_actions(100, actions)
    assert client.flush(timeout=60)
    client.close(timeout=10)
    sizes = recorder.ingest()
    assert sizes and all(status == 200 and size <= cap for size, status in sizes), sizes
    run_id = run_of(server, "capped")["id"]
    series = server.series(run_id)
    assert len(series) == 3000 and series["m/2999"]["steps"] == [100]
    assert series["m/0039"]["steps"] == list(range(101))
    assert server.get(f"/runs/{run_id}/actions")["traj_index"] == list(range(2000))


# --------------------------------------------------------------- 11: spool order under a frozen service


def test_a_frozen_service_leaves_the_newest_data_in_the_spool_without_holes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The sender is stuck in a request with the oldest steps while newer ones overflow to disk; the
    stuck batch is spooled last. The spool must still be in logging order, so the size limit drops
    the oldest steps (before: it dropped the newer overflow and kept a stretch of old steps)."""
    entered, release = threading.Event(), threading.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/api/v1/runs":
            return httpx.Response(201, json={"id": 7})
        if path.endswith("/directive"):
            return httpx.Response(404, json={})
        if path.endswith("/metrics"):
            entered.set()
            release.wait(20)  # frozen
            return httpx.Response(503, json={"error": {"message": "down"}})
        return httpx.Response(200, json={})

    caplog.set_level(logging.WARNING, logger="lldmon.client")
    client = MonitorClient(
        "http://lldmon.test",
        "frozen",
        spool_dir=tmp_path / "spool",
        transport=httpx.MockTransport(handler),
        max_queue=10,
        max_batch_rows=10,
        flush_interval=0.05,
        spool_max_bytes=6000,
        retry=RetryPolicy(attempts=1, backoff_base=0.01, backoff_max=10.0),
        enabled=True,
    )
    client.log(0, {"a": 0.0, "b": 0.5})
    assert entered.wait(10)
    for step in range(1, 600):  # queue full: the overflow goes to disk from this thread
        client.log(step, {"a": float(step), "b": step / 3})
    release.set()
    client.close(timeout=5)
    steps = [s for e in spool.iter_entries(client.spool_dir) for s in e.body["steps"]]
    assert 0 < len(steps) < 600
    assert steps == list(range(600 - len(steps), 600)), "the newest steps, in order, no hole"
    drops = [r.getMessage() for r in caplog.records if "over its limit" in r.getMessage()]
    so_far = [int(re.search(r"(\d+) batches dropped so far", m).group(1)) for m in drops]  # type: ignore[union-attr]
    assert so_far and so_far[-1] == client.stats.dropped


# ---------------------------------------------------------------------------- 14: URL mistakes, close()


@pytest.mark.parametrize(("url", "message"), BAD_URLS)
def test_a_url_the_client_cannot_use_is_refused_at_construction(
    tmp_path: Path, url: str, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        MonitorClient(url, "r", spool_dir=tmp_path, enabled=True)
    with pytest.raises(ValueError, match="LLDMON_URL"):
        MonitorClient.from_env("r", environ={"LLDMON_URL": url or "x"}, spool_dir=tmp_path, enabled=True)


@pytest.mark.parametrize(
    "url", ["http://lldmon.test/api/v1", "http://lldmon.test/api/v1/", " http://lldmon.test// "]
)
def test_an_api_v1_url_is_normalised_and_delivers(tmp_path: Path, url: str) -> None:
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        if request.url.path == "/api/v1/runs":
            return httpx.Response(201, json={"id": 7})
        if request.url.path == "/api/v1/runs/7/metrics":
            body = json.loads(gzip.decompress(request.read()))
            return httpx.Response(200, json={"batch_id": body["batch_id"], "duplicate": False})
        if request.url.path.startswith("/api/v1/runs/7/"):
            return httpx.Response(200, json={})
        return httpx.Response(404, json={"error": {"message": "no such route"}})

    client = MonitorClient(
        url,
        "r",
        spool_dir=tmp_path,
        transport=httpx.MockTransport(handler),
        flush_interval=0.02,
        enabled=True,
    )
    client.log(0, {"a": 1.0})
    assert client.flush(timeout=10)
    client.close(timeout=5)
    assert client.stats.sent == 1 and client.stats.spooled == 0, (client.stats, paths)
    assert all(p.startswith("/api/v1/runs") and "/api/v1/api/v1" not in p for p in paths), paths
    assert client.url == "http://lldmon.test"


def test_close_says_what_stays_in_the_spool_and_how_to_send_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="lldmon.client")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listening
    client = MonitorClient(
        url,
        "left",
        spool_dir=tmp_path / "spool",
        max_batch_rows=10,
        flush_interval=0.02,
        retry=RetryPolicy(attempts=1, backoff_base=0.01, backoff_max=10.0),
        enabled=True,
    )
    for step in range(50):
        client.log(step, {"a": float(step)})
    client.close(timeout=5)
    left = spool.spool_size(client.spool_dir)[0]
    assert left > 0
    said = [r.getMessage() for r in caplog.records if "stay in the spool" in r.getMessage()]
    assert len(said) == 1, said
    assert f"{left} batches" in said[0] and f"lldmon sync {client.spool_dir} --url {url}" in said[0]

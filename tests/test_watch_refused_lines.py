"""`lldmon watch`: a record the service refuses (422) is isolated and reported; every other value of
its chunk is stored, the saved offset moves on only once each value is stored or individually refused,
and the counts printed are the counts stored.

A real `lldmon serve` (SQLite and, when configured, PostgreSQL) stores the batches. The refusals come
either from the service itself (a metric key it rejects) or from a transport in front of it that
refuses any batch carrying a marked metric, as a newer service with a stricter rule would.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts import metrics as M
from monitor.watch import Service, Watcher, WatchState, state_file
from tests.conftest import live_server_on
from tests.live_server import LiveServer
from tests.test_watch import expected_verl, finished, ledger_rows, n_values, series_by_step, verl_line, watch

pytestmark = pytest.mark.timeout(120)

MARKED = "refuse/me"


@pytest.fixture(scope="module")
def server(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server_on(backend, tmp_path_factory.mktemp(f"watch-refused-{backend}")) as live:
        yield live


class StricterService(httpx.BaseTransport):
    """Forwards to the live service, except that a metrics batch naming `MARKED` gets the service's
    422 (before it reaches the service, so nothing of it is stored). Counts the requests, and sets
    `stop` after `stop_after` metrics requests (a watcher stopped in the middle of isolating)."""

    def __init__(self, stop: threading.Event | None = None, stop_after: int | None = None) -> None:
        self.inner = httpx.HTTPTransport()
        self.stop, self.stop_after = stop, stop_after
        self.metrics_requests = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/metrics"):
            self.metrics_requests += 1
            if self.stop is not None and self.metrics_requests == self.stop_after:
                self.stop.set()
            body = json.loads(gzip.decompress(request.read()))
            if MARKED in body["metrics"]:
                error = {
                    "code": "invalid_input",
                    "message": "this metric is refused",
                    "field": f"metrics.{MARKED}",
                }
                return httpx.Response(422, json={"error": error}, request=request)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def marked_line(step: int) -> str:
    obj = json.loads(verl_line(step))
    obj["data"][MARKED] = 1.0
    return json.dumps(obj)


def test_a_key_the_service_refuses_costs_only_that_key(server: LiveServer, tmp_path: Path) -> None:
    """A key the service rejects on line 13 of 40: every other value of all 40 steps is stored, the
    output counts what was stored and names the line, exit 0."""
    log = tmp_path / "metrics.jsonl"
    lines = [verl_line(s) for s in range(40)]
    lines[12] = lines[12].replace('{"actor/entropy"', '{"bad\\ud800key": 1.0, "actor/entropy"')
    log.write_text("".join(line + "\n" for line in lines))
    out = finished(watch(server, log, "bad-key", tmp_path / "state", "--from-start", "--until-idle", "1.5"))
    series = series_by_step(server, "bad-key")
    assert {k: series[k] for k in expected_verl(range(40))} == expected_verl(range(40))
    assert ledger_rows(server, "bad-key") == n_values(series)
    assert "sent 40 steps" in out, out
    assert f"{log}:13:" in out, out


def run_watcher(
    server: LiveServer, log: Path, run: str, state: Path, transport: StricterService, stop: threading.Event
) -> tuple[Any, list[str]]:
    said: list[str] = []
    service = Service(server.url, run, "w", None, stop, said.append, transport=transport)
    try:
        watcher = Watcher(
            log,
            service,
            state,
            fmt="verl-jsonl",
            from_start=True,
            until_idle=0.3,
            interval=0.02,
            echo=said.append,
        )
        summary = watcher.run()
    finally:
        service.close()
    return summary, said


def test_refused_records_are_isolated_and_the_rest_stored(server: LiveServer, tmp_path: Path) -> None:
    """Two lines of one chunk carry a metric the service refuses: the rest of the chunk (their other
    metrics too) is stored once, each refusal is reported with file:line and the service's reason,
    the summary counts 40 steps and 2 refused values, and the state moves past the chunk."""
    log = tmp_path / "metrics.jsonl"
    lines = [verl_line(s) for s in range(40)]
    lines[5], lines[30] = marked_line(5), marked_line(30)
    log.write_text("".join(line + "\n" for line in lines))
    state = state_file(tmp_path / "state", log, server.api, "w", "isolate")
    transport = StricterService()
    summary, said = run_watcher(server, log, "isolate", state, transport, threading.Event())
    series = series_by_step(server, "isolate")
    assert {k: series[k] for k in expected_verl(range(40))} == expected_verl(range(40))
    assert MARKED not in series
    assert ledger_rows(server, "isolate") == n_values(series)
    assert summary.steps == 40 and summary.refused == 2
    text = "\n".join(said)
    assert f"{log}:6: step 5: {MARKED} refused: HTTP 422" in text and "this metric is refused" in text, text
    assert f"{log}:31: step 30: {MARKED} refused" in text, text
    saved = WatchState.load(state, str(log))
    assert saved is not None and saved.pending is None and saved.offset == log.stat().st_size
    assert transport.metrics_requests < 40  # isolated by halving, not one request per step


def test_stopped_while_isolating_resumes_without_a_second_copy(server: LiveServer, tmp_path: Path) -> None:
    """Stopped after a few of the halving requests: the chunk stays pending, and the restart stores
    the rest under the same part ids (the parts stored before are duplicates, never second copies)."""
    log = tmp_path / "metrics.jsonl"
    lines = [marked_line(s) if s in (3, 17, 33) else verl_line(s) for s in range(40)]
    log.write_text("".join(line + "\n" for line in lines))
    state = state_file(tmp_path / "state", log, server.api, "w", "resume-isolating")
    stop = threading.Event()
    run_watcher(server, log, "resume-isolating", state, StricterService(stop, stop_after=6), stop)
    saved = WatchState.load(state, str(log))
    assert saved is not None and saved.pending is not None and saved.offset == 0
    summary, _ = run_watcher(server, log, "resume-isolating", state, StricterService(), threading.Event())
    series = series_by_step(server, "resume-isolating")
    assert {k: series[k] for k in expected_verl(range(40))} == expected_verl(range(40))
    assert ledger_rows(server, "resume-isolating") == n_values(series)
    assert summary.refused == 3 and summary.duplicates >= 1
    assert series[M.REWARD_MEAN] == {s: s / 10 for s in range(40)}

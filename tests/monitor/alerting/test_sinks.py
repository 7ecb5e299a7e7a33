"""Webhook delivery: retried against a real local HTTP server, never blocking the caller."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry

from monitor.alerting.sinks import Dispatcher, LogSink, Notification, SlackSink, WebhookSink
from monitor.telemetry import ServiceMetrics, Snapshot


class Receiver:
    """A loopback HTTP server that fails the first `failures` requests with 503."""

    def __init__(self, failures: int, delay: float = 0.0) -> None:
        self.failures = failures
        self.delay = delay
        self.bodies: list[dict[str, object]] = []
        self.attempts = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver.attempts += 1
                body = self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(receiver.delay)
                if receiver.attempts <= receiver.failures:
                    self.send_response(503)
                else:
                    receiver.bodies.append(json.loads(body))
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def telemetry() -> ServiceMetrics:
    return ServiceMetrics(CollectorRegistry(), Snapshot)


EVIDENCE = {
    "degraded": False,
    "signals": {
        "grad_surge": {
            "fired": True,
            "metric": "grad/norm",
            "statistic": 5.17023,
            "threshold": 5.0,
            "window": 5,
            "statistic_is": "ratio of recent median to baseline median",
            "recent_median": 4.101945,
            "baseline_median": 0.793378,
        }
    },
    "active_at": 140,
}
EXPLANATION = [
    "gradient-norm surge: ratio of recent median to baseline median = 5.17 (threshold 5) over the last 5 steps"
    " (steps 136-140); grad/norm now 4.1 vs baseline 0.793"
]
WHEN = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
NOTE = Notification(
    "firing",
    7,
    3,
    "grpo-3b",
    "nq",
    "lld_collapse",
    "critical",
    140,
    "likelihood drop",
    EVIDENCE,
    phase="collapse",
    timestamp=WHEN,
)


def counter(telemetry: ServiceMetrics, sink: str, outcome: str) -> float:
    value = telemetry.registry.get_sample_value(
        "lldmon_notifications_total", {"sink": sink, "outcome": outcome}
    )
    return value or 0.0


def test_webhook_is_retried_until_delivered(telemetry: ServiceMetrics) -> None:
    receiver = Receiver(failures=2)
    try:
        sink = WebhookSink(receiver.url, timeout=5)
        dispatcher = Dispatcher([sink], telemetry, base_delay=0.01, public_url="https://lldmon.example.org/")
        dispatcher.submit([NOTE])
        assert dispatcher.join(10)
        dispatcher.close()
    finally:
        receiver.close()
    assert receiver.attempts == 3
    assert receiver.bodies == [
        {
            "event": "firing",
            "alert_id": 7,
            "run_id": 3,
            "run_name": "grpo-3b",
            "project": "nq",
            "kind": "lld_collapse",
            "severity": "critical",
            "step": 140,
            "message": "likelihood drop",
            "evidence": EVIDENCE,  # raw, for machines
            "explanation": EXPLANATION,  # in words, for people
            "phase": "collapse",
            "previous_severity": None,
            "timestamp": "2026-12-01T12:00:00+00:00",
            "dashboard_url": "https://lldmon.example.org/dashboard/run/3",
            "first_step": None,
            "last_step": None,
            "reopen_count": 0,
        }
    ]
    assert counter(telemetry, sink.name, "sent") == 1


def test_dead_webhook_gives_up_and_is_counted(telemetry: ServiceMetrics) -> None:
    receiver = Receiver(failures=100)
    try:
        sink = WebhookSink(receiver.url, timeout=5)
        dispatcher = Dispatcher([sink], telemetry, max_attempts=3, base_delay=0.01)
        dispatcher.submit([NOTE])
        assert dispatcher.join(10)
        dispatcher.close()
    finally:
        receiver.close()
    assert receiver.attempts == 3
    assert counter(telemetry, sink.name, "failed") == 1


def test_slow_sink_never_blocks_submit(telemetry: ServiceMetrics) -> None:
    receiver = Receiver(failures=0, delay=0.5)
    try:
        dispatcher = Dispatcher([SlackSink(receiver.url, timeout=5)], telemetry, base_delay=0.01)
        start = time.perf_counter()
        dispatcher.submit([NOTE, NOTE, NOTE])
        assert time.perf_counter() - start < 0.1
        assert dispatcher.join(10)
        dispatcher.close()
    finally:
        receiver.close()
    assert receiver.bodies[0] == {"text": f"{NOTE.summary()}\n• {EXPLANATION[0]}\n2026-12-01T12:00:00+00:00"}
    assert "[CRITICAL] nq/grpo-3b (run 3) step 140 phase collapse: lld_collapse" in NOTE.summary()


def test_explanation_is_derived_from_the_evidence_and_says_degraded_only_when_true(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert NOTE.explanation == EXPLANATION
    assert not any("degraded" in line for line in NOTE.explanation)
    degraded = {**EVIDENCE, "degraded": True, "explanation": "likelihood metrics are absent."}
    note = Notification("firing", 1, 1, "r", "p", "lld_collapse", "critical", 140, "m", degraded)
    assert note.explanation[-1] == "degraded mode: likelihood metrics are absent."
    given = Notification("resolved", 1, 1, "r", "p", "k", "warning", 1, "m", {}, ["kept as given"])
    assert given.explanation == ["kept as given"]
    with caplog.at_level("INFO", logger="lldmon.alerts"):
        LogSink().send(NOTE)
    assert caplog.messages == [f"{NOTE.summary()} | {EXPLANATION[0]}"]

"""Where notifications go: the log, a generic JSON webhook, a Slack-compatible webhook.

Sinks raise on failure; the `Dispatcher` retries them in its own thread, so a slow or dead webhook
never blocks ingest.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import httpx

from monitor.detector.explain import explain_finding
from monitor.telemetry import ServiceMetrics

log = logging.getLogger("lldmon.alerts")


@dataclass(frozen=True)
class Notification:
    event: str  # "firing" | "resolved"
    alert_id: int
    run_id: int
    run_name: str
    project: str
    kind: str
    severity: str
    step: int
    message: str
    evidence: dict[str, Any]
    """The detector's raw evidence (JSON, for machines)."""
    explanation: list[str] = field(default_factory=list)
    """The evidence in words (`monitor.detector.explain`); derived from `evidence` when not given."""

    def __post_init__(self) -> None:
        if not self.explanation:
            lines = explain_finding(self.kind, "", self.evidence, self.step)
            object.__setattr__(self, "explanation", lines)

    def summary(self) -> str:
        state = "RESOLVED" if self.event == "resolved" else self.severity.upper()
        return f"[{state}] {self.project}/{self.run_name} (run {self.run_id}) step {self.step}: {self.kind}: {self.message}"

    def text(self) -> str:
        """The summary and, one per line, what the detector saw."""
        return "\n".join([self.summary(), *(f"• {line}" for line in self.explanation)])


class Sink(Protocol):
    name: str

    def send(self, notification: Notification) -> None: ...


class LogSink:
    name = "log"

    def send(self, notification: Notification) -> None:
        level = logging.INFO if notification.event == "resolved" else logging.WARNING
        evidence = " | ".join(notification.explanation)
        log.log(level, notification.summary() + (f" | {evidence}" if evidence else ""))


class WebhookSink:
    """POSTs the notification as JSON to any HTTP endpoint."""

    name = "webhook"

    def __init__(self, url: str, client: httpx.Client) -> None:
        self.url = url
        self.client = client

    def send(self, notification: Notification) -> None:
        """The notification's fields: raw `evidence` for machines, `explanation` (list of lines) for people."""
        self.client.post(self.url, json=asdict(notification)).raise_for_status()


class SlackSink:
    """Slack incoming-webhook format (`{"text": ...}`), also understood by Mattermost and Discord's /slack."""

    name = "slack"

    def __init__(self, url: str, client: httpx.Client) -> None:
        self.url = url
        self.client = client

    def send(self, notification: Notification) -> None:
        self.client.post(self.url, json={"text": notification.text()}).raise_for_status()


class Dispatcher:
    """Delivers notifications to every sink from a daemon thread, with bounded retries and backoff."""

    def __init__(
        self,
        sinks: Sequence[Sink],
        telemetry: ServiceMetrics,
        *,
        max_attempts: int = 5,
        base_delay: float = 0.5,
        max_queue: int = 10_000,
    ) -> None:
        self.sinks = list(sinks)
        self.telemetry = telemetry
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self._queue: queue.Queue[tuple[Sink, Notification] | None] = queue.Queue(max_queue)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, notifications: Sequence[Notification]) -> None:
        """Enqueue and return at once; a full queue drops (and counts) rather than blocks."""
        if not notifications or not self.sinks:
            return
        self._ensure_thread()
        for notification in notifications:
            for sink in self.sinks:
                try:
                    self._queue.put_nowait((sink, notification))
                except queue.Full:
                    self.telemetry.record_notification(sink.name, "dropped")

    def join(self, timeout: float = 10.0) -> bool:
        """Wait until the queue is drained (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def close(self, timeout: float = 5.0) -> None:
        self.join(timeout)
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lldmon-alerts", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._deliver(*item)
            finally:
                self._queue.task_done()

    def _deliver(self, sink: Sink, notification: Notification) -> None:
        for attempt in range(1, self.max_attempts + 1):
            try:
                sink.send(notification)
            except Exception as exc:  # any sink failure is retried, then counted; never propagated
                if attempt == self.max_attempts:
                    log.warning("alert sink %s failed %d times: %s", sink.name, attempt, type(exc).__name__)
                    self.telemetry.record_notification(sink.name, "failed")
                    return
                time.sleep(self.base_delay * 2 ** (attempt - 1) * (0.5 + random.random()))
            else:
                self.telemetry.record_notification(sink.name, "sent")
                return

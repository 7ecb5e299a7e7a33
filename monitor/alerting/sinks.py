"""Where notifications go: the log, a generic JSON webhook, a Slack-compatible webhook.

Sinks raise on failure. Every HTTP attempt has one total deadline (connect, send and the answer's status
line and headers together, `DeliveryTimeout` past it): a per-read timeout alone lets a receiver that
trickles its answer hold a delivery, and every later one to that sink, for ever.

Run and project names, messages and metric names come from token holders, so each output escapes them
at its boundary, in one place: `slack_text` (Slack mrkdwn: `<!channel>`, `<url|text>`, broadcast
mentions) and `log_line` (control characters: a newline in a name must not forge a log line). The
webhook's JSON needs nothing more: `json.dumps` escapes control characters.

The `Dispatcher` gives every sink its own bounded queue and worker thread, so a slow or dead webhook
never blocks ingest and never delays another sink; each sink has a minimum severity, and every
attempt's outcome is handed to a `DeliveryRecorder` (the service stores it per alert and sink: pending,
retrying, delivered, failed).

Webhook signature: with a secret, each POST carries `X-LLDMon-Signature: sha256=<hex>`, the
HMAC-SHA256 of the raw request body keyed with the secret (verify it over the bytes received, before
parsing the JSON).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import queue
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import httpx

from contracts.alerts import (
    DELIVERED,
    ESCALATED,
    FAILED,
    PENDING,
    RESOLVED,
    RETRYING,
    SEVERITY_RANK,
    SIGNATURE_HEADER,
)
from monitor.detector.explain import alert_steps, explain_finding, reopened_text
from monitor.domain import DeliveryUpdate
from monitor.telemetry import ServiceMetrics
from monitor.text import printable

if TYPE_CHECKING:
    from monitor.config import Settings

log = logging.getLogger("lldmon.alerts")


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class Notification:
    event: str  # contracts.alerts.NOTIFICATION_EVENTS: "firing" | "escalated" | "resolved"
    alert_id: int
    run_id: int
    run_name: str
    project: str
    kind: str
    severity: str
    step: int
    """Where this notification is about: the step the condition started at (`firing`, `escalated`) or
    was judged cleared at (`resolved`)."""
    message: str
    evidence: dict[str, Any]
    """The detector's raw evidence (JSON, for machines)."""
    explanation: list[str] = field(default_factory=list)
    """The evidence in words (`monitor.detector.explain`); derived from `evidence` when not given."""
    phase: str | None = None
    """The run's phase when this was sent (healthy, stagnation, decay, collapse)."""
    previous_severity: str | None = None
    """For `escalated`: the severity it rose from."""
    timestamp: datetime = field(default_factory=_utcnow)
    dashboard_url: str | None = None
    """The run's dashboard page; the `Dispatcher` fills it in from the public base URL."""
    first_step: int | None = None
    """The alert's first step: where its condition started."""
    last_step: int | None = None
    """The alert's last step: the last step its condition was seen to hold (so far, while open)."""
    reopen_count: int = 0
    """Times the alert continued because its condition came back soon after it resolved (a flicker)."""

    def __post_init__(self) -> None:
        if not self.explanation:
            lines = explain_finding(self.kind, "", self.evidence, self.step)
            object.__setattr__(self, "explanation", lines)

    def summary(self) -> str:
        if self.event == RESOLVED:
            state = "RESOLVED"
        elif self.event == ESCALATED:
            rose = f"{self.previous_severity.upper()} -> " if self.previous_severity else ""
            state = f"ESCALATED {rose}{self.severity.upper()}"
        else:
            state = self.severity.upper()
        phase = f" phase {self.phase}" if self.phase else ""
        return (
            f"[{state}] {self.project}/{self.run_name} (run {self.run_id}) {self._steps()}{phase}: "
            f"{self.kind}: {self.message}"
        )

    def _steps(self) -> str:
        """ "steps 157-256" while firing; "step 260 (held at steps 157-256)" once resolved."""
        first = self.step if self.first_step is None else self.first_step
        if self.event != RESOLVED:
            return alert_steps(first, self.last_step, self.reopen_count)
        if self.first_step is None:
            return f"step {self.step}"
        held = ", ".join(
            p for p in (alert_steps(first, self.last_step), reopened_text(self.reopen_count)) if p
        )
        return f"step {self.step} (held at {held})"

    def lines(self) -> list[str]:
        """The summary, one line per thing the detector saw, the time and the dashboard link (raw:
        an output escapes each line for its medium)."""
        lines = [self.summary(), *(f"• {line}" for line in self.explanation)]
        lines.append(self.timestamp.isoformat(timespec="seconds"))
        if self.dashboard_url:
            lines.append(self.dashboard_url)
        return lines

    def payload(self) -> dict[str, Any]:
        """The webhook body: every field, the timestamp as ISO 8601 UTC."""
        body = asdict(self)
        body["timestamp"] = self.timestamp.isoformat()
        return body


_BROADCAST = re.compile(r"@(channel|here|everyone|all)\b", re.IGNORECASE)


def slack_escape(text: str) -> str:
    """Slack's escaping for text in messages (`&` `<` `>` as entities), so `<!channel>`, `<@U1>` and
    `<url|label>` are shown, never acted on; plain `@channel`, `@here`, `@everyone` and `@all` get a
    zero-width space after the `@`: Mattermost and Discord, which take this format too, notify on them."""
    escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _BROADCAST.sub("@\u200b\\1", escaped)


def slack_text(notification: Notification) -> str:
    """The Slack message text: every line of the notification `printable` (a newline in a name cannot
    start a line of its own) and `slack_escape`d; only the line breaks between them are ours."""
    return "\n".join(slack_escape(printable(line)) for line in notification.lines())


def log_line(notification: Notification) -> str:
    """The log sink's one line: the summary and the explanation, `printable`."""
    evidence = " | ".join(notification.explanation)
    return printable(notification.summary() + (f" | {evidence}" if evidence else ""))


class Sink(Protocol):
    name: str
    """Stable and free of secrets: delivery state is stored under it."""
    min_severity: str
    tracked: bool
    """Whether its delivery state is recorded (the log's is not)."""

    def send(self, notification: Notification) -> None: ...


def sink_name(kind: str, url: str) -> str:
    """`webhook:hooks.internal/1a2b3c4d`: host plus a digest of the URL (Slack URLs hold their token)."""
    host = urlsplit(url).hostname or "?"
    return f"{kind}:{host}/{hashlib.sha256(url.encode()).hexdigest()[:8]}"


class LogSink:
    name = "log"
    min_severity = "info"
    tracked = False

    def send(self, notification: Notification) -> None:
        level = logging.INFO if notification.event == RESOLVED else logging.WARNING
        log.log(level, "%s", log_line(notification))


class DeliveryTimeout(Exception):
    """An attempt passed its total deadline: counted and retried like any other failed attempt."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no complete answer within {seconds:g} s")


def post_within(
    url: str,
    seconds: float,
    *,
    content: bytes,
    headers: dict[str, str],
    transport: httpx.AsyncBaseTransport | None = None,
) -> None:
    """POST `content` and wait for the answer's status, all within `seconds` (`DeliveryTimeout` past
    it, `httpx.HTTPStatusError` for a status >= 400).

    httpx's timeouts bound each read, not the request, so the deadline is asyncio's `wait_for` around
    an async request on a loop of its own: cancelling it closes the connection at once, whatever phase
    it is in. Each attempt opens its own client and connection (alerts are rare, and a connection an
    attempt was cancelled on is never reused). The answer's body is not read: its status says
    whether the receiver took the notification. `transport` replaces the network (tests; it must outlive
    one client, as `httpx.MockTransport` does)."""

    async def attempt() -> None:
        async with (
            httpx.AsyncClient(timeout=None, transport=transport) as client,
            client.stream("POST", url, content=content, headers=headers) as response,
        ):
            response.raise_for_status()

    try:
        asyncio.run(asyncio.wait_for(attempt(), seconds))
    except asyncio.TimeoutError:
        raise DeliveryTimeout(seconds) from None


class WebhookSink:
    """POSTs the notification as JSON to any HTTP endpoint, signed when a secret is set."""

    tracked = True

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        min_severity: str = "info",
        secret: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url
        self.timeout = timeout
        """Total seconds per attempt."""
        self.min_severity = min_severity
        self.secret = secret
        self.transport = transport
        self.name = sink_name("webhook", url)

    def send(self, notification: Notification) -> None:
        """The notification's fields: raw `evidence` for machines, `explanation` (list of lines) for people."""
        body = json.dumps(notification.payload(), separators=(",", ":"), default=str).encode()
        headers = {"Content-Type": "application/json"}
        if self.secret:
            digest = hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
            headers[SIGNATURE_HEADER] = f"sha256={digest}"
        post_within(self.url, self.timeout, content=body, headers=headers, transport=self.transport)


class SlackSink:
    """Slack incoming-webhook format (`{"text": ...}`), also understood by Mattermost and Discord's /slack."""

    tracked = True

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        min_severity: str = "info",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url
        self.timeout = timeout
        """Total seconds per attempt."""
        self.min_severity = min_severity
        self.transport = transport
        self.name = sink_name("slack", url)

    def send(self, notification: Notification) -> None:
        body = json.dumps({"text": slack_text(notification)}).encode()
        headers = {"Content-Type": "application/json"}
        post_within(self.url, self.timeout, content=body, headers=headers, transport=self.transport)


DeliveryRecorder = Callable[[Sequence[DeliveryUpdate]], None]
"""Stores delivery state (the service writes it to the database); must not raise into a worker."""


class _SinkWorker:
    """One sink's bounded queue and daemon thread: its retries and timeouts delay only itself."""

    def __init__(self, sink: Sink, dispatcher: Dispatcher, max_queue: int) -> None:
        self.sink = sink
        self.dispatcher = dispatcher
        self.queue: queue.Queue[Notification | None] = queue.Queue(max_queue)
        self.thread: threading.Thread | None = None
        self.current: Notification | None = None
        self.closing = False
        self._lock = threading.Lock()

    def put(self, notification: Notification) -> bool:
        with self._lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name=f"lldmon-{self.sink.name}", daemon=True)
                self.thread.start()
        try:
            self.queue.put_nowait(notification)
        except queue.Full:
            return False
        return True

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            try:
                if item is None:
                    return
                if not self.closing:
                    self.current = item
                    self.dispatcher._deliver(self.sink, item, self)
                    self.current = None
            finally:
                self.queue.task_done()


class Dispatcher:
    """Delivers notifications through one worker per sink, with bounded retries and backoff."""

    def __init__(
        self,
        sinks: Sequence[Sink],
        telemetry: ServiceMetrics,
        *,
        max_attempts: int = 5,
        base_delay: float = 0.5,
        max_queue: int = 10_000,
        recorder: DeliveryRecorder | None = None,
        public_url: str | None = None,
    ) -> None:
        self.sinks = list(sinks)
        self.telemetry = telemetry
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self.recorder = recorder
        self.public_url = public_url.rstrip("/") if public_url else None
        self._workers = [_SinkWorker(sink, self, max_queue) for sink in self.sinks]

    def submit(self, notifications: Sequence[Notification]) -> None:
        """Enqueue and return at once (after recording them as pending); a full queue drops the
        notification for that sink, counted and recorded as failed, rather than blocks. Call it after
        the alerts' transaction has committed: recording opens a write transaction of its own."""
        if not notifications or not self.sinks:
            return
        updates: list[DeliveryUpdate] = []
        queued: list[tuple[_SinkWorker, Notification]] = []
        for notification in notifications:
            if self.public_url and notification.dashboard_url is None:
                notification = replace(
                    notification, dashboard_url=f"{self.public_url}/dashboard/run/{notification.run_id}"
                )
            for worker in self._workers:
                sink = worker.sink
                if SEVERITY_RANK.get(notification.severity, 0) < SEVERITY_RANK.get(sink.min_severity, 0):
                    continue
                queued.append((worker, notification))
                if sink.tracked:
                    updates.append(
                        DeliveryUpdate(notification.alert_id, sink.name, notification.event, PENDING, 0)
                    )
        self._record(updates)
        for worker, notification in queued:
            if not worker.put(notification):
                self.telemetry.record_notification(worker.sink.name, "dropped")
                self._update(worker.sink, notification, FAILED, 0, "queue full: dropped")

    def join(self, timeout: float = 10.0) -> bool:
        """Wait until every sink's queue is drained (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while any(w.queue.unfinished_tasks for w in self._workers) and time.monotonic() < deadline:
            time.sleep(0.01)
        return not any(w.queue.unfinished_tasks for w in self._workers)

    def close(self, timeout: float = 5.0) -> None:
        """Drain for at most `timeout`; what is still queued or in flight then is recorded as failed
        (the process is going away), so no notification stays `pending` for ever."""
        self.join(timeout)
        for worker in self._workers:
            worker.closing = True
            left = [worker.current] if worker.current is not None else []
            while True:
                try:
                    item = worker.queue.get_nowait()
                except queue.Empty:
                    break
                worker.queue.task_done()
                if item is not None:
                    left.append(item)
            for notification in left:
                self._update(worker.sink, notification, FAILED, 0, "not delivered before shutdown")
            if worker.thread is not None and worker.thread.is_alive():
                with contextlib.suppress(queue.Full):
                    worker.queue.put_nowait(None)

    def _deliver(self, sink: Sink, notification: Notification, worker: _SinkWorker) -> None:
        for attempt in range(1, self.max_attempts + 1):
            try:
                sink.send(notification)
            except Exception as exc:  # any sink failure is retried, then counted; never propagated
                error = _describe(exc)
                if attempt == self.max_attempts or worker.closing:
                    log.warning("alert sink %s failed %d times: %s", sink.name, attempt, error)
                    self.telemetry.record_notification(sink.name, "failed")
                    self._update(sink, notification, FAILED, attempt, error)
                    worker.current = None
                    return
                self._update(sink, notification, RETRYING, attempt, error)
                time.sleep(self.base_delay * 2 ** (attempt - 1) * (0.5 + random.random()))
            else:
                self.telemetry.record_notification(sink.name, "sent")
                self._update(sink, notification, DELIVERED, attempt, None)
                return

    def _update(self, sink: Sink, n: Notification, status: str, attempts: int, error: str | None) -> None:
        if sink.tracked:
            self._record([DeliveryUpdate(n.alert_id, sink.name, n.event, status, attempts, error)])

    def _record(self, updates: Sequence[DeliveryUpdate]) -> None:
        if not updates or self.recorder is None:
            return
        try:
            self.recorder(updates)
        except Exception as exc:  # delivery state is bookkeeping: never let it stop a delivery
            log.warning("could not record alert delivery state: %s", _describe(exc))


def _describe(exc: BaseException) -> str:
    """A short, secret-free reason: the HTTP status, the deadline, or the transport error's type."""
    if isinstance(exc, DeliveryTimeout):
        return str(exc)
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    return type(exc).__name__


def build_sinks(settings: Settings, transport: httpx.AsyncBaseTransport | None = None) -> list[Sink]:
    """The sinks `settings` configure, each attempt bounded by `sink_timeout_seconds` in all;
    `transport` replaces the network (tests)."""
    timeout = settings.sink_timeout_seconds
    secret = settings.webhook_secret.get_secret_value() if settings.webhook_secret else None
    sinks: list[Sink] = [LogSink()]
    sinks += [
        WebhookSink(
            url,
            timeout=timeout,
            min_severity=settings.webhook_min_severity,
            secret=secret,
            transport=transport,
        )
        for url in settings.webhook_urls
    ]
    sinks += [
        SlackSink(url, timeout=timeout, min_severity=settings.slack_min_severity, transport=transport)
        for url in settings.slack_webhook_urls
    ]
    return sinks

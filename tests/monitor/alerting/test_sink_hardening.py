"""Alert sinks against hostile receivers and hostile names: a webhook that trickles its answer is given
up on at the attempt's total deadline (and retried like any failure), and a run, project, message or
metric name can neither ping a chat channel, disguise a link, nor forge a line in any output."""

from __future__ import annotations

import io
import json
import logging
import re
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from prometheus_client import CollectorRegistry

from contracts import alerts as A
from contracts.wire import API_PREFIX
from monitor.alerting.rules import ActiveCondition
from monitor.alerting.sinks import Dispatcher, LogSink, Notification, SlackSink, WebhookSink, printable
from monitor.config import Settings
from monitor.domain import DeliveryUpdate, Principal
from monitor.telemetry import ServiceMetrics, Snapshot

# -- a receiver that trickles -------------------------------------------------------------------------


class Trickler:
    """A loopback HTTP server that answers one byte at a time, 0.2 s apart (well inside any per-read
    timeout), for as long as the client listens: in the status line and headers (`body=False`, the
    answer never completes) or, after a complete `200` head, in a long body (`body=True`)."""

    def __init__(self, *, body: bool) -> None:
        self.requests = 0
        self.stop = threading.Event()
        trickler = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                trickler.requests += 1
                if body:
                    self.send_response(200)
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    self.wfile.flush()
                    answer = b"a" * 100_000
                else:
                    answer = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100_000
                try:
                    for byte in answer:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        if trickler.stop.wait(0.2):
                            return
                except OSError:  # the client gave up and closed the connection
                    return

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def telemetry() -> ServiceMetrics:
    return ServiceMetrics(CollectorRegistry(), Snapshot)


def note(alert_id: int = 1, name: str = "grpo-3b") -> Notification:
    return Notification(
        "firing",
        alert_id,
        3,
        name,
        name,
        "lld_collapse",
        "critical",
        140,
        name,
        {},
        [name],
        dashboard_url="https://m.io/dashboard/run/3?a=1&b=2",
    )


def wait_until(condition: Callable[[], bool], bound: float, what: str) -> None:
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {bound} s"
        time.sleep(0.02)


def final(updates: list[DeliveryUpdate], alert_id: int) -> DeliveryUpdate | None:
    mine = [u for u in updates if u.alert_id == alert_id]
    return mine[-1] if mine else None


def test_webhook_that_trickles_its_answer_fails_at_the_deadline_and_the_queue_moves_on(
    telemetry: ServiceMetrics,
) -> None:
    """One byte every 0.2 s never trips a 1 s per-read timeout: without a total deadline the first
    delivery stayed `pending` for ever and the second waited behind it."""
    trickler = Trickler(body=False)
    updates: list[DeliveryUpdate] = []
    try:
        sink = WebhookSink(trickler.url, timeout=1)
        dispatcher = Dispatcher([sink], telemetry, max_attempts=2, base_delay=0.01, recorder=updates.extend)
        dispatcher.submit([note(1), note(2)])

        def both_failed() -> bool:
            return all((u := final(updates, i)) is not None and u.status == A.FAILED for i in (1, 2))

        wait_until(both_failed, 60, "failed delivery of both notifications")
        assert dispatcher.join(10)
        dispatcher.close()
        wait_until(lambda: trickler.requests == 4, 10, "4 requests")
    finally:
        trickler.close()
    for alert_id in (1, 2):
        statuses = [(u.status, u.attempts, u.error) for u in updates if u.alert_id == alert_id]
        assert statuses == [
            (A.PENDING, 0, None),
            (A.RETRYING, 1, "no complete answer within 1 s"),
            (A.FAILED, 2, "no complete answer within 1 s"),
        ]
    value = telemetry.registry.get_sample_value(
        "lldmon_notifications_total", {"sink": sink.name, "outcome": "failed"}
    )
    assert value == 2


def test_webhook_that_says_200_and_trickles_its_body_is_delivered(telemetry: ServiceMetrics) -> None:
    """The status is the receiver's answer; its body is never waited for."""
    trickler = Trickler(body=True)
    updates: list[DeliveryUpdate] = []
    try:
        dispatcher = Dispatcher(
            [WebhookSink(trickler.url, timeout=5)], telemetry, max_attempts=1, recorder=updates.extend
        )
        dispatcher.submit([note(1)])
        wait_until(lambda: (u := final(updates, 1)) is not None and u.status != A.PENDING, 60, "outcome")
        dispatcher.close()
    finally:
        trickler.close()
    assert [(u.status, u.attempts) for u in updates] == [(A.PENDING, 0), (A.DELIVERED, 1)]


# -- hostile names through every sink -----------------------------------------------------------------

HOSTILE = [
    "<!channel> <https://evil.example|Click here to re-authenticate>",
    "<!here|here> <@U024BE7LH> <#C024BE7LR> <!subteam^S012|team> <!date^1392734382^{date}|x>",
    "fish &amp; chips & <b>bold</b> &lt;!channel&gt;",
    "ok\n[CRITICAL] prod/forged (run 1) steps 1-2: lld_collapse: forged line",
    "cr\rreturn\r\nWARNING:lldmon.alerts:forged",
    "\x1b[2J\x1b]0;pwned\x07\x1b[31mred\x00nul\x7fdel",
    "sep\u2028line\u2029para\x85nel\x0bvt\x0cff",
    "bidi\u202eevil\u200bzero\ufeffbom",
    "@channel @here @everyone @ALL ping",
    "back\\nslash \\x1b",
]
INVISIBLE = {"Cc", "Cf", "Cs", "Zl", "Zp"}
BROADCAST = re.compile(r"@(channel|here|everyone|all)\b", re.IGNORECASE)


def capture() -> tuple[httpx.MockTransport, list[bytes]]:
    bodies: list[bytes] = []

    def handle(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        return httpx.Response(200)

    return httpx.MockTransport(handle), bodies


def unslack(text: str) -> str:
    """What Slack shows for escaped text."""
    return text.replace("\u200b", "").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


@pytest.mark.parametrize("name", HOSTILE)
def test_slack_text_can_neither_ping_nor_link_nor_forge_a_line(name: str) -> None:
    transport, bodies = capture()
    notification = note(name=name)
    SlackSink("https://hooks.slack.test/T/B/x", transport=transport).send(notification)
    text = json.loads(bodies[0])["text"]
    assert "<" not in text and ">" not in text  # no <!channel>, <@U..>, <url|label>: Slack's only markup
    assert re.fullmatch(r"(?:[^&]|&(?:amp|lt|gt);)*", text, re.DOTALL)  # every & is one of Slack's escapes
    assert not BROADCAST.search(text)
    lines = text.split("\n")  # summary, the explanation's one line, the time, the dashboard link
    assert len(lines) == 4 and lines[1].startswith("• ") and lines[3].startswith("https://m.io/")
    assert not {unicodedata.category(ch) for ch in text.replace("\n", "").replace("\u200b", "")} & INVISIBLE
    shown = unslack(lines[0])
    assert shown == printable(notification.summary())  # the name is shown, escaped, not acted on
    assert f"{printable(name)}/{printable(name)} (run 3)" in shown
    assert unslack(lines[3]) == "https://m.io/dashboard/run/3?a=1&b=2"


@pytest.fixture
def log_output() -> Iterator[io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
    logger = logging.getLogger("lldmon.alerts")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


@pytest.mark.parametrize("name", HOSTILE)
def test_log_sink_writes_one_line_with_every_name_escaped(name: str, log_output: io.StringIO) -> None:
    notification = note(name=name)
    LogSink().send(notification)
    written = log_output.getvalue()
    assert written.count("\n") == 1 and written.endswith("\n")  # one line, and only ours
    line = written[:-1]
    assert not {unicodedata.category(ch) for ch in line} & INVISIBLE
    assert line == f"WARNING:lldmon.alerts:{printable(notification.summary())} | {printable(name)}"


@pytest.mark.parametrize("name", HOSTILE)
def test_webhook_json_is_one_ascii_line_that_keeps_every_name_exactly(name: str) -> None:
    transport, bodies = capture()
    WebhookSink("https://hooks.test/lldmon", transport=transport).send(note(name=name))
    raw = bodies[0]
    assert all(0x20 <= byte < 0x7F for byte in raw)  # control characters only as JSON escapes
    body = json.loads(raw)
    assert body["run_name"] == body["project"] == body["message"] == name  # lossless, for machines
    assert body["explanation"] == [name]


def test_a_hostile_run_through_the_service_reaches_every_sink_harmless(
    settings: Settings, log_output: io.StringIO
) -> None:
    """From the API (a token holder names the run and project) through the alert service to the log,
    webhook and Slack sinks, on both databases."""
    from fastapi.testclient import TestClient

    from monitor.api.app import create_app

    name, project, message = HOSTILE[0], HOSTILE[3], "stalled\x1b[2J\x1b]0;pwned\x07\nforged <!here>"
    sent: dict[str, bytes] = {}

    def handle(request: httpx.Request) -> httpx.Response:
        sent[request.url.host] = request.content
        return httpx.Response(200)

    urls = {"webhook_urls": ["https://hooks.test/x"], "slack_webhook_urls": ["https://slack.test/x"]}
    app = create_app(settings.model_copy(update=urls), sink_transport=httpx.MockTransport(handle))
    try:
        with TestClient(app) as client:
            created = client.post(f"{API_PREFIX}/runs", json={"name": name, "project": project})
            assert created.status_code in (200, 201), created.text
            state = app.state.lldmon
            run = state.runs.get(Principal(), created.json()["id"])
            stalled = ActiveCondition("run_stalled", "critical", 0, message, {"silent_s": 600})
            state.alerts.raise_alert(run, stalled)
            assert state.dispatcher.join(10)
    finally:
        app.state.lldmon.db.dispose()

    webhook = json.loads(sent["hooks.test"])
    assert (webhook["run_name"], webhook["project"], webhook["message"]) == (name, project, message)
    text = json.loads(sent["slack.test"])["text"]
    assert "<" not in text and ">" not in text and "\\x1b" in text
    assert unslack(text.split("\n")[0]).startswith(f"[CRITICAL] {printable(project)}/{printable(name)} (run ")
    written = log_output.getvalue()
    assert written.count("\n") == 1 and "\x1b" not in written and printable(message) in written


def test_printable_escapes_are_unambiguous() -> None:
    assert printable("a\nb") == "a\\nb"
    assert printable("a\\nb") == "a\\\\nb"  # a literal backslash-n cannot pass for a newline
    assert printable("\x1b[2J\u202e\u2028\U000e0041") == "\\x1b[2J\\u202e\\u2028\\U000e0041"
    assert printable("plain ünïcode ✓ 日本") == "plain ünïcode ✓ 日本"

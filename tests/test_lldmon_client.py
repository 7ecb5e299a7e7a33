"""lldmon_client: the one implementation of the ingest protocol (URLs, retries, Retry-After, answer
classification, the 413 learn-and-split, the wire bodies), against in-process transports."""

from __future__ import annotations

import email.utils
import gzip
import json
import math
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from contracts import split
from contracts.wire import MAX_BODY_HEADER
from lldmon_client import (
    Reply,
    RetryPolicy,
    ServiceError,
    Session,
    Uploader,
    actions_body,
    api_url,
    masked,
    metrics_body,
    new_batch_id,
    normalize_url,
    parse_retry_after,
    stable_batch_id,
)

URL = "http://lldmon.test"
Handler = Callable[[httpx.Request], httpx.Response]


def body_of(request: httpx.Request) -> dict[str, Any]:
    raw = request.read()
    if request.headers.get("content-encoding") == "gzip":
        raw = gzip.decompress(raw)
    return json.loads(raw)  # type: ignore[no-any-return]


def ack(request: httpx.Request, duplicate: bool = False) -> httpx.Response:
    return httpx.Response(200, json={"batch_id": body_of(request)["batch_id"], "duplicate": duplicate})


class Recorder:
    """A mock service: `handler` answers; every request's path and body are kept."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[tuple[str, dict[str, Any] | None]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = body_of(request) if request.method == "POST" and request.content else None
        self.requests.append((request.url.path, body))
        return self.handler(request)


def uploader(handler: Handler, **kwargs: Any) -> tuple[Uploader, Recorder, list[float]]:
    """An uploader on a mock transport whose pauses are recorded, never slept."""
    recorder = Recorder(handler)
    pauses: list[float] = []

    def pause(seconds: float) -> bool:
        pauses.append(seconds)
        return True

    session = Session(URL, transport=httpx.MockTransport(recorder))
    kwargs.setdefault("retry", RetryPolicy(attempts=3, backoff_base=0.01, backoff_max=0.02))
    return Uploader(session, pause=pause, **kwargs), recorder, pauses


def wide_body(steps: int = 40, width: int = 30, batch_id: str = "b-1") -> dict[str, Any]:
    return metrics_body(
        batch_id, range(steps), {f"m/{i:02d}": [s + i / 7 for s in range(steps)] for i in range(width)}
    )


# ------------------------------------------------------------------------------------------------ URLs


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://lldmon:8000", "http://lldmon:8000"),
        (" http://lldmon:8000// ", "http://lldmon:8000"),
        ("http://lldmon:8000/api/v1", "http://lldmon:8000"),
        ("http://lldmon:8000/api/v1/", "http://lldmon:8000"),
        ("https://proxy.test/lldmon/api/v1", "https://proxy.test/lldmon"),
    ],
)
def test_normalize_url_gives_the_service_base(url: str, base: str) -> None:
    assert normalize_url(url) == base
    assert api_url(normalize_url(url)) == base + "/api/v1"


BAD_URLS = [
    ("lldmon:8000", "did you mean 'http://lldmon:8000'"),
    ("127.0.0.1:8000", "did you mean 'http://127.0.0.1:8000'"),
    ("ftp://lldmon:8000", "http://host:port"),
    ("http://", "http://host:port"),
    ("http://lldmon:99999", "not valid"),
    ("http://lldmon:8000/?x=1", "query"),
    ("", "http://host:port"),
]
"""URLs no client can use, and what the error says (`MonitorClient` refuses them the same way)."""


@pytest.mark.parametrize(
    ("url", "message"),
    [
        *BAD_URLS,
        ("http://lldmon:8000/#top", "fragment"),
        (
            "http://lldmon:8000/dashboard/",
            "without a path, got 'http://lldmon:8000/dashboard/' (did you mean",
        ),
    ],
)
def test_normalize_url_names_what_is_wrong(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        normalize_url(url)


@pytest.mark.parametrize(
    ("url", "api"),
    [
        ("http://h:8000", "http://h:8000/api/v1"),
        ("http://h:8000/", "http://h:8000/api/v1"),
        (" http://h:8000/api/v1/ ", "http://h:8000/api/v1"),
        ("http://h:8000/dashboard/", "http://h:8000/dashboard/api/v1"),  # the first answer tells
    ],
)
def test_api_url_takes_the_url_as_given(url: str, api: str) -> None:
    assert api_url(url) == api


# --------------------------------------------------------------------------------------- Retry-After


def test_retry_after_in_seconds() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(" 2.5 ") == 2.5
    assert parse_retry_after("-3") == 0.0


def test_retry_after_as_an_http_date() -> None:
    future = email.utils.formatdate(time.time() + 120, usegmt=True)
    assert 100 < parse_retry_after(future) <= 120  # type: ignore[operator]
    assert parse_retry_after(email.utils.formatdate(time.time() - 600, usegmt=True)) == 0.0
    zoneless = email.utils.formatdate(time.time() + 120).replace("+0000", "-0000")
    assert 100 < parse_retry_after(zoneless) <= 120  # type: ignore[operator]


@pytest.mark.parametrize("value", [None, "", "soon", "nan", "inf", "Mon, 99 Foo 2024"])
def test_retry_after_garbage_is_no_retry_after(value: str | None) -> None:
    assert parse_retry_after(value) is None


def test_the_policy_waits_what_the_server_says_up_to_its_cap() -> None:
    policy = RetryPolicy(backoff_base=1.0, backoff_max=8.0, max_retry_after=60.0)
    assert policy.delay(0, 5.0) == 5.0 and policy.delay(0, 600.0) == 60.0
    assert 0.5 <= policy.delay(0, None) <= 1.0 and 4.0 <= policy.delay(3, None) <= 8.0
    assert policy.delay(40, None) <= 8.0


# ------------------------------------------------------------------------------------ the session


def test_a_session_never_raises_and_reads_what_the_service_says() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/down":
            raise httpx.ConnectError("refused", request=request)
        error = {"error": {"code": "invalid_input", "message": "bad value", "field": "metrics.x"}}
        return httpx.Response(422, json=error, headers={MAX_BODY_HEADER: "2048", "retry-after": "3"})

    with Session(URL + "/api/v1/", token="lldm_x", transport=httpx.MockTransport(handler)) as session:
        down = session.request("GET", "/down")
        assert down.status is None and down.outcome == "retry" and down.transient
        assert down.describe() == "ConnectError: refused" and down.response is None
        reply = session.request("POST", "/runs", json={"name": "r"})
        assert (reply.status, reply.outcome, reply.transient) == (422, "reject", False)
        assert reply.error == "bad value (field metrics.x)" and reply.error_code == "invalid_input"
        assert (reply.body_limit, reply.retry_after) == (2048, 3.0)
        assert reply.describe() == "HTTP 422 bad value (field metrics.x)"
        assert (
            reply.response is not None and reply.response.request.headers["authorization"] == "Bearer lldm_x"
        )
        with pytest.raises(ServiceError, match=r"^registering: HTTP 422 bad value"):
            reply.raise_for_status("registering")


def test_a_deadline_cuts_each_requests_timeout() -> None:
    seen: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"]["read"])
        return httpx.Response(200, json={})

    deadline = time.monotonic() + 2.0
    session = Session(URL, timeout=30.0, transport=httpx.MockTransport(handler), deadline=lambda: deadline)
    session.request("GET", "/runs")
    assert 0 < seen[0] <= 2.0
    deadline = time.monotonic() - 5  # past it: the shortest timeout, not a negative one
    session.request("GET", "/runs")
    assert seen[1] == 0.05


# -------------------------------------------------------------------------- outcome classification


def test_acknowledged_and_duplicate_parts_are_delivered() -> None:
    up, recorder, _ = uploader(lambda r: ack(r, duplicate=body_of(r)["batch_id"] == "dup"))
    new = up.send(7, "metrics", metrics_body("new", [1], {"a": [1.0]}))
    again = up.send(7, "metrics", metrics_body("dup", [1], {"a": [1.0]}))
    assert new.verdict == again.verdict == "ok" and new.failure is None
    assert [s.duplicate for s in new.delivered + again.delivered] == [False, True]
    assert [path for path, _ in recorder.requests] == ["/api/v1/runs/7/metrics"] * 2


@pytest.mark.parametrize("status", [400, 422])
def test_an_invalid_batch_is_refused_once_and_never_retried(status: int) -> None:
    up, recorder, pauses = uploader(lambda r: httpx.Response(status, json={"error": {"message": "no"}}))
    outcome = up.send(1, "metrics", metrics_body("b", [1], {"a": [1.0]}))
    assert outcome.verdict == "reject" and not outcome.unsent and outcome.reply is None
    assert outcome.failure is outcome.refused[0].reply and len(recorder.requests) == 1 and not pauses


@pytest.mark.parametrize("status", [401, 403, 404, 409])
def test_a_keep_for_later_answer_stops_without_retrying(status: int) -> None:
    up, recorder, pauses = uploader(lambda r: httpx.Response(status, json={"error": {"message": "later"}}))
    outcome = up.send(1, "metrics", metrics_body("b", [1], {"a": [1.0]}))
    assert outcome.verdict == "retry" and outcome.reply is not None and outcome.reply.status == status
    assert [p["batch_id"] for p in outcome.unsent] == ["b"] and len(recorder.requests) == 1 and not pauses


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_a_transient_answer_is_retried_with_backoff_then_left_for_later(status: int) -> None:
    up, recorder, pauses = uploader(lambda r: httpx.Response(status))
    outcome = up.send(1, "metrics", metrics_body("b", [1], {"a": [1.0]}))
    assert outcome.verdict == "retry" and outcome.reply is not None and outcome.reply.status == status
    assert len(recorder.requests) == 3 and len(pauses) == 2 and all(0 < p <= 0.02 for p in pauses)


def test_a_connection_error_is_retried_and_retry_after_is_honoured() -> None:
    answers = iter(["down", "busy", "ok"])

    def handler(request: httpx.Request) -> httpx.Response:
        answer = next(answers)
        if answer == "down":
            raise httpx.ConnectTimeout("timed out", request=request)
        if answer == "busy":
            return httpx.Response(503, headers={"retry-after": "4"})
        return ack(request)

    retried: list[tuple[int, int | None]] = []
    up, _, pauses = uploader(handler, on_retry=lambda n, reply: retried.append((n, reply.status)))
    outcome = up.send(1, "metrics", metrics_body("b", [1], {"a": [1.0]}))
    assert outcome.verdict == "ok" and len(outcome.delivered) == 1
    assert retried == [(0, None), (1, 503)] and pauses[1] == 4.0


def test_a_pause_that_gives_up_and_a_stop_end_the_retries() -> None:
    recorder = Recorder(lambda r: httpx.Response(503))
    session = Session(URL, transport=httpx.MockTransport(recorder))
    patient = Uploader(session, retry=RetryPolicy(attempts=None), pause=lambda s: False)
    assert patient.send(1, "metrics", metrics_body("b", [1], {"a": [1.0]})).verdict == "retry"
    assert len(recorder.requests) == 1
    stopped = Uploader(session, retry=RetryPolicy(attempts=None), stopped=lambda: True)
    outcome = stopped.send(1, "metrics", metrics_body("b", [1], {"a": [1.0]}))
    assert outcome.verdict == "retry" and outcome.reply is not None and outcome.reply.status is None
    assert len(recorder.requests) == 1  # no request after the stop


def test_a_refused_part_does_not_hold_up_the_others_and_later_stops_the_rest() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        steps = body_of(request)["steps"]
        if 5 in steps:
            return httpx.Response(422, json={"error": {"message": "step 5 is bad"}})
        if 30 in steps:
            return httpx.Response(404, json={"error": {"message": "no such run"}})
        return ack(request)

    up, recorder, _ = uploader(handler, max_bytes=2048)
    body = wide_body()
    parts = split.split_body("metrics", body, 2048)
    outcome = up.send(1, "metrics", body)
    assert outcome.verdict == "retry" and outcome.failure is outcome.reply
    assert [s.body["batch_id"] for s in outcome.refused] == [
        p["batch_id"] for p, _ in parts if 5 in p["steps"]
    ]
    first_unsent = next(i for i, (p, _) in enumerate(parts) if 30 in p["steps"])
    assert [p["batch_id"] for p in outcome.unsent] == [p["batch_id"] for p, _ in parts[first_unsent:]]
    assert len(recorder.requests) == first_unsent + 1


# ------------------------------------------------------------------------------- 413 learn-and-split


def limited(limit: int | None) -> Handler:
    """A service refusing bodies over `limit` bytes, naming it (None: a proxy's page naming none)."""

    def handler(request: httpx.Request) -> httpx.Response:
        size = len(gzip.decompress(request.read()))
        if size > (limit or 4096):
            if limit is None:
                return httpx.Response(413, text="<html>413 Request Entity Too Large</html>")
            message = f"request body of {size} bytes exceeds the limit of {limit} bytes"
            return httpx.Response(413, json={"error": {"code": "payload_too_large", "message": message}})
        return ack(request)

    return handler


@pytest.mark.parametrize("limit", [4096, None], ids=["named", "proxy"])
def test_a_413_lowers_the_limit_and_the_body_goes_in_parts(limit: int | None) -> None:
    learned: list[tuple[int, int]] = []
    up, recorder, pauses = uploader(limited(limit), on_learn=lambda size, new: learned.append((size, new)))
    body = wide_body()
    size = len(split.encode_compact(body))
    outcome = up.send(3, "metrics", body)
    assert outcome.verdict == "ok" and not pauses
    if limit is not None:
        assert learned == [(size, 4096)] and up.max_bytes == 4096
    else:
        assert learned[0] == (size, size // 2) and up.max_bytes <= 4096
    steps = sorted(s for sent in outcome.delivered for s in sent.body["steps"])
    assert steps == list(range(40))
    assert all(len(split.encode_compact(sent.body)) <= 4096 for sent in outcome.delivered)
    assert sum(1 for _, b in recorder.requests if b and b["batch_id"] == "b-1") == 1  # refused once, whole
    ids = [sent.body["batch_id"] for sent in outcome.delivered]
    assert len(set(ids)) == len(ids) and "b-1" not in ids
    before = len(recorder.requests)
    again = up.send(3, "metrics", body)  # the limit is known now: no 413
    assert again.verdict == "ok" and len(recorder.requests) - before == len(again.delivered)
    if limit is not None:  # cut once under the named limit: as a fresh cut, so the same part ids
        assert [sent.body["batch_id"] for sent in again.delivered] == ids


def test_a_413_naming_a_limit_above_the_part_still_cuts_it_smaller() -> None:
    answers = iter([413])

    def handler(request: httpx.Request) -> httpx.Response:
        if next(answers, 200) == 413:
            message = "request body exceeds the limit of 99999999 bytes"
            return httpx.Response(413, json={"error": {"message": message}})
        return ack(request)

    up, _, _ = uploader(handler)
    outcome = up.send(1, "metrics", wide_body(4, 2))
    assert outcome.verdict == "ok" and len(outcome.delivered) == 2


def test_a_value_too_large_alone_is_refused_not_retried() -> None:
    up, recorder, _ = uploader(limited(1024))
    outcome = up.send(1, "metrics", metrics_body("one", [0], {"m": [1.0]}))
    assert outcome.verdict == "ok"  # fits
    huge = {"batch_id": "huge", "steps": [0], "metrics": {"m" * 3000: [1.0]}}
    outcome = up.send(1, "metrics", huge)
    assert outcome.verdict == "reject" and outcome.refused[0].reply.status == 413
    assert len(recorder.requests) == 2


def test_an_announced_limit_is_adopted_only_when_lower() -> None:
    up, recorder, _ = uploader(limited(4096), max_bytes=10_000)
    assert not up.adopt_limit(None) and not up.adopt_limit(20_000) and up.max_bytes == 10_000
    assert up.adopt_limit(4096) and up.max_bytes == 4096
    assert up.adopt_limit(10) and up.max_bytes == 1024  # never below one small value's body
    up.max_bytes = 4096
    outcome = up.send(1, "metrics", wide_body())
    assert outcome.verdict == "ok" and all(b is not None for _, b in recorder.requests)
    assert len(recorder.requests) == len(outcome.delivered)  # split before sending: no 413 at all


def test_actions_are_cut_by_rows() -> None:
    up, _, _ = uploader(limited(4096))
    n = 600
    columns: dict[str, list[Any]] = {
        "step": [1] * n,
        "traj_index": list(range(n)),
        "action_index": [0] * n,
        "n_tokens": [3] * n,
        "delta": [-0.5] * n,
        "old_logp_mean": [None] * n,
        "advantage": [1.0] * n,
        "reward": [0.0] * n,
        "is_answer": [False] * n,
        "source": ["loss"] * n,
    }
    outcome = up.send(1, "actions", actions_body("acts", columns))
    assert outcome.verdict == "ok" and len(outcome.delivered) > 1
    assert [t for sent in outcome.delivered for t in sent.body["traj_index"]] == list(range(n))


# ------------------------------------------------------------------------------------------ bodies


def test_metrics_body_is_the_wire_form() -> None:
    body = metrics_body(
        "b", (s for s in [3, 4]), {"a": [1.5, None], "b": [math.nan, math.inf], "c": [-math.inf, 2]}
    )
    assert body == {
        "batch_id": "b",
        "steps": [3, 4],
        "metrics": {"a": [1.5, None], "b": ["NaN", "Infinity"], "c": ["-Infinity", 2.0]},
    }
    assert json.loads(json.dumps(body, allow_nan=False)) == body
    with pytest.raises(ValueError, match="metric 'a' has 1 values for 2 steps"):
        metrics_body("b", [1, 2], {"a": [1.0]})


def test_masked_keeps_the_logged_values() -> None:
    assert masked([1.0, 2.0, 3.0], [True, False, 1]) == [1.0, None, 3.0]
    with pytest.raises(ValueError):
        masked([1.0], [True, False])


def test_actions_body_has_every_column_in_order() -> None:
    columns: dict[str, list[Any]] = {
        "step": [1],
        "traj_index": [0],
        "action_index": [0],
        "n_tokens": [2],
        "delta": [0.1],
    }
    with pytest.raises(ValueError, match="missing"):
        actions_body("a", columns)
    full: dict[str, list[Any]] = {
        **columns,
        "old_logp_mean": [None],
        "advantage": [1.0],
        "reward": [0.5],
        "is_answer": [True],
        "source": ["probe"],
    }
    body = actions_body("a", dict(reversed(full.items())))
    assert list(body) == ["batch_id", *full] and body["source"] == ["probe"]
    with pytest.raises(ValueError, match="one length"):
        actions_body("a", {**full, "delta": [0.1, 0.2]})


def test_batch_ids_random_and_stable() -> None:
    assert new_batch_id() != new_batch_id() and len(new_batch_id()) == 32
    legacy = "w-" + uuid.uuid5(uuid.uuid5(uuid.NAMESPACE_URL, "lldmon:watch-chunk"), "k").hex
    assert stable_batch_id("lldmon:watch-chunk", "k", prefix="w-") == legacy  # ids of older versions
    assert stable_batch_id("ns", "k") == stable_batch_id("ns", "k") != stable_batch_id("ns", "k2")


def test_reply_without_a_status_is_transient() -> None:
    reply = Reply(status=None, error="ReadTimeout: slow")
    assert reply.transient and reply.outcome == "retry" and reply.error_code == ""


# ---------------------------------------------------------------------------- combined metrics + actions


def small_actions(batch_id: str = "a-1", rows: int = 3) -> dict[str, Any]:
    return actions_body(
        batch_id,
        {
            "step": [0] * rows,
            "traj_index": list(range(rows)),
            "action_index": [0] * rows,
            "n_tokens": [2] * rows,
            "delta": [-0.1] * rows,
            "old_logp_mean": [None] * rows,
            "advantage": [1.0] * rows,
            "reward": [None] * rows,
            "is_answer": [False] * rows,
            "source": ["loss"] * rows,
        },
    )


def combined_service(answer: Callable[[str], httpx.Response | None] = lambda _path: None) -> Handler:
    """Acknowledges `/combined` (each half under its own id) and the separate endpoints, unless
    `answer(last path segment)` gives another response."""

    def handler(request: httpx.Request) -> httpx.Response:
        kind = request.url.path.rsplit("/", 1)[1]
        other = answer(kind)
        if other is not None:
            return other
        if kind == "combined":
            body = body_of(request)
            halves = {
                k: {"batch_id": body[k]["batch_id"], "duplicate": False} for k in ("metrics", "actions")
            }
            return httpx.Response(200, json=halves)
        return ack(request)

    return handler


def kinds(recorder: Recorder) -> list[str]:
    return [path.rsplit("/", 1)[1] for path, _ in recorder.requests]


def test_metrics_and_actions_that_fit_together_go_in_one_request() -> None:
    up, recorder, _ = uploader(combined_service())
    metrics, actions = wide_body(2, 2), small_actions()
    m, a = up.send_combined(5, metrics, actions)
    assert kinds(recorder) == ["combined"] and recorder.requests[0][0].endswith("/runs/5/combined")
    assert recorder.requests[0][1] == {"metrics": metrics, "actions": actions}
    assert (m.verdict, a.verdict) == ("ok", "ok")
    assert m.delivered[0].reply.data["batch_id"] == "b-1" and a.delivered[0].reply.data["batch_id"] == "a-1"


def test_a_combined_body_over_the_limit_goes_as_two_requests_each_cut() -> None:
    up, recorder, _ = uploader(combined_service(), max_bytes=4096)
    m, a = up.send_combined(5, wide_body(), small_actions())
    assert "combined" not in kinds(recorder) and kinds(recorder)[-1] == "actions"
    assert m.verdict == "ok" and len(m.delivered) > 1 and a.verdict == "ok"


@pytest.mark.parametrize(
    ("status", "payload"),
    [
        (422, {"error": {"code": "invalid_input", "message": "bad", "field": "actions.delta[0]"}}),
        (409, {"error": {"code": "conflict", "message": "batch 'a-1' was already received"}}),
        (413, {"error": {"code": "payload_too_large", "message": "exceeds the limit of 999999 bytes"}}),
    ],
)
def test_a_refused_combined_request_sends_each_half_alone(status: int, payload: dict[str, Any]) -> None:
    """Only one half may be at fault: each goes alone and gets its own verdict."""

    def answer(kind: str) -> httpx.Response | None:
        if kind == "combined" or (kind == "actions" and status != 413):
            return httpx.Response(status, json=payload)
        return None

    up, recorder, _ = uploader(combined_service(answer))
    m, a = up.send_combined(5, wide_body(2, 2), small_actions())
    assert kinds(recorder)[0] == "combined" and kinds(recorder)[1] == "metrics"
    assert m.verdict == "ok"
    assert a.verdict == {422: "reject", 409: "retry", 413: "ok"}[status]
    assert up.combined  # the endpoint exists: tried again next time


def test_a_service_without_the_combined_endpoint_is_asked_once() -> None:
    def answer(kind: str) -> httpx.Response | None:
        return httpx.Response(404, json={"detail": "Not Found"}) if kind == "combined" else None

    up, recorder, _ = uploader(combined_service(answer))
    for _ in range(3):
        m, a = up.send_combined(5, wide_body(2, 2), small_actions())
        assert (m.verdict, a.verdict) == ("ok", "ok")
    assert kinds(recorder) == ["combined"] + ["metrics", "actions"] * 3 and not up.combined


@pytest.mark.parametrize(
    ("status", "payload"),
    [
        (503, {"error": {"code": "service_unavailable", "message": "down"}}),
        (404, {"error": {"code": "not_found", "message": "run 5 not found"}}),
        (401, {"error": {"code": "unauthorized", "message": "token"}}),
    ],
)
def test_an_answer_about_the_service_or_run_keeps_both_halves_for_later(
    status: int, payload: dict[str, Any]
) -> None:
    up, recorder, _ = uploader(combined_service(lambda _kind: httpx.Response(status, json=payload)))
    metrics, actions = wide_body(2, 2), small_actions()
    m, a = up.send_combined(5, metrics, actions)
    assert set(kinds(recorder)) == {"combined"}  # retried as one request, never split up
    assert (m.unsent, a.unsent) == ([metrics], [actions]) and m.reply is a.reply and m.reply.status == status
    assert up.combined

"""Digits that are not ASCII: `str.isdigit()` is true for '²' and '①' (and for '٣', which int() reads
as 3), but int() refuses '²'. Wherever text is read as a number, only ASCII digits count: a
Content-Length of '²' is a 400 (never a 500), a step or an event file stamp of '²' is not a number, a
body limit header of '²' is no limit. (The CLI's run references: tests/hostile/test_cli_hostile_output.py.)"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from contracts.wire import API_PREFIX, MAX_BODY_HEADER
from lldmon_client.http import body_limit as _body_limit
from monitor.importers import load_verl_jsonl
from monitor.importers.reading import parse_step
from monitor.importers.tensorboard_events import _written_at
from tests.monitor.api.helpers import history, new_run

NOT_ASCII = ["²", "①", "٣", "１２"]
BAD_LENGTHS = [b"\xb2", "①".encode(), "٣".encode(), b"abc", b"-1", b"1.5", b"", b"0x10"]


def _asgi(app: Any, method: str, path: str, content_length: bytes, body: bytes) -> tuple[int, dict[str, Any]]:
    """One request straight to the ASGI app, with a Content-Length header as given (an HTTP client
    would refuse to send most of them; a server other than uvicorn, or a proxy, may pass them on)."""
    messages: list[dict[str, Any]] = []
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"test"),
            (b"content-type", b"application/json"),
            (b"content-length", content_length),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }
    asyncio.run(app(scope, receive, send))
    [start] = [m for m in messages if m["type"] == "http.response.start"]
    payload = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return start["status"], json.loads(payload)


@pytest.mark.parametrize("declared", BAD_LENGTHS, ids=repr)
def test_a_content_length_that_is_not_ascii_digits_is_a_400(app: Any, client: Any, declared: bytes) -> None:
    run_id = new_run(client)
    body = json.dumps({"batch_id": "b1", "steps": [0], "metrics": {"ok": [1.0]}}).encode()
    for path in (f"{API_PREFIX}/runs/{run_id}/metrics", f"{API_PREFIX}/runs"):
        status, answer = _asgi(app, "POST", path, declared, body)
        assert status == 400, answer
        assert answer["error"]["code"] == "bad_request" and "Content-Length" in answer["error"]["message"]
    assert history(client, run_id) == {}
    assert [r["id"] for r in client.get(f"{API_PREFIX}/runs").json()] == [run_id]


def test_an_ascii_content_length_still_works(app: Any, client: Any) -> None:
    run_id = new_run(client)
    body = json.dumps({"batch_id": "b1", "steps": [0], "metrics": {"ok": [1.0]}}).encode()
    status, answer = _asgi(app, "POST", f"{API_PREFIX}/runs/{run_id}/metrics", str(len(body)).encode(), body)
    assert status == 200, answer
    status, answer = _asgi(app, "POST", f"{API_PREFIX}/runs/{run_id}/metrics", b"99999999999", body)
    assert status == 413, answer  # over the limit: refused on the declared length, as before


@pytest.mark.parametrize("text", NOT_ASCII)
def test_a_step_of_unicode_digits(text: str) -> None:
    assert parse_step(text) == (int(text) if text in ("٣", "１２") else None)  # float() reads Nd digits
    assert parse_step("12") == 12 and parse_step(" 7 ") == 7


def test_a_log_with_a_step_of_superscript_two_reports_the_line(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    rows = [
        {"step": 1, "data": {"x": 1.0}},
        {"step": "²", "data": {"x": 2.0}},
        {"step": 3, "data": {"x": 3.0}},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    log = load_verl_jsonl(path)
    assert log.steps.tolist() == [1, 3]
    assert [(d.line, d.reason) for d in log.diagnostics] == [(2, "step is not a non-negative integer: '²'")]


def test_an_event_file_stamp_of_unicode_digits_sorts_first(tmp_path: Path) -> None:
    odd = tmp_path / "events.out.tfevents.².host"
    assert _written_at(odd) == (0, str(odd))
    assert _written_at(tmp_path / "events.out.tfevents.17.host")[0] == 17


def test_a_body_limit_header_of_unicode_digits_is_no_limit() -> None:
    assert MAX_BODY_HEADER
    assert [_body_limit(v) for v in ("²", "①", "", "0", "-5", None)] == [None] * 6
    assert _body_limit("2000") == 2000

"""The remote CLI pointed at something that is not an lldmon API (a dashboard URL, a server answering
HTML, one answering 404/405, JSON of another service) or at a closed port: one line naming the URL and
what answered, exit 1, for every command that goes over `--url` (`sync` too, its spool kept); never a
traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contracts import spool
from contracts.spool import RunIdentity, SpoolEntry
from monitor.cli import app

runner = CliRunner()
ENV = {"LLDMON_URL": "", "LLDMON_TOKEN": "", "COLUMNS": "80"}
ROOT = Path(__file__).resolve().parents[1]
MAIN = "from monitor.cli import main; main()"
HTML = b"<!DOCTYPE html>\n<html>\n<head><title>Dash</title></head>\n<body>\n<h1>page</h1>\n</body>\n</html>\n"


def _server(status: int, body: bytes, content_type: str) -> Iterator[str]:
    """A real HTTP server on a free port answering every request with `status` and `body`."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            self.rfile.read(length)
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def html_200() -> Iterator[str]:
    yield from _server(200, HTML, "text/html; charset=utf-8")


@pytest.fixture(scope="module", params=[404, 405])
def html_error(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from _server(request.param, HTML, "text/html")


@pytest.fixture(scope="module")
def other_json() -> Iterator[str]:
    yield from _server(
        200, json.dumps({"service": "something else", "items": {}}).encode(), "application/json"
    )


@pytest.fixture
def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _commands(tmp_path: Path) -> list[list[str]]:
    """Every command over --url; `sync` last."""
    log = tmp_path / "log.csv"
    log.write_text("step,reward/mean\n1,0.5\n2,0.6\n")
    return [
        ["runs", "list"],
        ["runs", "show", "1"],
        ["runs", "show", "some-name"],
        ["runs", "liveness", "1"],
        ["alerts", "list", "1"],
        ["alerts", "ack", "1", "1"],
        ["directive", "1"],
        ["export", "1", "-o", str(tmp_path / "out.csv")],
        ["export", "1", "--actions", "-o", str(tmp_path / "actions.csv")],
        ["import", str(log), "--run", "r", "--format", "csv"],
        ["sync", str(_spooled(tmp_path))],
    ]


def _spooled(tmp_path: Path) -> Path:
    """A spool with one batch, which a sync that reaches no lldmon API must leave where it is."""
    directory = tmp_path / "spool"
    if not directory.exists():
        body = {"batch_id": "b-1", "steps": [1], "metrics": {"loss": [0.5]}}
        spool.write_entry(directory, SpoolEntry(run=RunIdentity("r", "nq"), kind="metrics", body=body))
    return directory


def _one_line_error(args: list[str], url: str) -> str:
    result = runner.invoke(app, [*args, "--url", url], env=ENV)
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
    assert result.exit_code == 1, (args, result.output)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.output)
    assert "Traceback" not in result.output
    if args[0] == "sync":  # the message, then what the sync did: nothing, the batch still spooled
        tally = " (sync stopped: sent 0, duplicates 0, rejected 0, remaining 1)"
        assert lines[0].endswith(tally), lines
        assert [e.batch_id for e in spool.iter_entries(Path(args[1]))] == ["b-1"]
        return lines[0].removesuffix(tally)
    return lines[0]


def test_a_dashboard_url_names_where_the_api_is(html_200: str, tmp_path: Path) -> None:
    for args in _commands(tmp_path):
        line = _one_line_error(args, f"{html_200}/dashboard/")
        assert line.startswith(
            f"error: {html_200}/dashboard/ did not answer as an lldmon API (HTML, HTTP 200"
        )
        assert line.endswith(f"the API is at {html_200}/api/v1 (--url {html_200})"), line


def test_an_html_server_at_the_origin_is_not_an_lldmon_service(html_200: str, tmp_path: Path) -> None:
    for args in _commands(tmp_path):
        line = _one_line_error(args, html_200)
        assert f"{html_200} did not answer as an lldmon API (HTML, HTTP 200" in line, line
        assert "is an lldmon service (`lldmon serve`) listening" in line, line


def test_an_html_error_page_is_not_an_api_error(html_error: str, tmp_path: Path) -> None:
    for args in _commands(tmp_path):
        line = _one_line_error(args, html_error)
        assert "did not answer as an lldmon API (HTML, HTTP 40" in line and "DOCTYPE" not in line, line


def test_json_of_another_service_is_not_an_lldmon_answer(other_json: str, tmp_path: Path) -> None:
    commands = _commands(tmp_path)
    for args in [*commands[:5], commands[-1]]:
        line = _one_line_error(args, other_json)
        assert f"{other_json} did not answer as an lldmon API (JSON without" in line, line


def test_a_closed_port_cannot_be_reached(closed_port: str, tmp_path: Path) -> None:
    for args in _commands(tmp_path):
        line = _one_line_error(args, closed_port)
        assert line.startswith(f"error: cannot reach {closed_port}/api/v1: ConnectError"), line


def test_the_entry_point_prints_one_line_in_a_pipe(html_200: str) -> None:
    """The `lldmon` entry point in a process, stdout a pipe: one unwrapped line, no traceback."""
    for args in (["runs", "list"], ["alerts", "list", "1"]):
        done = subprocess.run(
            [sys.executable, "-c", MAIN, *args, "--url", f"{html_200}/dashboard/"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env={**_environ(), "COLUMNS": "60"},
        )
        assert done.returncode == 1, done
        assert "Traceback" not in done.stderr + done.stdout, done
        lines = (done.stdout + done.stderr).strip().splitlines()
        assert len(lines) == 1 and f"the API is at {html_200}/api/v1" in lines[0], lines


def _environ() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("LLDMON_URL", "LLDMON_TOKEN")}


@pytest.mark.parametrize("where", ["dashboard", "error page"])
def test_watch_stops_on_a_non_api_answer_with_one_line(
    html_200: str, html_error: str, tmp_path: Path, where: str
) -> None:
    """`lldmon watch` registers its run first: a page instead of the API ends it with the same line as the
    other commands, not the page's HTML (it retries only while the service is unreachable or busy)."""
    log = tmp_path / "log.jsonl"  # verl's file logger: a line per step
    log.write_text('{"step": 1, "reward": 0.5}\n')
    url = f"{html_200}/dashboard/" if where == "dashboard" else html_error
    args = ["watch", str(log), "--run", "w", "--from-start", "--state-dir", str(tmp_path / "state")]
    result = runner.invoke(app, [*args, "--url", url], env=ENV)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "DOCTYPE" not in result.output and "Traceback" not in result.output
    assert f"{url} did not answer as an lldmon API (HTML, HTTP " in errors[0], errors
    if where == "dashboard":
        assert errors[0].endswith(f"the API is at {html_200}/api/v1 (--url {html_200})"), errors

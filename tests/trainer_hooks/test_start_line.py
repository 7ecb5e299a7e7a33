"""The line a training job prints on stderr at start: monitored (run, id, dashboard page) or not, and
why; and the URL mistakes the client refuses before training starts. Each case runs a tiny script in
a fresh process, as a user's job would, and reads its stderr."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.live_server import free_port
from trainer_hooks._announce import close_env_names
from trainer_hooks.client import MonitorClient, RetryPolicy

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
RUN_ID = 7

PLAIN = """
import sys
import httpx
from trainer_hooks.client import MonitorClient, RetryPolicy

def refuse(request):
    raise httpx.ConnectError("refused", request=request)

extra = {"transport": httpx.MockTransport(refuse)} if sys.argv[2] == "refuse" else {}
client = MonitorClient.from_env(
    "tiny", spool_dir=sys.argv[1], flush_interval=0.02,
    retry=RetryPolicy(attempts=1, backoff_base=0.01, backoff_max=0.05), **extra
)
client.log(0, {"a": 1.0})
client.flush(10)
client.close(timeout=5)
"""

TRL = """
import os, sys, types
from trainer_hooks.trl.config import sink_from_env

args = types.SimpleNamespace(run_name="tiny-trl", to_dict=lambda: {"lr": 1e-6})
assert sink_from_env(args) is None
os.environ["LLDMON_ULR"] = sys.argv[1]
assert sink_from_env(args) is None
os.environ["LLDMON_URL"] = sys.argv[1]
sink = sink_from_env(args)
sink.log(0, {"a": 1.0})
assert sink.flush(10)
sink.close(timeout=5)
"""


class _Service(BaseHTTPRequestHandler):
    """Just enough of the lldmon API for a client to register a run and deliver a batch."""

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.path == "/api/v1/runs":
            self._answer(201, {"id": RUN_ID})
        elif self.path.startswith(f"/api/v1/runs/{RUN_ID}/"):
            self._answer(200, {"duplicate": False})
        else:
            self._answer(404, {"error": {"code": "not_found", "message": "no such route"}})

    def do_GET(self) -> None:
        self._answer(200 if self.path == f"/api/v1/runs/{RUN_ID}/directive" else 404, {})

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def service() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(10)


def _run(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK") and not k.upper().startswith(("LLDMON", "LDMON"))
    }
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        env={**clean, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )


def _said(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("lldmon: monitoring")]


def test_a_monitored_job_names_its_run_id_and_dashboard_page(service: str, tmp_path: Path) -> None:
    done = _run(PLAIN, {"LLDMON_URL": service + "/"}, str(tmp_path / "spool"), "http")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"lldmon: monitoring on: run 'tiny' (id {RUN_ID}), dashboard {service}/dashboard/run/{RUN_ID}"
    ]


def test_only_rank_zero_says_anything(service: str, tmp_path: Path) -> None:
    done = _run(PLAIN, {"LLDMON_URL": service, "RANK": "1"}, str(tmp_path / "spool"), "http")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_an_unreachable_service_is_monitoring_on_with_spooling(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listening
    spool_dir = tmp_path / "spool"
    done = _run(PLAIN, {"LLDMON_URL": url}, str(spool_dir), "http")
    assert done.returncode == 0, done.stderr
    expected = (
        f"lldmon: monitoring on, but run 'tiny' is not registered yet ({url} did not answer: "
        f"ConnectError: [Errno 111] Connection refused): spooling to {spool_dir} and retrying in the background"
    )
    assert done.stderr.splitlines()[0] == expected, done.stderr
    assert _said(done.stderr) == [expected]


@pytest.mark.parametrize("variable", ["LLDMON_ULR", "LDMON_URL", "LLDMON_URI", "lldmon_url"])
def test_the_default_url_is_named_with_the_variable_that_looks_like_lldmon_url(
    tmp_path: Path, variable: str
) -> None:
    spool_dir = tmp_path / "spool"
    done = _run(PLAIN, {variable: "http://lldmon:8000"}, str(spool_dir), "refuse")
    assert done.returncode == 0, done.stderr
    assert _said(done.stderr) == [
        "lldmon: monitoring on, but run 'tiny' is not registered yet (http://127.0.0.1:8000 did not "
        f"answer: ConnectError: refused): spooling to {spool_dir} and retrying in the background; "
        f"LLDMON_URL is not set, but {variable} is (did you mean LLDMON_URL?): using the default "
        "http://127.0.0.1:8000"
    ]
    assert done.stderr.splitlines()[0] == _said(done.stderr)[0]


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://127.0.0.1:8000/dashboard/", "http://127.0.0.1:8000"),
        ("http://lldmon:8000/dashboard/run/3", "http://lldmon:8000"),
        ("https://lldmon.example/api/v1/runs", "https://lldmon.example"),
    ],
)
def test_a_url_with_a_path_is_refused_before_training_with_its_origin_suggested(
    tmp_path: Path, url: str, origin: str
) -> None:
    done = _run(PLAIN, {"LLDMON_URL": url}, str(tmp_path / "spool"), "http")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"ValueError: LLDMON_URL: lldmon URL must look like http://host:port, without a path, "
        f"got {url!r} (did you mean {origin!r}?)"
    )
    assert _said(done.stderr) == []
    assert not (tmp_path / "spool").exists()


def test_a_missing_scheme_with_a_path_suggests_the_origin(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"did you mean 'http://lldmon:8000'\?"):
        MonitorClient("lldmon:8000/dashboard/", "r", spool_dir=tmp_path, enabled=True)


def test_a_trl_job_says_whether_it_is_monitored(service: str, tmp_path: Path) -> None:
    done = _run(TRL, {"HOME": str(tmp_path)}, service)
    assert done.returncode == 0, done.stderr
    assert _said(done.stderr) == [
        "lldmon: monitoring off: LLDMON_URL is not set; set it, or pass lldmon_sink=MonitorClient(...)",
        "lldmon: monitoring off: LLDMON_URL is not set, but LLDMON_ULR is (did you mean LLDMON_URL?); "
        "set it, or pass lldmon_sink=MonitorClient(...)",
        f"lldmon: monitoring on: run 'tiny-trl' (id {RUN_ID}), dashboard {service}/dashboard/run/{RUN_ID}",
    ]


@pytest.mark.parametrize(
    ("variable", "close"),
    [
        ("LLDMON_ULR", True),
        ("LDMON_URL", True),
        ("LLDMON_URI", True),
        ("lldmon_url", True),
        ("LLDMON_RUN", False),
        ("LLDMON_PUBLIC_URL", False),
        ("LLDMON_TOKEN", False),
        ("LLDMON_URL", False),
    ],
)
def test_close_names_are_misspellings_not_the_other_lldmon_variables(variable: str, close: bool) -> None:
    assert close_env_names("LLDMON_URL", {variable: "x"}) == ([variable] if close else [])


def test_the_sync_hint_names_a_token_when_the_service_asked_for_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="lldmon.client")

    def unauthorised(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"error": {"code": "unauthorized", "message": "missing token"}})

    client = MonitorClient(
        "http://lldmon.test",
        "auth",
        spool_dir=tmp_path / "spool",
        flush_interval=0.02,
        transport=httpx.MockTransport(unauthorised),
        retry=RetryPolicy(attempts=1, backoff_base=0.01, backoff_max=0.05),
        enabled=True,
    )
    client.log(0, {"a": 1.0})
    assert client.flush(timeout=10)
    client.close(timeout=5)
    said = [r.getMessage() for r in caplog.records if "stay in the spool" in r.getMessage()]
    assert len(said) == 1, said
    assert f"lldmon sync {client.spool_dir} --url http://lldmon.test --token " in said[0]

"""scripts/dashboard_screenshot.py (the README's lab picture) against a tiny live service.

One short run (the first 40 steps of `collapse_scenario(3)`) is streamed to a real `lldmon serve`; the
script must refuse an unknown run by name (exit 2, listing the runs there), then start its own server
on the stopped service's data directory and write a PNG of the whole run page. Without Chromium the
script says so and exits 2; the browser part skips like test_browser.py (CI requires it).
"""

from __future__ import annotations

import importlib.util
import os
import struct
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from contracts.wire import API_PREFIX
from lldmon_lab.scenarios import collapse_scenario
from tests.dashboard.conftest import CHROMEDRIVER, CHROMIUM
from tests.dashboard.test_callbacks import head
from tests.live_server import LiveServer
from tests.monitor.api.test_detection_flow import stream

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "dashboard_screenshot.py"

needs_browser = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()) and not os.environ.get("LLDMON_REQUIRE_BROWSER"),
    reason="needs /usr/bin/chromium and /usr/bin/chromedriver (CI installs them)",
)


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dashboard_screenshot", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def test_missing_browser_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = load_script()
    browser = ["--chromium", str(tmp_path / "no-chromium"), "--chromedriver", str(tmp_path / "no-driver")]
    code = script.main(
        ["--url", "http://127.0.0.1:9", "--run", "r", "--out", str(tmp_path / "x.png"), *browser]
    )
    assert code == 2
    assert "no-chromium" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


@needs_browser
@pytest.mark.timeout(60)
def test_screenshot_of_a_run_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = load_script()
    data_dir = tmp_path / "data"
    with LiveServer(data_dir).start() as server, httpx.Client(base_url=server.url, timeout=30.0) as api:
        run_id = api.post(f"{API_PREFIX}/runs", json={"name": "tiny", "project": "lab"}).json()["id"]
        stream(api, run_id, head(collapse_scenario(3), 40))  # type: ignore[arg-type]

        code = script.main(["--url", server.url, "--run", "nope", "--out", str(tmp_path / "nope.png")])
        assert code == 2
        err = capsys.readouterr().err
        assert "no run named 'nope'" in err and "tiny" in err

    out = tmp_path / "shot.png"
    args = ["--data-dir", str(data_dir), "--project", "lab", "--run", "tiny", "--out", str(out)]
    assert script.main([*args, "--width", "1000", "--timeout", "30"]) == 0, capsys.readouterr().err
    assert f"(id {run_id})" in capsys.readouterr().out
    width, height = png_size(out)
    assert width == 1000 and height > 1500  # the whole page: nine panels, the action card, the timeline
    assert out.stat().st_size > 30_000

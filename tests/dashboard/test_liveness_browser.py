"""Issue 15 liveness in a real headless Chromium against `lldmon serve`: a stalled run's badge says so,
with "last seen N ago", and every page shows a banner once its own server stops answering (and hides
it when the server is back)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts.wire import API_PREFIX
from tests.dashboard.conftest import needs_browser, wait_for
from tests.live_server import LiveServer

pytestmark = [needs_browser, pytest.mark.timeout(150)]

BANNER_JS = """
const el = document.getElementById('server-lost');
return el ? [!el.hidden && el.offsetHeight > 0, el.textContent] : null;
"""
STATUS_JS = """
const el = document.querySelector(arguments[0] + ' [data-status]');
return el ? el.getAttribute('data-status') : null;
"""


def banner(driver: Any) -> list[Any] | None:
    found: list[Any] | None = driver.execute_script(BANNER_JS)
    return found


def test_stalled_badge_and_lost_server_banner(tmp_path: Path, browser: Any) -> None:
    server = LiveServer(tmp_path / "data", env={"LLDMON_LIVENESS_SWEEP_SECONDS": "0.2"}).start()
    try:
        with httpx.Client(base_url=server.url + API_PREFIX, timeout=30.0) as api:
            run_id = api.post("/runs", json={"name": "silent", "project": "nq"}).json()["id"]
            api.put(f"/runs/{run_id}/liveness", json={"stall_after_s": 1, "crash_after_s": 600})
        browser.get(f"{server.url}/dashboard/run/{run_id}")
        wait_for(
            browser, lambda d: d.execute_script(STATUS_JS, "#run-status") == "stalled", 30, "stalled badge"
        )
        # read in one script call: Dash re-renders the element on every refresh, so a located element
        # can go stale before its text is read (seen once in CI)
        last_seen = "return (document.getElementById('run-last-seen') || {}).textContent || '';"
        wait_for(browser, lambda d: "last seen" in d.execute_script(last_seen), 10, "the last-seen line")
        browser.get(f"{server.url}/dashboard/")
        wait_for(
            browser, lambda d: d.execute_script(STATUS_JS, f"#run-row-{run_id}") == "stalled", 30, "list"
        )
        state = banner(browser)
        assert state is not None and state[0] is False  # server up: no banner

        server.kill()
        state = wait_for(browser, lambda d: (b := banner(d)) and b[0] and b, 20, "the lost-server banner")
        assert "Lost contact with the lldmon server" in state[1]

        server.start()
        wait_for(browser, lambda d: (b := banner(d)) is not None and not b[0], 20, "the banner to go")
    finally:
        server.stop()

"""Shared by the dashboard tests: the services of a test app, and a live server with headless Chromium
for the browser tests (which skip without /usr/bin/chromium and /usr/bin/chromedriver)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dashboard.callbacks.base import DashContext
from monitor.api.state import AppState
from tests.live_server import LiveServer

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

needs_browser = pytest.mark.skipif(
    # CI sets LLDMON_REQUIRE_BROWSER=1 after installing them: there a missing browser fails the test.
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()) and not os.environ.get("LLDMON_REQUIRE_BROWSER"),
    reason="browser test needs /usr/bin/chromium and /usr/bin/chromedriver "
    "(Debian: apt-get install chromium chromium-driver; CI installs them)",
)

PLOT_STATE_JS = """
const el = document.getElementById(arguments[0]);
if (!el) return null;
const gd = el.classList.contains('js-plotly-plot') ? el : el.querySelector('.js-plotly-plot');
if (!gd || !gd.data || !gd.layout) return null;
return {
  traces: gd.data.map(t => t.name),
  points: gd.data.map(t => (t.x ? t.x.length : 0)),
  shapes: (gd.layout.shapes || []).map(s => s.name),
  bands: (gd.layout.shapes || []).map(s => [s.name, s.x0, s.x1]),
  annotations: (gd.layout.annotations || []).map(a => a.text),
  yType: gd.layout.yaxis ? gd.layout.yaxis.type : null,
  markers: gd.data.filter(t => t.name === 'events').map(t => t.customdata || []),
};
"""


@pytest.fixture
def state(app: Any) -> AppState:
    s: AppState = app.state.lldmon
    return s


@pytest.fixture
def dctx(state: AppState) -> DashContext:
    return DashContext(
        state=state, path_for=lambda p: "/dashboard" + p, run_refresh_ms=5000, runs_refresh_ms=10000
    )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path / "data").start()
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--disable-sync",
        "--window-size=1500,1300",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver: Any, predicate: Any, timeout: float, what: str) -> Any:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # Dash re-renders components on every refresh: an element found by the predicate can go stale
    # before it is read; that is "not yet", not a failure
    ignored = (NoSuchElementException, StaleElementReferenceException)
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2, ignored_exceptions=ignored).until(
            lambda d: predicate(d)
        )
    except Exception as exc:
        shot(driver, "dashboard-failure")
        raise AssertionError(f"timed out after {timeout}s waiting for {what}") from exc


def plot(driver: Any, graph_id: str) -> dict[str, Any] | None:
    state: dict[str, Any] | None = driver.execute_script(PLOT_STATE_JS, graph_id)
    return state


def shot(driver: Any, name: str, full_height: int | None = None) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    if full_height:
        driver.set_window_size(1500, full_height)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not driver.execute_script(
            "return [...document.querySelectorAll('.js-plotly-plot')].every(g => g.offsetHeight > 100)"
        ):
            time.sleep(0.2)
        time.sleep(0.5)
    driver.save_screenshot(str(path))
    return path


def probe_actions(steps: range, per_step: int = 32) -> dict[str, Any]:
    """Probe records whose D_action drifts below zero over the steps (correct responses losing likelihood)."""
    rng = np.random.default_rng(0)
    rows = [(s, i) for s in steps for i in range(per_step)]
    drift = {s: -0.02 * (s - steps.start) for s in steps}
    return {
        "batch_id": f"probe-{steps.start}",
        "step": [s for s, _ in rows],
        "traj_index": [i // 2 for _, i in rows],
        "action_index": [i % 2 for _, i in rows],
        "n_tokens": [12] * len(rows),
        "delta": [float(drift[s] + rng.normal(0, 0.1)) for s, _ in rows],
        "old_logp_mean": [-0.4] * len(rows),
        "advantage": [1.0 if i % 3 else -1.0 for _, i in rows],
        "reward": [1.0 if i % 3 else 0.0 for _, i in rows],
        "is_answer": [i % 2 == 1 for _, i in rows],
        "source": ["probe"] * len(rows),
    }

"""The dashboard in a real headless Chromium against a live `lldmon serve` process.

A run that slides into collapse (`collapse_scenario(3)`) is streamed through the HTTP API in two parts:
the run page is opened in between, so the second part must reach the browser through the live refresh
(only new steps fetched, traces extended in place). Then the runs page must show the collapse badge,
and switching LLDS on from the run page must change the directive the API serves to the trainer.
Screenshots land in test-artifacts/ (git-ignored).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from contracts.wire import API_PREFIX
from lldmon_lab.scenarios import collapse_scenario
from tests.dashboard.conftest import needs_browser, plot, probe_actions, shot, wait_for
from tests.dashboard.test_callbacks import head, tail
from tests.live_server import LiveServer
from tests.monitor.api.test_detection_flow import stream

pytestmark = [needs_browser, pytest.mark.timeout(90)]

FIRST_PART = 120
"""Steps streamed before the page is opened (the run is in decay, not yet collapsed)."""


def test_dashboard_shows_a_collapsing_run_live_and_switches_llds(server: LiveServer, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    started = time.monotonic()
    scenario = collapse_scenario(3)
    n_steps = len(scenario.steps)
    with httpx.Client(base_url=server.url, timeout=30.0) as api:
        run_id = api.post(
            f"{API_PREFIX}/runs", json={"name": "grpo-3b-nq", "project": "nq", "tags": ["grpo", "search-r1"]}
        ).json()["id"]
        stream(api, run_id, head(scenario, FIRST_PART))  # type: ignore[arg-type]
        ack = api.post(
            f"{API_PREFIX}/runs/{run_id}/actions", json=probe_actions(range(FIRST_PART - 40, FIRST_PART))
        )
        assert ack.status_code == 200, ack.text

        # Run page: every panel drawn from the API's data, phase bands behind the series.
        browser.get(f"{server.url}/dashboard/run/{run_id}")
        reward = wait_for(
            browser,
            lambda d: (s := plot(d, "panel-reward")) and s["points"][0] == FIRST_PART and s,
            30,
            "the reward panel with data",
        )
        assert reward["traces"] == ["reward/mean", "events"]
        assert any(name.startswith("phase:") for name in reward["shapes"]), reward
        grad = plot(browser, "panel-grad")
        assert grad is not None and grad["yType"] == "log"
        logp = plot(browser, "panel-logp")
        assert logp is not None and logp["traces"][:2] == ["lld/logp_pos", "lld/logp_neg"]
        hist = wait_for(
            browser, lambda d: (s := plot(d, "action-hist")) and s["traces"] and s, 15, "histogram"
        )
        assert hist["traces"][0].startswith("A>0") and hist["points"][0] > 0
        quantiles = plot(browser, "action-quantiles")
        assert quantiles is not None and "median" in quantiles["traces"]
        llds = plot(browser, "panel-llds")  # the scenario logs no llds/* metrics: empty state, no crash
        assert llds is not None and any("no data for llds/active" in a for a in llds["annotations"])

        # The rest of the run arrives while the page is open: the live refresh extends the traces.
        stream(api, run_id, tail(scenario, FIRST_PART))  # type: ignore[arg-type]
        reward = wait_for(
            browser,
            lambda d: (
                (s := plot(d, "panel-reward"))
                and s["points"][0] == n_steps
                and "phase:collapse" in s["shapes"]
                and s
            ),
            25,
            "the live refresh to bring the collapse",
        )
        collapse_band = next(b for b in reward["bands"] if b[0] == "phase:collapse")
        events = api.get(f"{API_PREFIX}/runs/{run_id}/events").json()
        collapse_step = next(e["step"] for e in events if e["phase"] == "collapse")
        assert collapse_band[1] == collapse_step and collapse_band[2] == n_steps - 1
        assert "alert" in reward["markers"][0]
        wait_for(
            browser, lambda d: "collapse" in d.find_element(By.ID, "run-header").text, 15, "header phase"
        )
        wait_for(
            browser, lambda d: "lld_collapse" in d.find_element(By.ID, "run-timeline").text, 15, "timeline"
        )
        shot(browser, "dashboard-run-page", full_height=3000)
        browser.set_window_size(1500, 1300)

        # Runs list: the run with its collapse badge.
        browser.get(f"{server.url}/dashboard/")
        badge = wait_for(
            browser,
            lambda d: d.find_elements(By.CSS_SELECTOR, f"#run-row-{run_id} .badge[data-phase]"),
            20,
            "the run in the runs list",
        )[0]
        assert badge.text == "collapse" and badge.get_attribute("data-phase") == "collapse"
        row = browser.find_element(By.ID, f"run-row-{run_id}").text
        assert "grpo-3b-nq" in row and "nq" in row and "search-r1" in row
        shot(browser, "dashboard-runs-list")

        # Directive control: switch LLDS on from the run page; the API now serves it to the trainer.
        assert api.get(f"{API_PREFIX}/runs/{run_id}/directive").json()["llds"]["enabled"] is False
        browser.find_element(By.CSS_SELECTOR, f"#run-row-{run_id} a").click()
        button = wait_for(browser, lambda d: d.find_elements(By.ID, "llds-on"), 20, "the directive controls")[
            0
        ]
        wait_for(browser, lambda d: plot(d, "panel-reward"), 20, "the run page")
        button.click()
        wait_for(
            browser,
            lambda d: "LLDS on" in d.find_element(By.ID, "directive-msg").text,
            15,
            "the confirmation",
        )
        directive = api.get(f"{API_PREFIX}/runs/{run_id}/directive").json()
        assert directive["llds"]["enabled"] is True and directive["source"] == "manual"
        wait_for(
            browser,
            lambda d: d.find_element(By.ID, "directive-llds").get_attribute("data-enabled") == "true",
            15,
            "the directive status",
        )
        wait_for(
            browser,
            lambda d: "directive" in ((plot(d, "panel-reward") or {}).get("markers") or [[]])[0],
            15,
            "the directive marker",
        )
        browser.execute_script("window.scrollTo(0, 0)")
        shot(browser, "dashboard-run-llds-on")

        # Compare page: a second run overlaid on the first, one graph per metric.
        other = api.post(f"{API_PREFIX}/runs", json={"name": "grpo-3b-nq-llds", "project": "nq"}).json()["id"]
        stream(api, other, head(collapse_scenario(4), 80))  # type: ignore[arg-type]
        browser.get(f"{server.url}/dashboard/compare?runs={run_id},{other}")
        graph_id = '{"metric":"reward/mean","type":"compare-graph"}'
        compared = wait_for(
            browser,
            lambda d: (s := plot(d, graph_id)) and len(s["traces"]) == 2 and s,
            20,
            "the compare graph",
        )
        assert compared["points"] == [n_steps, 80]
        shot(browser, "dashboard-compare", full_height=1600)

    assert time.monotonic() - started < 90

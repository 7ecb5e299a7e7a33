"""Issue 16 item 19 (and the compare legend of 15) in a real headless Chromium against `lldmon serve`:
what a user sees, measured on the rendered page.

- the run page opens by project and name (`/dashboard/run/nq/lab%20finished`);
- the grad-norm panel's log axis has a few readable labels, not a crowd of 2s and 5s;
- the action-delta histogram's legend does not overlap its x-axis title;
- the lambda box shows "0.25" whole;
- switching LLDS on for a finished run asks first, and only writes after the answer;
- picking runs on the compare page puts them in the URL, and opening that URL restores them; run names
  in the legend are text, never links.
"""

from __future__ import annotations

import itertools
from typing import Any
from urllib.parse import unquote

import httpx
import numpy as np
import pytest

from contracts import metrics as M
from contracts.wire import API_PREFIX
from tests.dashboard.conftest import needs_browser, plot, probe_actions, shot, wait_for
from tests.live_server import LiveServer

pytestmark = [needs_browser, pytest.mark.timeout(150)]

LINK = '<a href="http://x">click</a>'

RECTS_JS = """
const root = document.getElementById(arguments[0]);
if (!root) return null;
return [...root.querySelectorAll(arguments[1])]
  .filter(e => e.getBBox ? e.getBBox().width > 0 : true)
  .map(e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom, e.textContent]; });
"""

TEXT_FITS_JS = """
const input = document.getElementById(arguments[0]);
const style = getComputedStyle(input);
const ctx = document.createElement('canvas').getContext('2d');
ctx.font = style.font;
const room = input.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
return [ctx.measureText(input.value).width, room, input.value];
"""


def rects(driver: Any, root: str, selector: str) -> list[list[Any]]:
    found: list[list[Any]] = driver.execute_script(RECTS_JS, root, selector) or []
    return found


def overlap(a: list[Any], b: list[Any]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_run_page_details_and_a_shareable_compare_url(server: LiveServer, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    with httpx.Client(base_url=server.url + API_PREFIX, timeout=30.0) as api:
        run_id = api.post("/runs", json={"name": "lab finished", "project": "nq"}).json()["id"]
        steps = list(range(60))
        grad = [float(v) for v in 10 ** np.linspace(-1, 1.5, 60)]  # 2.5 decades: plotly's 1-2-5 labels
        body = {"batch_id": "b1", "steps": steps, "metrics": {M.GRAD_NORM: grad, M.REWARD_MEAN: [0.5] * 60}}
        assert api.post(f"/runs/{run_id}/metrics", json=body).status_code == 200
        assert api.post(f"/runs/{run_id}/actions", json=probe_actions(range(20, 60))).status_code == 200
        assert api.post(f"/runs/{run_id}/finish", json={"status": "finished"}).status_code == 200
        others = [
            api.post("/runs", json={"name": name, "project": "nq"}).json()["id"] for name in (LINK, "<b>")
        ]
        for other in others:
            body = {"batch_id": f"o{other}", "steps": steps[:30], "metrics": {M.REWARD_MEAN: [0.2] * 30}}
            assert api.post(f"/runs/{other}/metrics", json=body).status_code == 200

        # The run page by project and name.
        browser.get(f"{server.url}/dashboard/run/nq/lab%20finished")
        wait_for(browser, lambda d: (s := plot(d, "panel-grad")) and s["points"][0] == 60, 30, "grad panel")
        assert browser.find_element(By.ID, "run-name").text == "lab finished"

        # Log axis: a handful of labels, well apart.
        labels = wait_for(browser, lambda d: rects(d, "panel-grad", ".ytick text"), 10, "y tick labels")
        assert 2 <= len(labels) <= 6, labels
        tops = sorted(r[1] for r in labels)
        assert min(b - a for a, b in itertools.pairwise(tops)) >= 20, labels

        # Histogram: legend and axis title apart.
        wait_for(browser, lambda d: (s := plot(d, "action-hist")) and s["traces"], 20, "the histogram")
        legend = rects(browser, "action-hist", "g.legend")
        title = rects(browser, "action-hist", ".g-xtitle")
        assert legend and title and not overlap(legend[0], title[0]), (legend, title)
        quantile_legend = rects(browser, "action-quantiles", "g.legend")
        quantile_title = rects(browser, "action-quantiles", ".g-xtitle")
        assert not overlap(quantile_legend[0], quantile_title[0]), (quantile_legend, quantile_title)

        # The lambda box shows 0.25 whole.
        box = browser.find_element(By.ID, "llds-lam")
        box.clear()
        box.send_keys("0.25")
        width, room, value = browser.execute_script(TEXT_FITS_JS, "llds-lam")
        assert value == "0.25" and width <= room, (width, room)

        # LLDS on for a finished run: a confirmation first, the write only after it.
        browser.find_element(By.ID, "llds-on").click()
        dialog = WebDriverWait(browser, 15).until(expected_conditions.alert_is_present())
        assert "finished" in dialog.text and "lab finished" in dialog.text
        assert api.get(f"/runs/{run_id}/directive").json()["llds"]["enabled"] is False
        dialog.accept()
        wait_for(browser, lambda d: "LLDS on" in d.find_element(By.ID, "directive-msg").text, 15, "the write")
        directive = api.get(f"/runs/{run_id}/directive").json()
        assert directive["llds"] == {"enabled": True, "lam": 0.25}
        shot(browser, "dashboard-hardening-run", full_height=2600)
        browser.set_window_size(1500, 1300)

        # Compare: the pick goes into the URL; the URL brings the pick back.
        browser.get(f"{server.url}/dashboard/compare?runs={others[0]}")
        wait_for(browser, lambda d: d.find_elements(By.ID, "compare-runs"), 20, "the compare page")
        browser.find_element(By.ID, "compare-runs").click()
        option = wait_for(
            browser,
            lambda d: [
                o for o in d.find_elements(By.CSS_SELECTOR, "[role=option]") if f"(#{others[1]})" in o.text
            ],
            10,
            "the second run in the dropdown",
        )[0]
        option.click()
        wait_for(browser, lambda d: f"runs={others[0]},{others[1]}" in unquote(d.current_url), 10, "the URL")
        shared = browser.current_url
        browser.get(f"{server.url}/dashboard/")
        browser.get(shared)
        graph = '{"metric":"reward/mean","type":"compare-graph"}'
        compared = wait_for(
            browser, lambda d: (s := plot(d, graph)) and len(s["traces"]) == 2 and s, 20, "graph"
        )
        assert compared["traces"] == [
            f'&lt;a href="http://x"&gt;click&lt;/a&gt; (#{others[0]})',
            f"&lt;b&gt; (#{others[1]})",
        ]
        legend_text = browser.execute_script(
            "const g = document.getElementById(arguments[0]);"
            "return [g.querySelectorAll('.legend a').length, g.querySelector('.legend').textContent];",
            graph,
        )
        assert legend_text[0] == 0 and LINK in legend_text[1] and "<b>" in legend_text[1], legend_text
        shot(browser, "dashboard-hardening-compare")

"""Issue 25 item 9 in a real headless Chromium against `lldmon serve`: every graph title of the run page
and the compare page stays readable at common window widths.

Plotly shows its modebar (the toolbar) over the top right corner of a graph while the pointer is on it;
a title drawn inside the figure shares that row and, when long, runs under the toolbar and off the
graph's edge. For each width the test hovers every graph (so its modebar is shown) and measures the
rendered boxes: no title's text may intersect its graph's modebar, and each title's text lies inside
its graph's box (the card: not clipped). The titles keep what they say (e.g. "exact" vs "proxy").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import httpx
import pytest

from contracts.wire import API_PREFIX
from dashboard.panels import PANEL_METRICS, PANELS
from tests.dashboard.conftest import needs_browser, plot, probe_actions, wait_for
from tests.live_server import LiveServer

pytestmark = [needs_browser, pytest.mark.timeout(240)]

WIDTHS = (1024, 1400, 1920)
HEIGHT = 1000
STEPS = 40
RUN_GRAPHS = [*(f"panel-{panel.key}" for panel in PANELS), "action-hist", "action-quantiles"]
LONG_METRIC = "eval/share_of_validation_prompts_answered_exactly_by_the_policy_after_the_update/mean"
"""A metric name of the user's as long as the longest panel titles: the compare page's graph title."""

TITLE_BOXES_JS = """
// A graph's titles: headings among the children of its box (the card), and any title plotly draws in
// the figure (`.gtitle`), each with the box of its text (a Range: a heading's own box is as wide as
// its card, its text may not be); the modebar's box and opacity; the box's box.
const graph = document.querySelector(arguments[0]);
if (!graph) return null;
const container = graph.parentElement;
const box = r => [r.left, r.top, r.right, r.bottom];
const textBox = el => {
  if (el instanceof SVGElement) return box(el.getBoundingClientRect());
  const range = document.createRange();
  range.selectNodeContents(el);
  return box(range.getBoundingClientRect());
};
const titles = [...container.querySelectorAll(':scope > .graph-title'), ...graph.querySelectorAll('.gtitle')]
  .filter(el => el.textContent.trim())
  .map(el => ({text: el.textContent, box: textBox(el)}));
const modebar = graph.querySelector('.modebar');
const svg = graph.querySelector('.main-svg');
return {
  titles: titles,
  modebar: modebar ? box(modebar.getBoundingClientRect()) : null,
  modebarOpacity: modebar ? parseFloat(getComputedStyle(modebar).opacity) : 0,
  container: box(container.getBoundingClientRect()),
  plotWidth: svg ? svg.getBoundingClientRect().width : 0,
  graphWidth: graph.getBoundingClientRect().width,
};
"""


def overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def inside(inner: list[float], outer: list[float]) -> bool:
    return outer[0] <= inner[0] and inner[2] <= outer[2] and outer[1] <= inner[1] and inner[3] <= outer[3]


def hovered(driver: Any, selector: str) -> dict[str, Any]:
    """The graph's boxes with the pointer on it, once plotly has drawn it at its box's width (the
    figures are responsive) and the modebar has faded in."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    graph = driver.find_element(By.CSS_SELECTOR, selector)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", graph)
    ActionChains(driver).move_to_element(graph).perform()

    def ready(d: Any) -> dict[str, Any] | None:
        b: dict[str, Any] | None = d.execute_script(TITLE_BOXES_JS, selector)
        if b is None or b["modebar"] is None or abs(b["plotWidth"] - b["graphWidth"]) > 1:
            return None
        return b if b["modebarOpacity"] == 1 else None

    found: dict[str, Any] = wait_for(driver, ready, 10, f"{selector} hovered, with its modebar shown")
    return found


def title_problems(driver: Any, selectors: list[str], width: int, shots: Path, page: str) -> list[str]:
    """What is wrong with the graphs' titles at this window width; a screenshot of the page for a look."""
    driver.set_window_size(width, HEIGHT)
    problems: list[str] = []
    for selector in selectors:
        measured = hovered(driver, selector)
        where = f"{page} at {width} px, {selector}"
        if not measured["titles"]:
            problems.append(f"{where}: no title")
        for title in measured["titles"]:
            if overlap(title["box"], measured["modebar"]):
                problems.append(f"{where}: {title['text']!r} runs under the modebar {measured}")
            if not inside(title["box"], measured["container"]):
                problems.append(f"{where}: {title['text']!r} is cut off {measured}")
    # The whole page in one picture: a window as tall as the page.
    driver.set_window_size(width, driver.execute_script("return document.documentElement.scrollHeight"))
    driver.execute_script("window.scrollTo(0, 0)")
    driver.save_screenshot(str(shots / f"{page}-{width}.png"))
    return problems


def titles(driver: Any, selector: str) -> str:
    return " ".join(t["text"] for t in hovered(driver, selector)["titles"])


def test_graph_titles_clear_the_modebar_at_common_widths(
    server: LiveServer, browser: Any, tmp_path: Path
) -> None:
    with httpx.Client(base_url=server.url + API_PREFIX, timeout=30.0) as api:
        steps = list(range(STEPS))
        run_ids = []
        for name in ("titles", "titles-baseline"):
            run_id = api.post("/runs", json={"name": name, "project": "nq"}).json()["id"]
            metrics = {m: [0.1 + 0.01 * s for s in steps] for m in [*PANEL_METRICS, LONG_METRIC]}
            body = {"batch_id": "b1", "steps": steps, "metrics": metrics}
            assert api.post(f"/runs/{run_id}/metrics", json=body).status_code == 200
            run_ids.append(run_id)
        actions = api.post(f"/runs/{run_ids[0]}/actions", json=probe_actions(range(20, STEPS)))
        assert actions.status_code == 200, actions.text

    browser.get(f"{server.url}/dashboard/run/{run_ids[0]}")
    run_graphs = [f"#{graph_id}" for graph_id in RUN_GRAPHS]
    for selector in run_graphs:
        wait_for(browser, lambda d, g=selector[1:]: (s := plot(d, g)) and any(s["points"]), 30, selector)
    problems = [p for width in WIDTHS for p in title_problems(browser, run_graphs, width, tmp_path, "run")]

    # The titles say what each graph shows: the panel's own title, whole (which estimator: exact or
    # proxy), and the step the histogram shows.
    for panel in PANELS:
        assert titles(browser, f"#panel-{panel.key}") == panel.title
    for key in ("deltas", "frac"):
        assert "exact" in titles(browser, f"#panel-{key}") and "proxy" in titles(browser, f"#panel-{key}")
    assert titles(browser, "#action-hist") == "Action deltas D_action at step 39 (32 actions)"
    assert titles(browser, "#action-quantiles") == "D_action quantiles over steps (A>0 actions)"

    query = ",".join(quote_plus(m, safe="/") for m in ("reward/mean", LONG_METRIC))
    browser.get(f"{server.url}/dashboard/compare?runs={run_ids[0]},{run_ids[1]}&metrics={query}")
    compare_graphs = [
        f'[id=\'{{"metric":"{metric}","type":"compare-graph"}}\']' for metric in ("reward/mean", LONG_METRIC)
    ]
    for selector, metric in zip(compare_graphs, ("reward/mean", LONG_METRIC), strict=True):
        graph_id = f'{{"metric":"{metric}","type":"compare-graph"}}'
        wait_for(browser, lambda d, g=graph_id: (s := plot(d, g)) and len(s["traces"]) == 2, 30, selector)
    problems += [
        p for width in WIDTHS for p in title_problems(browser, compare_graphs, width, tmp_path, "compare")
    ]
    assert titles(browser, compare_graphs[1]) == LONG_METRIC

    assert not problems, "\n".join(problems) + f"\n(screenshots in {tmp_path})"

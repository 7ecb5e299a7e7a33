#!/usr/bin/env python
"""Screenshot of one run's dashboard page (/dashboard/run/<id>) in headless Chromium.

Either against a running lldmon (`--url http://127.0.0.1:8000`) or against an embedded SQLite data
directory (`--data-dir OUT/lldmon`: starts `lldmon serve` on a free loopback port and stops it after).
The run is found by name (and `--project`) through the HTTP API; the script waits until every graph of
the run page is drawn from the run's data (no "loading ..." placeholder left), then saves the PNG.

    python scripts/dashboard_screenshot.py --data-dir /work/lab/early/lldmon --project lab \\
        --run tiny_lr0.001_spg4_g4_len96_llds-off_n80_s0 --out docs/img/lab-early-collapse.png

Needs Chromium and chromedriver (Debian: `apt-get install chromium chromium-driver`) and selenium (the
`dev` extra). Exit status: 0 written, 1 the page did not finish drawing or the server failed,
2 bad arguments, missing browser, unknown run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

API_PREFIX = "/api/v1"  # contracts.wire.API_PREFIX; kept literal so the script runs from a bare checkout

DEFAULT_CHROMIUM = "/usr/bin/chromium"
DEFAULT_CHROMEDRIVER = "/usr/bin/chromedriver"

PAGE_STATE_JS = """
const graphs = [...document.querySelectorAll('.js-plotly-plot')];
const states = graphs.map(gd => {
  const host = gd.closest('[id]');
  const notes = ((gd.layout || {}).annotations || []).map(a => String(a.text || ''));
  return {
    id: host ? host.id : '',
    drawn: !!(gd.data && gd.layout && gd._fullLayout),
    loading: notes.some(t => t.includes('loading ...')),
    points: (gd.data || []).reduce((n, t) => n + (t.x ? t.x.length : 0), 0),
    height: gd.offsetHeight,
  };
});
const timeline = document.getElementById('run-timeline');
return {
  graphs: states,
  timeline: timeline ? timeline.childElementCount : -1,
  pageHeight: Math.ceil(document.documentElement.scrollHeight),
};
"""


HIDE_MODEBAR_JS = """
const style = document.createElement('style');
style.textContent = '.modebar-container { display: none !important; }';
document.head.appendChild(style);
"""


class ScreenshotError(Exception):
    """A failure with a message for the user; `code` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# --- server -------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lldmon_executable() -> str:
    beside = Path(sys.executable).parent / "lldmon"
    found = str(beside) if beside.exists() else shutil.which("lldmon")
    if not found:
        raise ScreenshotError("`lldmon` not found (install this project: pip install -e '.[server]')", 2)
    return found


@contextlib.contextmanager
def serve(data_dir: Path, timeout: float) -> Iterator[str]:
    """`lldmon serve --data-dir DATA_DIR` on a free loopback port; yields its base URL, stops it after."""
    if not (data_dir / "lldmon.db").exists():
        raise ScreenshotError(f"{data_dir} has no lldmon.db (not an lldmon data directory)", 2)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != "LLDMON_DATABASE_URL"}
    with tempfile.TemporaryFile() as log:
        command = [lldmon_executable(), "serve", "--data-dir", str(data_dir)]
        proc = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + timeout
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    output = log.read().decode(errors="replace")[-3000:]
                    why = "exited" if proc.poll() is not None else f"not ready after {timeout:.0f}s"
                    raise ScreenshotError(f"lldmon serve {why}:\n{output}")
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# --- run lookup ---------------------------------------------------------------------------------------


def find_run(url: str, name: str, project: str | None, token: str | None) -> int:
    """The id of the run called `name` (in `project` if given), or a ScreenshotError naming the choices."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    params: dict[str, Any] = {"limit": 1000}
    others: list[str] = []
    if project:
        params["project"] = project
    try:
        with httpx.Client(base_url=url + API_PREFIX, headers=headers, timeout=15.0) as api:
            response = api.get("/runs", params={**params, "name": name})
            if response.status_code == 401:
                raise ScreenshotError(f"{url} wants a token (--token or LLDMON_TOKEN)", 2)
            response.raise_for_status()
            runs = response.json()
            if not runs:
                others = [r["name"] for r in api.get("/runs", params=params).json()]
    except httpx.HTTPError as exc:
        raise ScreenshotError(f"cannot list the runs of {url}: {exc}") from exc
    where = f"project {project!r}" if project else "any project"
    if not runs:
        listing = ", ".join(others[:20]) + (" ..." if len(others) > 20 else "") if others else "none"
        raise ScreenshotError(f"no run named {name!r} in {where} at {url} (runs there: {listing})", 2)
    if len(runs) > 1:
        projects = ", ".join(sorted(str(r["project"]) for r in runs))
        raise ScreenshotError(f"{len(runs)} runs named {name!r} (projects: {projects}); pass --project", 2)
    return int(runs[0]["id"])


# --- browser ------------------------------------------------------------------------------------------


def check_browser(chromium: str, chromedriver: str) -> None:
    missing = [p for p in (chromium, chromedriver) if not Path(p).is_file()]
    if missing:
        raise ScreenshotError(
            f"missing {' and '.join(missing)}: the screenshot needs Chromium and chromedriver "
            "(Debian: apt-get install chromium chromium-driver; or pass --chromium/--chromedriver)",
            2,
        )
    try:
        import selenium  # noqa: F401
    except ImportError as exc:
        raise ScreenshotError("selenium is not installed (pip install -e '.[dev]')", 2) from exc


@contextlib.contextmanager
def browser(chromium: str, chromedriver: str, width: int, height: int) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="lldmon-shot-") as profile:
        options = Options()
        options.binary_location = chromium
        for arg in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--disable-sync",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            f"--window-size={width},{height}",
            f"--user-data-dir={profile}",
        ):
            options.add_argument(arg)
        driver = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
        driver.set_page_load_timeout(30)
        try:
            yield driver
        finally:
            driver.quit()


def page_state(driver: Any) -> dict[str, Any]:
    state: dict[str, Any] = driver.execute_script(PAGE_STATE_JS)
    return state


def drawn(state: dict[str, Any]) -> bool:
    """Every graph drawn from data (no loading placeholder), the reward panel with points, timeline filled."""
    graphs = state["graphs"]
    reward = [g for g in graphs if g["id"] == "panel-reward"]
    return (
        bool(graphs)
        and all(g["drawn"] and not g["loading"] and g["height"] > 100 for g in graphs)
        and bool(reward)
        and reward[0]["points"] > 0
        and state["timeline"] > 0
    )


def wait_drawn(driver: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    state = page_state(driver)
    while not drawn(state):
        if time.monotonic() > deadline:
            pending = [g["id"] for g in state["graphs"] if g["loading"] or not g["drawn"]]
            raise ScreenshotError(
                f"the run page did not finish drawing within {timeout:.0f}s "
                f"(graphs: {len(state['graphs'])}, still loading: {pending or 'none'}, "
                f"timeline entries: {state['timeline']})"
            )
        time.sleep(0.25)
        state = page_state(driver)
    return state


def set_viewport(driver: Any, width: int, height: int) -> None:
    """Exact viewport size through the DevTools protocol (a window is clamped to the headless screen)."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )
    time.sleep(0.5)  # responsive graphs relayout to the new size


def take(
    driver: Any, page_url: str, out: Path, width: int, height: int | None, timeout: float, modebar: bool
) -> tuple[int, int]:
    """Open the page, wait for the graphs, size the viewport (the whole page when `height` is None), save."""
    driver.get(page_url)
    if not modebar:  # Plotly's toolbars cover the long panel titles in a still picture
        driver.execute_script(HIDE_MODEBAR_JS)
    set_viewport(driver, width, height or 1200)
    state = wait_drawn(driver, timeout)
    final_height = height or state["pageHeight"]
    for _ in range(3):  # the page height can change once the graphs relayout to the final width
        set_viewport(driver, width, final_height)
        state = wait_drawn(driver, timeout)
        if height is not None or state["pageHeight"] == final_height:
            break
        final_height = state["pageHeight"]
    out.parent.mkdir(parents=True, exist_ok=True)
    if not driver.save_screenshot(str(out)):
        raise ScreenshotError(f"Chromium could not write {out}")
    return width, final_height


def shrink(path: Path) -> str:
    """Lossy palette PNG with pngquant, then optipng, whichever is installed; what was done."""
    done = []
    if pngquant := shutil.which("pngquant"):
        subprocess.run(
            [pngquant, "--force", "--skip-if-larger", "--quality=70-95", "--output", str(path), str(path)],
            check=False,
        )
        done.append("pngquant")
    if optipng := shutil.which("optipng"):
        subprocess.run([optipng, "-quiet", "-o2", str(path)], check=False)
        done.append("optipng")
    return "+".join(done) or "nothing (neither pngquant nor optipng installed)"


# --- CLI ----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Screenshot of one run's lldmon dashboard page in headless Chromium.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--url", help="base URL of a running lldmon, e.g. http://127.0.0.1:8000")
    source.add_argument(
        "--data-dir", type=Path, help="embedded SQLite data dir: start `lldmon serve` on it, stop after"
    )
    p.add_argument("--run", required=True, help="run name")
    p.add_argument("--project", help="project of the run (needed when the name is in several)")
    p.add_argument("--out", type=Path, required=True, help="PNG file to write")
    p.add_argument("--width", type=int, default=1400, help="window width (CSS px)")
    p.add_argument("--height", type=int, help="window height (CSS px); default: the whole page")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the page to draw")
    p.add_argument("--token", default=os.environ.get("LLDMON_TOKEN"), help="API token, if auth is on")
    p.add_argument("--chromium", default=DEFAULT_CHROMIUM)
    p.add_argument("--chromedriver", default=DEFAULT_CHROMEDRIVER)
    p.add_argument("--modebar", action="store_true", help="keep Plotly's toolbars (hidden by default)")
    p.add_argument("--shrink", action="store_true", help="recompress with pngquant/optipng if installed")
    args = p.parse_args(argv)
    if args.width < 400 or (args.height is not None and args.height < 300):
        p.error("--width must be >= 400 and --height >= 300")
    if args.out.suffix.lower() != ".png":
        p.error("--out must end in .png")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    try:
        check_browser(args.chromium, args.chromedriver)
        with contextlib.ExitStack() as stack:
            url = args.url.rstrip("/") if args.url else stack.enter_context(serve(args.data_dir, 45.0))
            run_id = find_run(url, args.run, args.project, args.token)
            page = f"{url}/dashboard/run/{run_id}"
            if args.token:
                page += f"?token={quote(args.token)}"
            driver = stack.enter_context(
                browser(args.chromium, args.chromedriver, args.width, args.height or 1200)
            )
            size = take(driver, page, args.out, args.width, args.height, args.timeout, args.modebar)
        shrunk = f", recompressed with {shrink(args.out)}" if args.shrink else ""
    except ScreenshotError as exc:
        print(f"dashboard_screenshot: {exc}", file=sys.stderr)
        return exc.code
    kib = args.out.stat().st_size / 1024
    print(
        f"wrote {args.out} ({size[0]}x{size[1]}, {kib:.0f} KiB{shrunk}): run {args.run!r} (id {run_id}), "
        f"{time.monotonic() - started:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The dashboard mounted in the API app (/dashboard, a2wsgi): pages, callbacks, assets and auth."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from contracts.wire import API_PREFIX
from dashboard.app import create_dash_app
from dashboard.auth import CSRF_COOKIE, TOKEN_COOKIE
from tests.monitor.api.helpers import new_run

ROOT = Path(__file__).resolve().parents[2]
HTML = {"Accept": "text/html"}


def route(client: TestClient, pathname: str, search: str = "", **kwargs: Any) -> Any:
    """Call the URL -> page callback as dash-renderer does."""
    body = {
        "output": "..page.children...whoami.children..",
        "outputs": [{"id": "page", "property": "children"}, {"id": "whoami", "property": "children"}],
        "inputs": [
            {"id": "url", "property": "pathname", "value": pathname},
            {"id": "url", "property": "search", "value": search},
        ],
        "changedPropIds": ["url.pathname"],
        "state": [],
    }
    return client.post("/dashboard/_dash-update-component", json=body, **kwargs)


def test_served_under_dashboard_with_assets_and_callbacks_resolving(client: TestClient) -> None:
    run_id = new_run(client, "grpo-3b", project="nq")
    index = client.get("/dashboard/", headers=HTML)
    assert index.status_code == 200 and "<title>lldmon</title>" in index.text
    assert '"requests_pathname_prefix":"\\u002fdashboard\\u002f"' in index.text
    assert client.get("/dashboard", follow_redirects=False).status_code in (307, 308)
    scripts = [s.split('"')[0] for s in index.text.split('src="')[1:]]
    assert scripts and all(s.startswith("/dashboard/_dash-component-suites/") for s in scripts)
    assert client.get(scripts[0]).status_code == 200
    assert client.get("/dashboard/_dash-layout").status_code == 200
    assert client.get("/dashboard/_dash-dependencies").status_code == 200
    page = route(client, f"/dashboard/run/{run_id}")
    assert page.status_code == 200, page.text
    response = page.json()["response"]
    assert "grpo-3b" in str(response["page"]) and response["whoami"]["children"] == "auth off (local)"
    assert "runs-table" in str(route(client, "/dashboard/").json())
    assert client.get("/").status_code == 200  # the API's own routes are untouched


def test_tokens_gate_the_dashboard_like_the_api(client: TestClient, app: Any) -> None:
    run_id = new_run(client, "nq-run", project="nq")
    state = app.state.lldmon
    token, _ = state.auth.create_token("nq")
    other_token, _ = state.auth.create_token("hotpot")

    denied = client.get("/dashboard/", headers=HTML)
    assert denied.status_code == 401 and "?token=" in denied.text
    assert route(client, "/dashboard/").status_code == 401
    assert client.get("/dashboard/?token=lldm_wrong", headers=HTML).status_code == 401

    # ?token= once: checked, kept in an HttpOnly cookie, and dropped from the URL.
    accepted = client.get(f"/dashboard/run/{run_id}?token={token}&x=1", follow_redirects=False)
    assert accepted.status_code == 303 and accepted.headers["location"] == f"/dashboard/run/{run_id}?x=1"
    cookie = accepted.headers["set-cookie"]
    assert cookie.startswith(f"{TOKEN_COOKIE}=") and "HttpOnly" in cookie and "Path=/dashboard/" in cookie
    assert "SameSite=Lax" in cookie
    index = client.get("/dashboard/", headers=HTML)
    assert index.status_code == 200
    csrf = client.cookies.get(CSRF_COOKIE)
    assert csrf

    # Callbacks with the cookie also need Dash's CSRF header (double submit).
    assert route(client, "/dashboard/").status_code == 401
    ok = route(client, f"/dashboard/run/{run_id}", headers={"X-CSRFToken": csrf})
    assert ok.status_code == 200 and ok.json()["response"]["whoami"]["children"] == "project nq"
    assert "llds-on" in str(ok.json())  # directive controls for the run's project

    # An Authorization header works without cookies; another project's run is a 404 page (as if missing).
    client.cookies.clear()
    bearer = {"Authorization": f"Bearer {other_token}"}
    assert client.get("/dashboard/", headers={**HTML, **bearer}).status_code == 200
    forbidden = route(client, f"/dashboard/run/{run_id}", headers=bearer).json()["response"]["page"]
    assert f"run {run_id} does not exist" in str(forbidden) and "llds-on" not in str(forbidden)
    assert "nq-run" not in str(route(client, "/dashboard/", headers=bearer).json())

    # Static bundles carry no data and load without a token.
    assert client.get("/dashboard/_dash-component-suites/dash/deps/polyfill@7.12.1.min.js").status_code == 200
    # The API still wants its header: the dashboard's cookie is not a way in.
    client.cookies.set(TOKEN_COOKIE, token)
    assert client.get(f"{API_PREFIX}/runs").status_code == 401


def test_a_revoked_token_cookie_is_cleared(client: TestClient, app: Any) -> None:
    state = app.state.lldmon
    token, token_id = state.auth.create_token("nq")
    assert client.get(f"/dashboard/?token={token}", follow_redirects=False).status_code == 303
    state.auth.revoke(token_id)
    state.auth.create_token("nq")  # auth stays on
    response = client.get("/dashboard/", headers=HTML)
    cleared = [c for c in response.headers.get_list("set-cookie") if c.startswith(f"{TOKEN_COOKIE}=")]
    assert response.status_code == 401 and cleared and "Max-Age=0" in cleared[0]


def test_prefix_must_be_a_path(app: Any) -> None:
    with pytest.raises(ValueError, match="start and end"):
        create_dash_app(app.state.lldmon, url_base_pathname="dashboard")


def test_dash_is_loaded_on_the_first_dashboard_request_only(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from fastapi.testclient import TestClient\n"
        "from monitor.api.app import create_app\n"
        "from monitor.config import Settings\n"
        f"app = create_app(Settings(data_dir={str(tmp_path)!r}))\n"
        "assert 'dash' not in sys.modules and 'plotly' not in sys.modules, 'dash loaded by create_app'\n"
        "with TestClient(app) as c:\n"
        "    assert c.get('/api/v1/runs').status_code == 200\n"
        "    assert 'dash' not in sys.modules\n"
        "    assert c.get('/dashboard/').status_code == 200\n"
        "    assert 'dash' in sys.modules\n"
        "app.state.lldmon.db.dispose()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)

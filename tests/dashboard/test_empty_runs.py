"""An empty runs list says how a first run gets here (the TRL hooks, MonitorClient, `lldmon demo`,
`lldmon import`), addressed to this server's base URL; a filter that matches nothing says only that."""

from __future__ import annotations

from fastapi.testclient import TestClient

from dashboard.callbacks.base import DashContext
from dashboard.callbacks.runs_list import runs_table
from monitor.domain import Principal
from tests.monitor.api.helpers import new_run

OPEN = Principal()


def _text(component: object) -> str:
    """All the text a Dash component tree renders, children in order."""
    children = getattr(component, "children", component)
    if children is None:
        return ""
    if isinstance(children, str):
        return children
    if isinstance(children, (list, tuple)):
        return "".join(_text(c) for c in children)
    return _text(children)


def test_empty_dashboard_points_at_the_hooks_the_demo_and_import(dctx: DashContext) -> None:
    table, _ = runs_table(dctx, OPEN, None, None, None, None, server_url="http://lldmon.example:8000")
    text = _text(table)
    assert getattr(table, "id", None) == "runs-empty"
    assert "POST /api/v1/runs" not in text
    assert (
        "MonitoredGRPOTrainer" in text and "LLDMON_URL=http://lldmon.example:8000 in its environment" in text
    )
    assert 'MonitorClient("http://lldmon.example:8000", "my-run")' in text
    assert "lldmon demo" in text
    assert "lldmon import run.jsonl --run my-run --url http://lldmon.example:8000" in text
    assert "/dashboard" not in text  # LLDMON_URL is the API's base URL


def test_a_filter_that_matches_nothing_says_so(client: TestClient, dctx: DashContext) -> None:
    new_run(client, "grpo-a", project="nq")
    table, _ = runs_table(dctx, OPEN, None, "failed", None, None)
    assert getattr(table, "id", None) == "runs-empty"
    assert _text(table) == "No runs match these filters."

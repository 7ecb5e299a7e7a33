"""The HTTP contract does not drift when the service is reshaped: `app.openapi()` (paths, methods,
operation ids, parameters, bodies, response codes and schemas) equals the committed snapshot.

A deliberate API change regenerates it: `LLDMON_UPDATE_OPENAPI=1 pytest tests/monitor/api/test_openapi_stable.py`
(and the diff of openapi.json is then part of the review).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from monitor.api.app import create_app
from monitor.config import Settings

SNAPSHOT = Path(__file__).with_name("openapi.json")


def _document(tmp_path: Path) -> dict[str, Any]:
    app = create_app(Settings(data_dir=tmp_path))
    try:
        document: dict[str, Any] = json.loads(json.dumps(app.openapi(), sort_keys=True))
    finally:
        app.state.lldmon.db.dispose()
    return document


def _operations(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        f"{method.upper()} {path}": {
            "operationId": op.get("operationId"),
            "responses": sorted(op["responses"]),
        }
        for path, methods in document["paths"].items()
        for method, op in methods.items()
    }


def test_openapi_matches_the_snapshot(tmp_path: Path) -> None:
    document = _document(tmp_path)
    if os.environ.get("LLDMON_UPDATE_OPENAPI"):
        SNAPSHOT.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    expected = json.loads(SNAPSHOT.read_text())
    # The summary first, so a failure names the route that moved or changed its responses.
    assert _operations(document) == _operations(expected)
    assert document == expected

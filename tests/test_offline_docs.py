"""Issue 16 #16: `/docs` and `/redoc` loaded Swagger UI and ReDoc from a CDN, so they were blank on an
air-gapped cluster. Every asset they reference must come from the service itself."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient


@pytest.mark.parametrize(("page", "marker"), [("/docs", "SwaggerUIBundle"), ("/redoc", "<redoc")])
def test_api_docs_need_no_network(client: TestClient, page: str, marker: str) -> None:
    response = client.get(page)
    assert response.status_code == 200 and marker in response.text
    html = response.text
    assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", html, re.I), re.findall(r"//\S+", html)
    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    assert any(a.endswith(".js") for a in assets), assets
    for asset in assets:
        got = client.get(asset)
        assert got.status_code == 200 and len(got.content) > 1000, asset
    assert client.get("/openapi.json").status_code == 200

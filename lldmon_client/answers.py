"""Telling an lldmon API's answer from another server's, and saying so in one line.

A URL that points at the dashboard, a proxy's error page or another service answers HTML or plain text
where the API always answers JSON (its errors too). Every command that talks to a service words that
case the same way: which URL answered what, and where the API would be.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx

from contracts.wire import API_PREFIX

__all__ = ["json_body", "non_json_kind", "not_an_api_message"]


def json_body(response: httpx.Response) -> Any:
    """The parsed JSON body, or None if the body is not JSON (JSON `null` is no API answer either)."""
    try:
        return response.json()
    except ValueError:  # json.JSONDecodeError, UnicodeDecodeError
        return None


def non_json_kind(response: httpx.Response) -> str:
    """What a non-JSON answer was, in a word or two: HTML, text/plain, an empty body, malformed JSON."""
    media = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    if not response.content:
        return "an empty body"
    if media in ("text/html", "application/xhtml+xml"):
        return "HTML"
    if media == "application/json" or media.endswith("+json"):
        return "malformed JSON"
    return media or "a body without a content type"


def not_an_api_message(url: str, base_url: str, response: httpx.Response, kind: str | None = None) -> str:
    """One line for an answer that is not the API's: `url` as the person gave it, `base_url` where the
    API was looked for, `kind` what came back (default: `non_json_kind`), and where the API would be."""
    parts = urlsplit(base_url)
    origin = f"{parts.scheme}://{parts.netloc}"
    api = origin + API_PREFIX
    request = response.request
    asked = f"{request.method} {request.url.path}"
    if base_url != api:  # a path before /api/v1: the dashboard's URL, a proxy prefix
        hint = f"the API is at {api} (--url {origin})"
    else:
        hint = f"is an lldmon service (`lldmon serve`) listening at {origin}?"
    what = non_json_kind(response) if kind is None else kind
    return f"{url} did not answer as an lldmon API ({what}, HTTP {response.status_code} to {asked}); {hint}"

"""Where the service's API is, from a URL a person typed.

Two readings, on purpose: a training job checks its URL up front (`normalize_url`), because a URL it
cannot use would be retried in the background for the whole run while every batch piles up in the
spool; a command run by hand (`api_url`) takes the URL as given and lets the first answer tell what is
there, so a dashboard URL gets "the API is at ..." rather than a refusal of its path.
"""

from __future__ import annotations

import contextlib
import urllib.parse

from contracts.wire import API_PREFIX

__all__ = ["api_url", "normalize_url"]


def api_url(url: str) -> str:
    """The API's base URL: `url` without surrounding blanks, trailing slashes and a trailing "/api/v1",
    then "/api/v1" ("http://host:8000", "http://host:8000/", "http://host:8000/api/v1/" all give
    "http://host:8000/api/v1"). Any other path is kept (a proxy's prefix)."""
    return str(url).strip().rstrip("/").removesuffix(API_PREFIX).rstrip("/") + API_PREFIX


def _did_you_mean(url: str) -> str:
    return f" (did you mean {url!r}?)"


def _origin(parts: urllib.parse.SplitResult) -> str:
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def normalize_url(url: str) -> str:
    """The service's base URL: "http(s)://host[:port]", without a trailing "/api/v1".

    The only path accepted is the API's own, "/api/v1" (behind a proxy that serves the service under
    a prefix: "<prefix>/api/v1", kept as the base "<prefix>"). Any other path is a page of the service,
    not its base: the dashboard URL the demo prints would send every batch to a 405 and into the
    spool for the whole run.

    Raises ValueError naming the problem and, where the intended URL is plain, suggesting it.
    """
    text = str(url).strip()
    hint = ""
    if text and "://" not in text:
        hint = _did_you_mean(f"http://{text}")
        with contextlib.suppress(ValueError):
            guess = urllib.parse.urlsplit(f"http://{text}")
            if guess.hostname:
                hint = _did_you_mean(_origin(guess))
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in 0-65535
    except ValueError as exc:
        raise ValueError(f"lldmon URL {url!r} is not valid: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"lldmon URL must look like http://host:port, got {url!r}{hint}")
    if parts.query or parts.fragment:
        raise ValueError(
            f"lldmon URL must not have a query or fragment, got {url!r}{_did_you_mean(_origin(parts))}"
        )
    path = parts.path.rstrip("/")
    if path.endswith(API_PREFIX):
        path = path[: -len(API_PREFIX)].rstrip("/")
    elif path:
        raise ValueError(
            f"lldmon URL must look like http://host:port, without a path, got {url!r}"
            f"{_did_you_mean(_origin(parts))}"
        )
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))

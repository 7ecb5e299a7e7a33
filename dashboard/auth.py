"""The dashboard honours the API's bearer tokens.

- With no token in the database (auth off) every request gets the unrestricted Principal.
- Otherwise a request carries the token as `Authorization: Bearer <token>` (e.g. set by a proxy) or in
  the `lldmon_token` cookie. `?token=<token>` on any page is accepted once: it is checked, stored in
  the cookie (HttpOnly, SameSite=Lax, scoped to the dashboard's path) and the browser is redirected to
  the same URL without it, so the token does not stay in the address bar or history.
- The Principal is resolved by `state.auth.authenticate("Bearer <token>")` on every request and kept in
  `flask.g`; callbacks pass it to every service call (project scoping = the API's). No valid token: 401.
- Callback POSTs authenticated by the cookie must also carry Dash's `X-CSRFToken` header matching the
  `_csrf_token` cookie (double submit; dash-renderer sends it by itself).
"""

from __future__ import annotations

import html
import secrets
from typing import Any
from urllib.parse import urlencode

import flask

from monitor.domain import Principal, RunInfo
from monitor.errors import Unauthorized
from monitor.ports import DashboardPort

TOKEN_COOKIE = "lldmon_token"
CSRF_COOKIE = "_csrf_token"
CSRF_HEADER = "X-CSRFToken"
PUBLIC_PREFIXES = ("/_dash-component-suites/", "/_favicon.ico", "/assets/")
"""Static bundles shipped with Dash: no run data, served without a token."""


def current_principal() -> Principal:
    """The Principal of the request being handled (set by the before-request hook)."""
    principal = flask.g.get("lldmon_principal")
    if not isinstance(principal, Principal):
        raise Unauthorized("no authenticated principal for this request")
    return principal


def can_steer(principal: Principal, run: RunInfo) -> bool:
    """Directive controls: any caller when auth is off, else a token of the run's project."""
    return principal.unrestricted or principal.project_id == run.project_id


def install_auth(server: flask.Flask, state: DashboardPort, cookie_path: str) -> None:
    """Authenticate every request of the dashboard's Flask server (see the module docstring)."""

    @server.before_request
    def _authenticate() -> Any:
        if flask.request.path.startswith(PUBLIC_PREFIXES):
            return None
        once = flask.request.args.get("token")
        if once is not None:
            return _accept_token(state, once, cookie_path)
        header = flask.request.headers.get("Authorization")
        cookie = flask.request.cookies.get(TOKEN_COOKIE)
        try:
            if header is not None:
                principal = state.auth.authenticate(header)
            elif cookie:
                principal = state.auth.authenticate(f"Bearer {cookie}")
                if flask.request.method == "POST" and not _csrf_ok():
                    return _unauthorized("missing or wrong CSRF token: reload the page", cookie_path)
            else:
                principal = state.auth.authenticate(None)
        except Unauthorized as exc:
            return _unauthorized(exc.message, cookie_path, clear_cookie=bool(cookie))
        flask.g.lldmon_principal = principal
        return None

    @server.after_request
    def _csrf_cookie(response: flask.Response) -> flask.Response:
        if CSRF_COOKIE not in flask.request.cookies and flask.request.method == "GET":
            response.set_cookie(
                CSRF_COOKIE,
                secrets.token_urlsafe(24),
                samesite="Lax",
                path=cookie_path,
                secure=flask.request.is_secure,
            )
        return response


def _csrf_ok() -> bool:
    expected = flask.request.cookies.get(CSRF_COOKIE)
    sent = flask.request.headers.get(CSRF_HEADER)
    return bool(expected) and sent is not None and secrets.compare_digest(expected or "", sent)


def _accept_token(state: DashboardPort, token: str, cookie_path: str) -> Any:
    try:
        state.auth.authenticate(f"Bearer {token}")
    except Unauthorized as exc:
        return _unauthorized(exc.message, cookie_path, clear_cookie=True)
    rest = [(k, v) for k, v in flask.request.args.items(multi=True) if k != "token"]
    location = flask.request.script_root + flask.request.path + ("?" + urlencode(rest) if rest else "")
    response = flask.redirect(location, code=303)
    response.set_cookie(
        TOKEN_COOKIE, token, httponly=True, samesite="Lax", path=cookie_path, secure=flask.request.is_secure
    )
    return response


def _unauthorized(message: str, cookie_path: str, clear_cookie: bool = False) -> flask.Response:
    if flask.request.method == "GET" and "text/html" in flask.request.headers.get("Accept", ""):
        body = UNAUTHORIZED_PAGE.format(message=html.escape(message), prefix=html.escape(cookie_path))
        response = flask.Response(body, status=401, mimetype="text/html")
    else:
        response = flask.jsonify({"error": {"code": "unauthorized", "message": message}})
        response.status_code = 401
    response.headers["WWW-Authenticate"] = "Bearer"
    if clear_cookie:
        response.delete_cookie(TOKEN_COOKIE, path=cookie_path)
    return response


UNAUTHORIZED_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>lldmon: sign in</title>
<style>body{{font-family:system-ui,sans-serif;max-width:620px;margin:70px auto;color:#1f2328}}
code{{background:#f0f2f5;padding:2px 5px;border-radius:4px}}</style></head>
<body><h1>401: a token is needed</h1>
<p>{message}</p>
<p>This lldmon server has API tokens, so the dashboard needs one too. Open the dashboard once as
<code>{prefix}?token=lldm_...</code> (the token is then kept in a cookie) or send
<code>Authorization: Bearer lldm_...</code>. Create a token with <code>lldmon token create --project NAME</code>.</p>
</body></html>
"""

"""Coded domain errors. Services raise these; one handler in `monitor.api.errors` maps them to HTTP.

LLDMonError
├── NotFound            404  unknown run, token, ...
├── Unauthorized        401  missing or unknown bearer token while auth is on
├── Forbidden           403  token of another project
├── BadRequest          400  a malformed request (a Content-Length that is not a number)
├── InvalidInput        422  names the offending field
├── PayloadTooLarge     413  body over the configured limit
├── Conflict            409  concurrent update lost a race
└── ServiceUnavailable  503  database unreachable
"""

from __future__ import annotations


class LLDMonError(Exception):
    status_code = 500
    code = "internal_error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class NotFound(LLDMonError):
    status_code = 404
    code = "not_found"


class Unauthorized(LLDMonError):
    status_code = 401
    code = "unauthorized"


class Forbidden(LLDMonError):
    status_code = 403
    code = "forbidden"


class BadRequest(LLDMonError):
    status_code = 400
    code = "bad_request"


class InvalidInput(LLDMonError):
    status_code = 422
    code = "invalid_input"


class PayloadTooLarge(LLDMonError):
    status_code = 413
    code = "payload_too_large"


class Conflict(LLDMonError):
    status_code = 409
    code = "conflict"


class ServiceUnavailable(LLDMonError):
    status_code = 503
    code = "service_unavailable"

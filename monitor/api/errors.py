"""One place that maps domain and validation errors to HTTP responses; never leaks str(exc) of internals."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from contracts.wire import encode_json
from monitor.errors import LLDMonError

log = logging.getLogger("lldmon.api")


class ErrorResponse(JSONResponse):
    """JSON that renders whatever input an error echoes: non-ASCII as escapes (a lone surrogate
    cannot be encoded as UTF-8) and non-finite floats as their wire strings (strict JSON)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(
            encode_json(content), ensure_ascii=True, allow_nan=False, separators=(",", ":")
        ).encode()


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(LLDMonError)
    async def _domain(_request: Request, exc: LLDMonError) -> JSONResponse:
        if exc.status_code >= 500:
            log.warning("%s: %s", exc.code, exc.message, exc_info=exc.__cause__)
        headers = {"Retry-After": "1"} if exc.status_code == 503 else None
        return ErrorResponse(
            status_code=exc.status_code,
            content={"error": {"code": exc.code, "message": exc.message, "field": exc.field}},
            headers=headers,
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        field = ".".join(str(p) for p in first.get("loc", ()))
        message = f"{field}: {first.get('msg', 'invalid input')}" if field else "invalid input"
        return ErrorResponse(
            status_code=422,
            content={
                "error": {"code": "invalid_input", "message": message, "field": field or None},
                "detail": jsonable_encoder(errors, custom_encoder={Exception: str}),
            },
        )

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return ErrorResponse(
            status_code=500, content={"error": {"code": "internal_error", "message": "internal error"}}
        )

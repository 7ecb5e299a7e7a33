"""Request bodies under a size limit: for every route (`BodyLimitMiddleware`: JSON bodies, dashboard
callbacks) and, for ingest, read before holding it whole and gunzipped with the same limit."""

from __future__ import annotations

import zlib

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contracts.wire import MAX_BODY_HEADER
from monitor.api.errors import ErrorResponse
from monitor.errors import BadRequest, InvalidInput, LLDMonError, PayloadTooLarge


def declared_length(value: bytes | str | None) -> int | None:
    """The body length a request's Content-Length declares (None: no header), or BadRequest when it is
    not HTTP's 1*DIGIT: only ASCII digits count, as str.isdigit() is also true for '²', which int()
    refuses. Servers that parse the header themselves refuse such a request before it gets here; this
    keeps any other server, and in-process clients, from turning it into a 500."""
    if value is None:
        return None
    text = (value.decode("latin-1") if isinstance(value, bytes) else value).strip()
    if not (text.isascii() and text.isdigit()):
        raise BadRequest(f"Content-Length {text[:40]!r} is not a number of bytes", field="body")
    return int(text)


class BodyLimitMiddleware:
    """413 for a body over `limit` bytes: at once on its Content-Length, else as soon as the
    streamed (e.g. chunked) body passes the limit. Without it a route with a JSON body would buffer
    whatever an unauthenticated client sends (FastAPI reads the body before checking the token)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = self._announcing(send)
        try:
            declared = declared_length(dict(scope["headers"]).get(b"content-length"))
        except BadRequest as exc:
            await self._reject(scope, receive, send, exc)
            return
        if declared is not None and declared > self.limit:
            message = f"body of {declared} bytes exceeds the limit of {self.limit} bytes"
            await self._reject(scope, receive, send, PayloadTooLarge(message, field="body"))
            return
        received = 0
        started = rejected = False

        async def limited_receive() -> Message:
            nonlocal received, rejected
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    text = f"body exceeds the limit of {self.limit} bytes"
                    if not started and not rejected:
                        # Answer here: routes turn any error while parsing a JSON body into a 400.
                        rejected = True
                        await self._reject(scope, receive, send, PayloadTooLarge(text, field="body"))
                    raise PayloadTooLarge(text, field="body")  # stops the route reading on
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if rejected:  # the 413 is out: whatever the route makes of the aborted read is dropped
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except Exception:
            if not rejected:
                raise

    def _announcing(self, send: Send) -> Send:
        """`send` that names the limit on every response (`contracts.wire.MAX_BODY_HEADER`)."""
        header = (MAX_BODY_HEADER.encode(), str(self.limit).encode())

        async def announce(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        return announce

    @staticmethod
    async def _reject(scope: Scope, receive: Receive, send: Send, error: LLDMonError) -> None:
        response = ErrorResponse(
            status_code=error.status_code,
            content={"error": {"code": error.code, "message": error.message, "field": error.field}},
            headers={"Connection": "close"},  # the rest of the body is never read
        )
        await response(scope, receive, send)


async def read_limited_body(request: Request, limit: int) -> bytes:
    """The (decompressed) body, or PayloadTooLarge as soon as it is known to exceed `limit` bytes."""
    declared = declared_length(request.headers.get("content-length"))
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"body of {declared} bytes exceeds the limit of {limit} bytes", field="body")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body exceeds the limit of {limit} bytes", field="body")
        chunks.append(chunk)
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding != "gzip":
        raise InvalidInput(f"unsupported content-encoding {encoding!r}; use gzip or none", field="body")
    return _gunzip(body, limit)


def _gunzip(body: bytes, limit: int) -> bytes:
    decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = decompressor.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidInput(f"body is not valid gzip: {exc}", field="body") from None
    if len(out) > limit or decompressor.unconsumed_tail:
        raise PayloadTooLarge(f"decompressed body exceeds the limit of {limit} bytes", field="body")
    if not decompressor.eof:
        raise InvalidInput("gzip body is truncated", field="body")
    return out

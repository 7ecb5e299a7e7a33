"""Read a request body under a size limit, before holding it whole; gunzip with the same limit."""

from __future__ import annotations

import zlib

from starlette.requests import Request

from monitor.errors import InvalidInput, PayloadTooLarge


async def read_limited_body(request: Request, limit: int) -> bytes:
    """The (decompressed) body, or PayloadTooLarge as soon as it is known to exceed `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
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

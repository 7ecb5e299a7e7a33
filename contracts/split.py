"""Split an ingest body (`contracts.wire`) into parts whose encoded size stays under a byte limit.

The service refuses a body over `LLDMON_MAX_BODY_BYTES` (measured on the decompressed JSON) with
413. A batch is data the trainer produced once and cannot produce again, so the client (and
`lldmon sync`) split it rather than lose it: metrics by steps (one step with very many metrics by
names), actions by rows. Parts get batch ids derived from the original (uuid5 of id, index and
count), so splitting the same body the same way again gives the same ids and a repeated replay
stays idempotent on the service's batch ledger. Stdlib only: imported by both sides.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

__all__ = ["DEFAULT_MAX_BODY_BYTES", "encode_compact", "limit_from_error", "part_id", "split_body"]

DEFAULT_MAX_BODY_BYTES: Final = 4 * 1024 * 1024
"""What a client sends in one request unless the service said less: an eighth of the service's
default limit (32 MiB), so a service configured lower than its default is still met in most cases."""

_PART_NAMESPACE: Final = uuid.uuid5(uuid.NAMESPACE_URL, "lldmon:batch-part")
_LIMIT_RE: Final = re.compile(r"limit of (\d+) bytes")

Encode = Callable[[Any], bytes]


def encode_compact(body: Any) -> bytes:
    """Compact JSON, as `SpoolEntry.body_bytes` sends it (non-finite floats are strings already)."""
    return json.dumps(body, separators=(",", ":")).encode()


def part_id(batch_id: str, index: int, count: int) -> str:
    """Batch id of part `index` of `count`: deterministic, 32 hex characters whatever the depth."""
    return uuid.uuid5(_PART_NAMESPACE, f"{batch_id}:{index}/{count}").hex


def limit_from_error(message: str) -> int | None:
    """The byte limit a 413 of the service names ("... exceeds the limit of N bytes"), if any."""
    found = _LIMIT_RE.search(message or "")
    return int(found.group(1)) if found else None


def _bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous, nearly equal ranges covering range(n)."""
    edges = [round(i * n / parts) for i in range(parts + 1)]
    return [(a, b) for a, b in itertools.pairwise(edges) if b > a]


def _slices(kind: str, body: Mapping[str, Any], parts: int) -> list[dict[str, Any]]:
    """The body cut into `parts` pieces (without batch ids); [] if it cannot be cut."""
    if kind == "metrics":
        steps, metrics = body["steps"], body["metrics"]
        if len(steps) >= 2:
            return [
                {"steps": steps[a:b], "metrics": {name: col[a:b] for name, col in metrics.items()}}
                for a, b in _bounds(len(steps), min(parts, len(steps)))
            ]
        names = list(metrics)
        if len(names) >= 2:  # one step with very many metrics: split the names
            return [
                {"steps": steps, "metrics": {name: metrics[name] for name in names[a:b]}}
                for a, b in _bounds(len(names), min(parts, len(names)))
            ]
        return []
    columns = {k: v for k, v in body.items() if k != "batch_id" and isinstance(v, list)}
    n = len(next(iter(columns.values()), []))
    if n < 2 or any(len(col) != n for col in columns.values()):
        return []
    return [{k: col[a:b] for k, col in columns.items()} for a, b in _bounds(n, min(parts, n))]


def split_body(
    kind: str, body: Mapping[str, Any], max_bytes: int, encode: Encode = encode_compact
) -> list[tuple[dict[str, Any], bytes]]:
    """`body` as (part, encoded part) pairs, each encoding to at most `max_bytes` where possible.

    A body that fits is returned as it is (one pair). A part that cannot be cut further (one step
    and one metric, one action row) is returned even if it is over the limit: the service decides.
    Bodies of an unexpected shape are returned whole.
    """
    data = encode(body)
    if len(data) <= max_bytes:
        return [(dict(body), data)]
    parts = max(2, math.ceil(len(data) / max(1, max_bytes)))
    try:
        pieces = _slices(kind, body, parts)
    except (KeyError, TypeError, AttributeError):
        pieces = []
    if len(pieces) < 2:
        return [(dict(body), data)]
    batch_id = str(body.get("batch_id", ""))
    out: list[tuple[dict[str, Any], bytes]] = []
    for index, piece in enumerate(pieces):
        part = {"batch_id": part_id(batch_id, index, len(pieces)), **piece}
        out += split_body(kind, part, max_bytes, encode)
    return out

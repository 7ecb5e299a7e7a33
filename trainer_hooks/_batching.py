"""Coalesce queued `log()` / `log_actions()` records into columnar ingest bodies (`contracts.wire`).

Runs in the sender thread (or, when the queue is full, in the caller's thread for the overflow), so
values are converted here, not in `log()`: tensors and numpy scalars go through `float()` / `int()`
/ `.tolist()`. Structural problems (a metric name the service would refuse, action columns of
different lengths, values that are not numbers) are dropped here with a warning, so that one bad
name does not make the service reject a whole batch of good data; value ranges are left to the
service (the one authority on them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from contracts.metrics import metric_name_problem
from contracts.wire import ACTION_COLUMNS, ACTION_FLOAT_COLUMNS, ACTION_SOURCES, encode_float, encode_json
from lldmon_client import actions_body, metrics_body, new_batch_id
from lldmon_client.upload import Kind

_orjson_dumps: Callable[[Any], bytes] | None
try:
    from orjson import dumps as _orjson_dumps
except ImportError:  # pragma: no cover - orjson is optional in training images
    _orjson_dumps = None

Warn = Callable[..., object]
"""`warn(key, msg, *args)`: see `trainer_hooks._warn.WarnOnce`."""

INT_COLUMNS: Final = ("step", "traj_index", "action_index", "n_tokens")
FLOAT_COLUMNS: Final = ACTION_FLOAT_COLUMNS
REQUIRED_ACTION_COLUMNS: Final = ("traj_index", "action_index", "n_tokens", "delta", "is_answer")
"""`log_actions` needs these; `step` defaults to the step argument, `source` to "loss" and
`old_logp_mean` / `advantage` / `reward` to null (unknown)."""
DEFAULT_SOURCE: Final = ACTION_SOURCES[0]


@dataclass(slots=True)
class Record:
    """One `log()` (kind "metrics", payload name -> value) or `log_actions()` call (name -> column)."""

    kind: Kind
    step: int
    payload: dict[Any, Any]
    logged_ns: int = field(default_factory=time.time_ns)
    """When it was logged (wall clock): batches keep this order on disk, whoever writes them first."""


@dataclass(slots=True)
class Batch:
    """One ingest body and when its oldest record was logged (`contracts.spool` orders by that)."""

    kind: Kind
    body: dict[str, Any]
    order_ns: int


def dumps(obj: Any) -> bytes:
    """Compact JSON; orjson when available (optional in training images: json must do the same).

    Callers pass non-finite floats as the wire's strings already (`encode_float`; the run config
    through `encode_json`): orjson would write them as `null`. Should one slip through anyway, the
    json path spells it as a string too instead of failing on every retry.
    """
    if _orjson_dumps is not None:
        try:
            return _orjson_dumps(obj)
        except (TypeError, ValueError):  # e.g. an int over 64 bits: let json produce the error text
            pass
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:  # a non-finite float
        return json.dumps(encode_json(obj), separators=(",", ":"), allow_nan=False).encode()


def _wire_float(value: Any) -> float | str | None:
    """None stays None (not logged / unknown); anything else via float(), non-finite as strings."""
    if value is None:
        return None
    return encode_float(float(value))


def metrics_bodies(records: Iterable[Record], max_rows: int, warn: Warn) -> list[Batch]:
    """Metrics bodies of at most `max_rows` steps each.

    Records of the same step are merged (a later value of a name wins, as on the service); a name
    not logged at a step is null in that step's row.
    """
    rows: dict[int, dict[str, float | None]] = {}
    logged: dict[int, int] = {}
    for record in records:
        row = rows.setdefault(record.step, {})
        logged[record.step] = min(logged.get(record.step, record.logged_ns), record.logged_ns)
        for name, raw in record.payload.items():
            problem = metric_name_problem(name)
            if problem is not None:
                warn(("metric-name", repr(name)[:300]), "lldmon: dropping metric %r: %s", name, problem)
                continue
            try:
                row[name] = None if raw is None else float(raw)
            except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
                warn(
                    ("metric-value", name, type(raw).__name__),
                    "lldmon: dropping a value of metric %r (%s is not a number: %s)",
                    name,
                    type(raw).__name__,
                    exc,
                )
    steps = [s for s, row in rows.items() if row]
    bodies = []
    size = max(1, max_rows)
    for start in range(0, len(steps), size):
        chunk = steps[start : start + size]
        names: dict[str, None] = {}
        for step in chunk:
            names.update(dict.fromkeys(rows[step]))
        columns = {name: [rows[step].get(name) for step in chunk] for name in names}
        body = metrics_body(new_batch_id(), chunk, columns)
        bodies.append(Batch("metrics", body, min(logged[step] for step in chunk)))
    return bodies


def _as_list(column: Any) -> list[Any] | None:
    """A column as a list, or None for a scalar (tensors and arrays via `.tolist()`)."""
    if hasattr(column, "tolist") and not isinstance(column, (str, bytes)):
        column = column.tolist()
    if isinstance(column, (str, bytes, bool, int, float)) or column is None:
        return None
    return list(column)


def _convert(name: str, value: Any) -> Any:
    if name in INT_COLUMNS:
        return None if value is None else _int(value)
    if name in FLOAT_COLUMNS:
        return _wire_float(value)
    if name == "is_answer":
        return bool(value)
    return str(value)  # source


def _int(value: Any) -> int:
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{value!r} is not an integer")
        return int(value)
    return int(value)


def action_columns(record: Record, warn: Warn) -> dict[str, list[Any]] | None:
    """The record's columns in wire form (keys `ACTION_COLUMNS`), or None (warned) if malformed."""
    payload = record.payload
    unknown = sorted(str(k) for k in payload if k not in ACTION_COLUMNS)
    if unknown:
        warn(("action-unknown", tuple(unknown)), "lldmon: log_actions ignores unknown columns %s", unknown)
    missing = [c for c in REQUIRED_ACTION_COLUMNS if c not in payload]
    if missing:
        warn(("action-missing", tuple(missing)), "lldmon: log_actions call dropped: missing %s", missing)
        return None
    lists: dict[str, list[Any] | None] = {}
    try:
        for name in ACTION_COLUMNS:
            lists[name] = _as_list(payload[name]) if name in payload else None
    except (TypeError, ValueError, RuntimeError) as exc:
        warn(("action-column", type(exc).__name__), "lldmon: log_actions call dropped: %s", exc)
        return None
    n = len(lists["traj_index"] or [])
    lengths = {name: len(col) for name, col in lists.items() if col is not None}
    bad = {name: length for name, length in lengths.items() if length != n}
    if bad or any(lists[name] is None for name in REQUIRED_ACTION_COLUMNS):
        warn(
            ("action-lengths", tuple(sorted(bad))),
            "lldmon: log_actions call dropped: columns must be sequences of one length (%s)",
            lengths,
        )
        return None
    scalar_defaults: dict[str, Any] = {
        "step": payload.get("step", record.step),
        "source": payload.get("source", DEFAULT_SOURCE),
        "old_logp_mean": None,
        "advantage": None,
        "reward": None,
    }
    out: dict[str, list[Any]] = {}
    try:
        for name in ACTION_COLUMNS:
            column = lists[name]
            if column is None:
                out[name] = [_convert(name, scalar_defaults[name])] * n
            else:
                out[name] = [_convert(name, v) for v in column]
    except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
        warn(("action-value", name), "lldmon: log_actions call dropped: bad value in %r: %s", name, exc)
        return None
    return out


def actions_bodies(records: Iterable[Record], max_rows: int, warn: Warn) -> list[Batch]:
    """Action bodies of at most `max_rows` records each (a large call is split)."""
    merged: dict[str, list[Any]] = {name: [] for name in ACTION_COLUMNS}
    logged: list[int] = []  # per row
    for record in records:
        columns = action_columns(record, warn)
        if columns is None:
            continue
        for name in ACTION_COLUMNS:
            merged[name].extend(columns[name])
        logged.extend([record.logged_ns] * len(columns["step"]))
    n = len(merged["step"])
    size = max(1, max_rows)
    return [
        Batch(
            "actions",
            actions_body(new_batch_id(), {name: merged[name][i : i + size] for name in ACTION_COLUMNS}),
            min(logged[i : i + size]),
        )
        for i in range(0, n, size)
    ]


def build_bodies(records: list[Record], max_rows: int, warn: Warn) -> list[Batch]:
    """All bodies of `records`: metrics first, then actions."""
    metrics = metrics_bodies((r for r in records if r.kind == "metrics"), max_rows, warn)
    return metrics + actions_bodies((r for r in records if r.kind == "actions"), max_rows, warn)

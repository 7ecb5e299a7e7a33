"""Decode and validate columnar ingest batches (format: `contracts.wire`) with msgspec.

msgspec decodes and type-checks the whole body in C and names the failing path; what it cannot
check (equal column lengths, non-finite strings, metric names inside `metrics`) is checked here.
Every error is an `InvalidInput` naming the field, raised before anything is written.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

import msgspec

from contracts.metrics import metric_name_problem
from contracts.wire import ACTION_FLOAT_COLUMNS, BATCH_ID_MAX_LENGTH, NONFINITE_STRINGS
from monitor.domain import MAX_BIGINT, ActionColumns, MetricsColumns
from monitor.errors import InvalidInput
from monitor.surrogates import surrogates_escaped

BatchId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=BATCH_ID_MAX_LENGTH, pattern=r"^[A-Za-z0-9._:-]+$")
]
Step = Annotated[int, msgspec.Meta(ge=0, le=MAX_BIGINT)]
Index = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
Value = float | str | None


class MetricsBatchWire(msgspec.Struct, forbid_unknown_fields=True):
    """Step metrics: `metrics[name][i]` is the value of `name` at `steps[i]`; null = not logged."""

    batch_id: BatchId
    steps: list[Step]
    metrics: dict[str, list[Value]]


# Fields: `batch_id` and `contracts.wire.ACTION_COLUMNS` in that order, spelled out for their types
# (tests/test_action_columns.py checks the names). The docstring is the OpenAPI schema's description.
class ActionsBatchWire(msgspec.Struct, forbid_unknown_fields=True):
    """Per-action records, one array per column, all of the same length."""

    batch_id: BatchId
    step: list[Step]
    traj_index: list[Index]
    action_index: list[Index]
    n_tokens: list[Index]
    delta: list[Value]
    old_logp_mean: list[Value]
    advantage: list[Value]
    reward: list[Value]
    is_answer: list[bool]
    source: list[Literal["loss", "probe"]]


class CombinedBatchWire(msgspec.Struct, forbid_unknown_fields=True):
    """A metrics batch and an actions batch in one request, each with its own `batch_id`."""

    metrics: MetricsBatchWire
    actions: ActionsBatchWire


_METRICS_DECODER = msgspec.json.Decoder(MetricsBatchWire)
_ACTIONS_DECODER = msgspec.json.Decoder(ActionsBatchWire)
_COMBINED_DECODER = msgspec.json.Decoder(CombinedBatchWire)


def decode_metrics(body: bytes) -> tuple[str, MetricsColumns]:
    return _metrics_columns(_decode(body, _METRICS_DECODER, MetricsBatchWire))


def decode_actions(body: bytes) -> tuple[str, ActionColumns]:
    return _action_columns(_decode(body, _ACTIONS_DECODER, ActionsBatchWire))


def decode_combined(body: bytes) -> tuple[tuple[str, MetricsColumns], tuple[str, ActionColumns]]:
    wire = _decode(body, _COMBINED_DECODER, CombinedBatchWire)
    return _metrics_columns(wire.metrics, "metrics."), _action_columns(wire.actions, "actions.")


def _metrics_columns(wire: MetricsBatchWire, path: str = "") -> tuple[str, MetricsColumns]:
    """`wire` checked and in the storage encoding; `path` prefixes the fields errors name."""
    n = len(wire.steps)
    steps: list[int] = []
    names: list[str] = []
    values: list[float | None] = []
    for name, column in wire.metrics.items():
        field = f"{path}metrics.{name}"
        problem = metric_name_problem(name)
        if problem is not None:
            raise InvalidInput(problem, field=surrogates_escaped(field))
        if len(column) != n:
            raise InvalidInput(f"has {len(column)} values but {path}steps has {n}", field=field)
        for step, raw in zip(wire.steps, column, strict=True):
            if raw is None:
                continue
            steps.append(step)
            names.append(name)
            values.append(_to_storage(raw, field))
    batch = MetricsColumns(steps=steps, names=names, values=values)
    if len(set(wire.steps)) != n:
        batch = _dedupe_metrics(batch)
    return wire.batch_id, batch


def _action_columns(wire: ActionsBatchWire, path: str = "") -> tuple[str, ActionColumns]:
    """`wire` checked and in the storage encoding; `path` prefixes the fields errors name."""
    n = len(wire.step)
    for column in ActionColumns.__dataclass_fields__:
        length = len(getattr(wire, column))
        if length != n:
            raise InvalidInput(f"has {length} values but {path}step has {n}", field=path + column)
    floats = {name: _float_column(getattr(wire, name), path + name) for name in ACTION_FLOAT_COLUMNS}
    batch = ActionColumns(
        step=wire.step,
        traj_index=wire.traj_index,
        action_index=wire.action_index,
        n_tokens=wire.n_tokens,
        delta=floats["delta"],
        old_logp_mean=floats["old_logp_mean"],
        advantage=floats["advantage"],
        reward=floats["reward"],
        is_answer=wire.is_answer,
        source=list(wire.source),
    )
    return wire.batch_id, _dedupe_actions(batch)


def request_schemas() -> dict[str, Any]:
    """JSON schemas of the three batch bodies, for the OpenAPI document."""
    (metrics, actions, combined), components = msgspec.json.schema_components(
        [MetricsBatchWire, ActionsBatchWire, CombinedBatchWire], ref_template="#/components/schemas/{name}"
    )
    return {"metrics": metrics, "actions": actions, "combined": combined, "components": components}


def _decode(body: bytes, decoder: msgspec.json.Decoder[Any], kind: type[Any]) -> Any:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise InvalidInput(str(exc), field=_path_of(exc)) from None
    except msgspec.DecodeError as exc:
        # Python's json accepts the NaN / Infinity / -Infinity tokens that strict JSON parsers reject.
        try:
            obj = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise InvalidInput(f"body is not valid JSON: {exc}", field="body") from None
        try:
            return msgspec.convert(obj, kind)
        except msgspec.ValidationError as exc2:
            raise InvalidInput(str(exc2), field=_path_of(exc2)) from None


def _path_of(exc: msgspec.ValidationError) -> str:
    message = str(exc)
    marker = " - at `$."
    if marker in message:
        return message.split(marker, 1)[1].rstrip("`")
    if "field `" in message:
        return message.split("field `", 1)[1].split("`", 1)[0]
    return "body"


def _float_column(column: list[float | str | None], name: str) -> list[float | None]:
    """A float column in the storage encoding. The usual column (finite numbers only) is returned as
    it is after one C-speed pass (`math.fsum` raises on a string or None and is not finite with a
    NaN or an infinity); any other goes value by value, the field named only on an error."""
    try:
        if math.isfinite(math.fsum(column)):  # type: ignore[arg-type]
            return column  # type: ignore[return-value]
    except (TypeError, OverflowError):
        pass
    return [None if v is None else _to_storage(v, name, i) for i, v in enumerate(column)]


def _to_storage(raw: float | str, field: str, index: int | None = None) -> float | None:
    """Finite and infinite floats as they are; NaN as None (the storage encoding of NaN). `field`
    (with `index`, `name[index]`) names the value in an error."""
    if isinstance(raw, str):
        try:
            value = NONFINITE_STRINGS[raw]
        except KeyError:
            where = field if index is None else f"{field}[{index}]"
            raise InvalidInput(
                f"expected a number, null or one of {sorted(NONFINITE_STRINGS)}, got {raw!r}", field=where
            ) from None
    else:
        value = raw
    return None if math.isnan(value) else value


def _dedupe_metrics(batch: MetricsColumns) -> MetricsColumns:
    """A step listed twice in one batch: the later value wins, as for a resumed run."""
    latest: dict[tuple[str, int], float | None] = {}
    for name, step, value in zip(batch.names, batch.steps, batch.values, strict=True):
        latest[(name, step)] = value
    return MetricsColumns(
        steps=[s for _, s in latest], names=[n for n, _ in latest], values=list(latest.values())
    )


def _dedupe_actions(batch: ActionColumns) -> ActionColumns:
    keys = list(zip(batch.step, batch.source, batch.traj_index, batch.action_index, strict=True))
    if len(set(keys)) == len(keys):
        return batch
    last = {key: i for i, key in enumerate(keys)}
    keep = sorted(last.values())
    return ActionColumns(
        **{name: [getattr(batch, name)[i] for i in keep] for name in ActionColumns.__dataclass_fields__}
    )

"""The ingest bodies of `contracts.wire`, built in one place, and their batch ids.

A batch id is what makes a re-sent body a duplicate on the service's batch ledger rather than a
second copy. Senders that can send the same data again after a restart (`lldmon watch`, `lldmon
import --url`) derive it from what identifies the data (`stable_batch_id`); a trainer's batch is
sent once and spooled with its id, so a random one does (`new_batch_id`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from contracts.wire import ACTION_COLUMNS, encode_float

__all__ = ["actions_body", "masked", "metrics_body", "new_batch_id", "stable_batch_id"]


def new_batch_id() -> str:
    """A random batch id (32 hex characters)."""
    return uuid.uuid4().hex


def stable_batch_id(namespace: str, key: str, prefix: str = "") -> str:
    """`prefix` and the uuid5 of `key` in the namespace named `namespace`: the same key gives the same
    id in every process and version."""
    return prefix + uuid.uuid5(uuid.uuid5(uuid.NAMESPACE_URL, namespace), key).hex


def _wire(value: float | None) -> float | str | None:
    return None if value is None else encode_float(float(value))


def metrics_body(
    batch_id: str, steps: Iterable[int], metrics: Mapping[str, Iterable[float | None]]
) -> dict[str, Any]:
    """A metrics body: `steps` and one column per name, as long as `steps`, None where the name was
    not logged at that step; non-finite values become the wire's strings.

    Raises ValueError naming a column whose length is not the number of steps.
    """
    step_list = [int(step) for step in steps]
    columns = {str(name): [_wire(value) for value in column] for name, column in metrics.items()}
    for name, column in columns.items():
        if len(column) != len(step_list):
            raise ValueError(f"metric {name!r} has {len(column)} values for {len(step_list)} steps")
    return {"batch_id": batch_id, "steps": step_list, "metrics": columns}


def masked(values: Iterable[Any], present: Iterable[Any]) -> list[float | None]:
    """A column from values and a parallel mask of which were logged (numpy arrays or lists): the
    value where the mask is true, None elsewhere."""
    return [float(value) if bool(logged) else None for value, logged in zip(values, present, strict=True)]


def actions_body(batch_id: str, columns: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """An actions body: `batch_id` and every column of `contracts.wire.ACTION_COLUMNS`, in that order.

    Raises ValueError naming a missing column, or columns of different lengths.
    """
    missing = [name for name in ACTION_COLUMNS if name not in columns]
    if missing:
        raise ValueError(f"action columns missing: {missing}")
    lengths = {name: len(columns[name]) for name in ACTION_COLUMNS}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"action columns must be of one length, got {lengths}")
    return {"batch_id": batch_id, **{name: list(columns[name]) for name in ACTION_COLUMNS}}

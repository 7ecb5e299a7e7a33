"""One definition of the action columns, `contracts.wire.ACTION_COLUMNS`: the places that must spell the
names out for their types (the wire model, the domain batch, the block codec, the dtype tables of the
export and the history reader) name exactly those columns."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from contracts.wire import ACTION_COLUMNS, ACTION_FLOAT_COLUMNS
from monitor.api.wire import ActionsBatchWire
from monitor.domain import ActionColumns
from monitor.services import export
from monitor.store.action_codec import FLOAT_FIELDS, Block
from trainer_hooks.history import ACTION_DTYPES as HISTORY_DTYPES

KEY = ("step", "source")
"""A block is the records of one (step, source): it holds every other column."""

# (spelled-out names, the columns they must be, whether the order must match too)
SPELLINGS: dict[str, tuple[Sequence[str], Sequence[str], bool]] = {
    # the order of the wire model's fields is the order of the OpenAPI schema's properties
    "api wire model": (
        [n for n in ActionsBatchWire.__struct_fields__ if n != "batch_id"],
        ACTION_COLUMNS,
        True,
    ),
    "domain batch": ([f.name for f in dataclasses.fields(ActionColumns)], ACTION_COLUMNS, True),
    # the codec's column order is its storage format's own (`ACTION_FIELDS`, guarded by a version byte)
    "codec block": (
        [f.name for f in dataclasses.fields(Block)],
        [c for c in ACTION_COLUMNS if c not in KEY],
        False,
    ),
    "codec floats": (FLOAT_FIELDS, ACTION_FLOAT_COLUMNS, False),
    "export dtypes": (list(export.ACTION_DTYPES), ACTION_COLUMNS, False),
    "export arrow types": (list(export._ARROW_TYPES), ACTION_COLUMNS, False),
    "history reader dtypes": (list(HISTORY_DTYPES), ACTION_COLUMNS, False),
    "float columns": (ACTION_FLOAT_COLUMNS, [c for c in ACTION_COLUMNS if c in ACTION_FLOAT_COLUMNS], True),
}


@pytest.mark.parametrize("place", sorted(SPELLINGS))
def test_spelled_out_action_columns_are_the_wire_columns(place: str) -> None:
    names, expected, ordered = SPELLINGS[place]
    assert len(set(names)) == len(names)
    if ordered:
        assert list(names) == list(expected)
    else:
        assert sorted(names) == sorted(expected)

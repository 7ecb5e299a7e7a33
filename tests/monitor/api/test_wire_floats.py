"""The action decoder's float columns: a fast path for the usual all-finite column that must give the
same storage encoding as the value-by-value path (NaN -> None, +-inf kept, wire strings mapped, a bad
value named with its index)."""

from __future__ import annotations

import json
import math

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from monitor.api.wire import decode_actions
from monitor.errors import InvalidInput


def body(delta: list[object], raw: bool = False) -> bytes:
    n = len(delta)
    batch = {
        "batch_id": "b",
        "step": [1] * n,
        "traj_index": list(range(n)),
        "action_index": [0] * n,
        "n_tokens": [3] * n,
        "delta": delta,
        "old_logp_mean": [-0.5] * n,
        "advantage": [1] * n,  # JSON integers are numbers too
        "reward": [None] * n,
        "is_answer": [False] * n,
        "source": ["loss"] * n,
    }
    return json.dumps(batch).encode() if raw else orjson.dumps(batch)


def test_usual_and_unusual_columns() -> None:
    _, batch = decode_actions(body([0.5, -1e-30, 3.0]))
    assert batch.delta == [0.5, -1e-30, 3.0] and batch.advantage == [1.0, 1.0, 1.0]
    assert batch.reward == [None, None, None]
    _, batch = decode_actions(body([0.5, "NaN", "Infinity", "-Infinity", None, 1e308, 1e308]))
    assert batch.delta[:5] == [0.5, None, math.inf, -math.inf, None]
    assert batch.delta[5:] == [1e308, 1e308]  # their sum overflows: the slow path keeps them as they are
    _, batch = decode_actions(body([float("nan"), float("inf")], raw=True))  # Python json's NaN token
    assert batch.delta == [None, math.inf]
    with pytest.raises(InvalidInput) as exc:
        decode_actions(body([0.1, 0.2, "nan?"]))
    assert exc.value.field == "delta[2]"


@given(
    st.lists(
        st.one_of(
            st.floats(allow_nan=False, allow_infinity=False),
            st.none(),
            st.sampled_from(["NaN", "Infinity", "-Infinity"]),
        ),
        max_size=30,
    )
)
def test_fast_path_equals_value_by_value(values: list[object]) -> None:
    _, batch = decode_actions(body(values))
    expected = [
        None if v is None or v == "NaN" else {"Infinity": math.inf, "-Infinity": -math.inf}.get(v, v)  # type: ignore[call-overload]
        for v in values
    ]
    assert batch.delta == expected

"""The action block codec: lossless round trips, merges and summaries against naive references, and
clear errors on corrupt payloads."""

from __future__ import annotations

import json
import math
import struct
import zlib
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.store import action_codec as codec
from monitor.store.action_codec import (
    ACTION_FIELDS,
    SUMMARY_LEVELS,
    Block,
    block_from_columns,
    concat_columns,
    decode_block,
    encode_block,
    merge_blocks,
    summarize,
)

INT64 = st.integers(-(2**63), 2**63 - 1)
ANY_FLOAT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, 0.1, 1e-310, 3.4e38, 1e300]),
    st.floats(width=32),
    st.none(),
)
RECORD = st.tuples(
    st.one_of(st.integers(0, 20), INT64),
    st.one_of(st.integers(0, 5), INT64),
    st.one_of(st.integers(0, 300), INT64),
    ANY_FLOAT,
    ANY_FLOAT,
    ANY_FLOAT,
    ANY_FLOAT,
    st.booleans(),
)


def columns_of(records: list[tuple[Any, ...]]) -> dict[str, list[Any]]:
    return {name: [r[i] for r in records] for i, name in enumerate(ACTION_FIELDS)}


def reference(records: list[tuple[Any, ...]]) -> dict[tuple[int, int], tuple[Any, ...]]:
    """The naive model: a dict keyed by (traj_index, action_index), later records overwrite."""
    latest: dict[tuple[int, int], tuple[Any, ...]] = {}
    for r in records:
        latest[(r[0], r[1])] = r
    return dict(sorted(latest.items()))


def assert_block_is(block: Block, expected: dict[tuple[int, int], tuple[Any, ...]]) -> None:
    rows = list(expected.values())
    assert len(block) == len(rows)
    for i, name in enumerate(ACTION_FIELDS):
        column = getattr(block, name)
        want = [r[i] for r in rows]
        if name in codec.FLOAT_FIELDS:
            assert column.dtype == np.float64
            want_arr = np.asarray(want, dtype=np.float64)
            assert_same_floats(column, want_arr)
        elif name == "is_answer":
            assert column.dtype == bool and column.tolist() == want
        else:
            assert column.dtype == np.int64 and column.tolist() == want


def assert_same_floats(got: np.ndarray, want: np.ndarray) -> None:
    """Bit-identical, except that any NaN equals any NaN (NaN stands for 'missing')."""
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite].view(np.uint64), want[finite].view(np.uint64))


@settings(max_examples=300, deadline=None)
@given(st.lists(RECORD, max_size=60))
def test_block_from_columns_round_trips_through_the_codec(records: list[tuple[Any, ...]]) -> None:
    block = block_from_columns(columns_of(records))
    assert_block_is(block, reference(records))
    decoded = decode_block(encode_block(block))
    assert_block_is(decoded, reference(records))
    json.dumps(summarize(block), allow_nan=False)  # storable as JSON on PostgreSQL, whatever the values


@settings(max_examples=200, deadline=None)
@given(st.lists(RECORD, max_size=40), st.lists(RECORD, max_size=40))
def test_merge_is_the_union_and_new_records_win(old: list[Any], new: list[Any]) -> None:
    merged = merge_blocks(block_from_columns(columns_of(old)), block_from_columns(columns_of(new)))
    assert_block_is(merged, reference(old + new))


def test_merge_on_random_steps_matches_a_dict() -> None:
    rng = np.random.default_rng(1)
    for _ in range(50):
        batches = []
        for _ in range(int(rng.integers(1, 5))):
            n = int(rng.integers(0, 200))
            batches.append(
                [
                    (
                        int(rng.integers(0, 40)),
                        int(rng.integers(0, 6)),
                        int(rng.integers(1, 500)),
                        float(rng.normal()),
                        float(np.float32(rng.normal())),
                        None if rng.random() < 0.1 else float(rng.normal()),
                        float(rng.integers(0, 2)),
                        bool(rng.random() < 0.3),
                    )
                    for _ in range(n)
                ]
            )
        block = codec.empty_block()
        for batch in batches:
            block = decode_block(encode_block(merge_blocks(block, block_from_columns(columns_of(batch)))))
        assert_block_is(block, reference([r for batch in batches for r in batch]))


def test_empty_block_round_trips() -> None:
    block = block_from_columns({name: [] for name in ACTION_FIELDS})
    assert len(block) == 0
    assert len(decode_block(encode_block(block))) == 0
    assert summarize(block)["all"] == {"n": 0, "q": [None] * len(SUMMARY_LEVELS)}


def test_float32_exact_columns_are_stored_as_float32_others_as_float64() -> None:
    block = codec.search_r1_step(np.random.default_rng(0), n_records=100)
    narrow = len(encode_block(block))
    wide = block_from_columns({**vars(block), "delta": block.delta + 1e-12})
    assert len(encode_block(wide)) > narrow + 300  # 100 records x 4 more bytes, barely compressible
    assert_same_floats(decode_block(encode_block(wide)).delta, wide.delta)


def test_search_r1_step_is_under_12_bytes_per_record_before_row_overhead() -> None:
    blocks = [codec.search_r1_step(np.random.default_rng(seed)) for seed in range(5)]
    size = sum(len(encode_block(b)) for b in blocks)
    assert size / sum(len(b) for b in blocks) < 12


def test_summary_matches_numpy_and_pandas_quantiles() -> None:
    rng = np.random.default_rng(2)
    block = codec.search_r1_step(rng, n_records=1000)
    delta = block.delta.copy()
    delta[:7] = [math.nan, math.inf, -math.inf, math.nan, 0.5, -0.5, math.nan]
    advantage = block.advantage.copy()
    advantage[10:20] = math.nan
    block = block_from_columns({**vars(block), "delta": delta, "advantage": advantage})
    summary = summarize(block)
    assert summary["levels"] == list(SUMMARY_LEVELS)
    finite = pd.Series(delta[np.isfinite(delta)])
    assert summary["all"]["n"] == len(finite) == 1000 - 5
    np.testing.assert_allclose(summary["all"]["q"], finite.quantile(list(SUMMARY_LEVELS)).to_numpy())
    pos = pd.Series(delta[np.isfinite(delta) & (advantage > 0)])
    assert summary["pos"]["n"] == len(pos) > 0
    np.testing.assert_allclose(summary["pos"]["q"], np.quantile(pos.to_numpy(), SUMMARY_LEVELS))
    assert all(isinstance(v, float) for v in summary["all"]["q"])


def test_summary_without_positive_advantages_has_nulls() -> None:
    block = block_from_columns(
        columns_of([(0, 0, 1, 0.5, 0.0, -1.0, 0.0, False), (1, 0, 1, math.nan, 0.0, 1.0, 1.0, True)])
    )
    summary = summarize(block)
    assert summary["all"] == {"n": 1, "q": [0.5] * len(SUMMARY_LEVELS)}
    assert summary["pos"] == {"n": 0, "q": [None] * len(SUMMARY_LEVELS)}


@pytest.mark.parametrize("big", [1.7e308, np.finfo(np.float64).max])
def test_summary_of_huge_deltas_stays_finite_and_ordered(big: float) -> None:
    """numpy's linear quantile overflows on b - a here; a summary must still be valid JSON numbers."""
    block = block_from_columns(
        columns_of([(0, 0, 1, -big, 0.0, 1.0, 0.0, False), (1, 0, 1, big, 0.0, 1.0, 0.0, False)])
    )
    q = summarize(block)["all"]["q"]
    assert all(math.isfinite(v) for v in q) and q == sorted(q)
    np.testing.assert_allclose(q, [-big * (1 - 2 * p) for p in SUMMARY_LEVELS], rtol=1e-12)


def test_concat_columns_repeats_step_and_source_per_record() -> None:
    a = block_from_columns(
        columns_of([(1, 0, 3, 0.1, 0.2, 0.3, 0.4, True), (0, 0, 3, 0.1, 0.2, 0.3, 0.4, False)])
    )
    b = block_from_columns(columns_of([(5, 1, 3, 0.1, 0.2, 0.3, 0.4, True)]))
    out = concat_columns([(7, "loss", a), (9, "probe", b)])
    assert out["step"].tolist() == [7, 7, 9]
    assert out["source"].tolist() == ["loss", "loss", "probe"]
    assert out["traj_index"].tolist() == [0, 1, 5]
    assert out["is_answer"].tolist() == [False, True, True]
    empty = concat_columns([])
    assert set(empty) == {"step", "source", *ACTION_FIELDS}
    assert all(len(v) == 0 for v in empty.values())


def test_missing_column_is_a_value_error() -> None:
    columns = columns_of([(0, 0, 1, 0.1, 0.1, 0.1, 0.1, True)])
    del columns["reward"]
    with pytest.raises(ValueError, match="reward"):
        block_from_columns(columns)


def _valid_payload() -> bytes:
    return encode_block(codec.search_r1_step(np.random.default_rng(3), n_records=50))


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda p: p[:5], "too short"),
        (lambda p: b"XXXX" + p[4:], "magic"),
        (lambda p: p[:4] + bytes([99]) + p[5:], "version 99"),
        (lambda p: p[:9] + bytes([77]) + p[10:], "traj_index.*type code 77"),
        (lambda p: p[:5] + struct.pack("<I", 51) + p[9:], "51 records"),
        (lambda p: p[:-4], "truncated"),
        (lambda p: p + b"junk", "body"),
        (lambda p: p[: codec._HEADER.size] + b"\x00" * 20, "does not inflate"),
    ],
)
def test_corrupt_payload_is_a_clear_value_error(corrupt: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_block(corrupt(_valid_payload()))


def test_unsorted_body_is_reported_as_corrupt() -> None:
    payload = _valid_payload()
    header = payload[: codec._HEADER.size]
    n = struct.unpack_from("<I", payload, 5)[0]
    body = bytearray(zlib.decompress(payload[codec._HEADER.size :]))
    body[:n] = bytes([3] + [0] * (n - 1))  # traj_index differences: the first trajectory repeated
    with pytest.raises(ValueError, match="not sorted"):
        decode_block(header + zlib.compress(bytes(body)))


def test_block_fields_are_the_wire_columns_without_the_block_key() -> None:
    """One set of names: a block holds every wire column except its key (step, source); the order is
    the format's own (a version byte guards it)."""
    from contracts.wire import ACTION_COLUMNS
    from monitor.store.action_codec import ACTION_FIELDS

    assert sorted(ACTION_FIELDS) == sorted(set(ACTION_COLUMNS) - {"step", "source"})

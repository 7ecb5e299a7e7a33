"""Property tests of the ingest wire format (`contracts.wire`, `monitor.api.wire`) and an ingest round
trip through the in-process API.

What is stored is defined in README "Ingest wire format": null = not logged (no row); NaN and +-inf are
data, stored faithfully and returned as the strings "NaN" / "Infinity" / "-Infinity"; a step logged
again, inside one batch or in a later batch, keeps the later value; a re-sent batch id stores nothing.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.metrics import MAX_METRIC_NAME_LENGTH
from contracts.wire import API_PREFIX, NONFINITE_STRINGS, decode_float, encode_float, encode_json
from monitor.api.wire import decode_metrics
from monitor.errors import InvalidInput
from tests.monitor.api.helpers import history, new_run

pytestmark = pytest.mark.timeout(120)

# Valid metric names: any text but control characters and lone surrogates (utf-8 cannot encode them),
# 1..MAX characters (`contracts.metrics.metric_name_problem`).
names = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")),
    min_size=1,
    max_size=MAX_METRIC_NAME_LENGTH,
)
values = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 5e-324, -0.0, 0.0]),
)
steps = st.integers(min_value=0, max_value=2**63 - 1)


def same(a: float | None, b: float | None) -> bool:
    """Equality with NaN == NaN and the sign of zero."""
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1, a) == math.copysign(1, b)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_encode_decode_float_round_trip_and_strict_json(x: float) -> None:
    wire = encode_float(x)
    assert same(decode_float(wire), x)
    json.dumps(wire, allow_nan=False)  # never a bare NaN / Infinity token
    assert isinstance(wire, str) == (not math.isfinite(x))


free_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(free_json)
def test_encode_json_is_strict_and_keeps_every_float(value: Any) -> None:
    """Config, evidence and error details: strict JSON, with each float recoverable by decode_float."""
    wire = encode_json(value)
    assert json.loads(json.dumps(wire, allow_nan=False)) == wire

    def check(original: Any, encoded: Any) -> None:
        if isinstance(original, float):
            assert same(decode_float(encoded), original)
        elif isinstance(original, dict):
            assert list(encoded) == list(original)
            for key in original:
                check(original[key], encoded[key])
        elif isinstance(original, list):
            for a, b in zip(original, encoded, strict=True):
                check(a, b)
        else:
            assert encoded == original

    check(value, wire)


@given(st.text().filter(lambda s: s not in NONFINITE_STRINGS))
def test_decode_float_refuses_other_strings_by_name(s: str) -> None:
    with pytest.raises(ValueError, match="expected a number"):
        decode_float(s)


@st.composite
def metrics_batches(draw: st.DrawFn, max_steps: int = 40) -> dict[str, Any]:
    """A valid batch: repeated steps allowed, columns with null / non-finite values."""
    batch_steps = draw(st.lists(st.one_of(steps, st.integers(0, 5)), max_size=max_steps))
    metric_names = draw(st.lists(names, max_size=4, unique=True))
    metrics = {
        name: draw(st.lists(values, min_size=len(batch_steps), max_size=len(batch_steps)))
        for name in metric_names
    }
    return {"batch_id": uuid.uuid4().hex, "steps": batch_steps, "metrics": metrics}


def to_json(batch: dict[str, Any], nonfinite_as: str) -> bytes:
    """The batch as sent: non-finite values as JSON tokens (NaN, Infinity) or as strings."""
    if nonfinite_as == "strings":
        batch = {
            **batch,
            "metrics": {
                n: [None if v is None else encode_float(v) for v in col]
                for n, col in batch["metrics"].items()
            },
        }
    return json.dumps(batch, allow_nan=nonfinite_as == "tokens").encode()


def expected_points(batches: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
    """(name, step) -> value after applying the batches in order: later wins, null = nothing."""
    out: dict[tuple[str, int], float] = {}
    for batch in batches:
        for name, column in batch["metrics"].items():
            for step, value in zip(batch["steps"], column, strict=True):
                if value is not None:
                    out[(name, step)] = value
    return out


@settings(max_examples=300, deadline=None)
@given(metrics_batches(), st.sampled_from(["tokens", "strings"]))
def test_decode_metrics_keeps_every_logged_point_once_later_wins(batch: dict[str, Any], form: str) -> None:
    batch_id, columns = decode_metrics(to_json(batch, form))
    assert batch_id == batch["batch_id"]
    got = list(zip(columns.names, columns.steps, columns.values, strict=True))
    assert len({(n, s) for n, s, _ in got}) == len(got), "a (name, step) twice in what is written"
    expected = expected_points([batch])
    assert {(n, s) for n, s, _ in got} == set(expected)
    for name, step, value in got:
        # storage encoding: NaN is NULL (SQLite cannot hold NaN), +-inf as they are
        want = expected[(name, step)]
        assert (value is None) if math.isnan(want) else same(value, want)


@given(
    st.one_of(
        st.just(""),
        st.text(min_size=MAX_METRIC_NAME_LENGTH + 1, max_size=MAX_METRIC_NAME_LENGTH + 20),
        st.tuples(st.text(max_size=5), st.text(max_size=5)).map(lambda t: t[0] + "\x00" + t[1]),
        st.tuples(st.text(max_size=5), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)).map(
            "".join
        ),
    )
)
def test_names_the_server_must_refuse_are_invalid_input_naming_the_metric(name: str) -> None:
    raw = json.dumps({"batch_id": "b", "steps": [0], "metrics": {"ok": [1.0], name: [1.0]}}).encode()
    with pytest.raises(InvalidInput) as info:
        decode_metrics(raw)
    assert info.value.field is not None and info.value.field.startswith("metrics.")
    assert info.value.status_code == 422


@pytest.mark.parametrize("literal", [b"1e400", b"-1e400", str(10**400).encode(), b"true", b'"nan"', b"{}"])
def test_values_no_float_can_hold_are_refused(literal: bytes) -> None:
    with pytest.raises(InvalidInput):
        decode_metrics(b'{"batch_id": "b", "steps": [0], "metrics": {"a": [' + literal + b"]}}")


# --- round trip through the in-process API (SQLite, PostgreSQL when configured) ----------------------


def stored(client: TestClient, run_id: int) -> dict[tuple[str, int], Any]:
    return {
        (name, step): value
        for name, series in history(client, run_id).items()
        for step, value in zip(series["steps"], series["values"], strict=True)
    }


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(metrics_batches(max_steps=15), min_size=1, max_size=3),
    st.sampled_from(["tokens", "strings"]),
    st.booleans(),
)
def test_ingest_round_trip_later_wins_across_batches_and_resend_is_a_no_op(
    client: TestClient, batches: list[dict[str, Any]], form: str, resend_first: bool
) -> None:
    run_id = new_run(client, uuid.uuid4().hex)
    url = f"{API_PREFIX}/runs/{run_id}/metrics"
    for batch in batches:
        response = client.post(
            url, content=to_json(batch, form), headers={"content-type": "application/json"}
        )
        assert response.status_code == 200, response.text
        ack = response.json()
        assert ack["duplicate"] is False
        assert ack["rows"] == len(expected_points([batch]))
    if resend_first:  # a lost acknowledgement: the same batch again is a no-op
        ack = client.post(url, content=to_json(batches[0], form)).json()
        assert ack["duplicate"] is True
        # other values under the same batch id are refused (409), never silently dropped
        again = {**batches[0], "metrics": {n: [0.5] * len(c) for n, c in batches[0]["metrics"].items()}}
        same = decode_metrics(to_json(again, "tokens")) == decode_metrics(to_json(batches[0], "tokens"))
        assert client.post(url, content=to_json(again, form)).status_code == (200 if same else 409)
    expected = {key: encode_float(value) for key, value in expected_points(batches).items()}
    got = stored(client, run_id)
    assert got.keys() == expected.keys()
    for key, value in got.items():
        want = expected[key]
        # -0.0 comes back as 0.0 (SQLite stores an integral REAL as an integer): equal, not identical
        assert value == want if isinstance(want, str) else (isinstance(value, float) and value == want), (
            key,
            value,
            want,
        )


def test_empty_batches_are_acknowledged_and_store_nothing(client: TestClient) -> None:
    run_id = new_run(client)
    for body in (
        {"batch_id": "e1", "steps": [], "metrics": {}},
        {"batch_id": "e2", "steps": [], "metrics": {"a": []}},
        {"batch_id": "e3", "steps": [1, 2], "metrics": {"a": [None, None]}},
        {"batch_id": "e4", "steps": [1, 2], "metrics": {}},
    ):
        ack = client.post(f"{API_PREFIX}/runs/{run_id}/metrics", json=body).json()
        assert (ack["rows"], ack["duplicate"]) == (0, False), body
    assert history(client, run_id) == {}
    assert client.get(f"{API_PREFIX}/runs/{run_id}/metric-names").json() == []


def test_a_large_batch_is_stored_whole(client: TestClient) -> None:
    """25k steps x 2 metrics (~0.9 MiB of JSON, under the 1 MiB test limit), NaN and inf inside."""
    run_id = new_run(client)
    n = 25_000
    a = [float(i) for i in range(n)]
    b = ["NaN" if i % 997 == 0 else "-Infinity" if i % 991 == 0 else i / 3 for i in range(n)]
    body = {"batch_id": "big", "steps": list(range(n)), "metrics": {"a": a, "b": b}}
    response = client.post(f"{API_PREFIX}/runs/{run_id}/metrics", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["rows"] == 2 * n
    series = history(client, run_id)
    assert series["a"]["values"] == a
    assert series["b"]["values"][:998:997] == ["NaN", "NaN"] and series["b"]["values"][991] == "-Infinity"
    assert len(series["b"]["steps"]) == n

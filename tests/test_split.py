"""contracts.split: bodies cut under a byte limit without losing, reordering or duplicating a value."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from contracts import split


def metrics_body(n_steps: int, width: int, batch_id: str = "b-1") -> dict[str, Any]:
    return {
        "batch_id": batch_id,
        "steps": list(range(10, 10 + n_steps)),
        "metrics": {
            f"m{i}": [s * 1.5 + i if (s + i) % 5 else None for s in range(n_steps)] for i in range(width)
        },
    }


def merged_points(parts: list[tuple[dict[str, Any], bytes]]) -> dict[tuple[str, int], Any]:
    out: dict[tuple[str, int], Any] = {}
    for body, raw in parts:
        assert json.loads(raw) == body  # the encoding that goes out is the part itself
        for name, column in body["metrics"].items():
            for step, value in zip(body["steps"], column, strict=True):
                assert (name, step) not in out, "a value sent twice"
                out[(name, step)] = value
    return out


@pytest.mark.parametrize(("n_steps", "width", "limit"), [(300, 20, 4000), (1, 2000, 3000), (50, 3, 100)])
def test_parts_fit_and_cover_the_body_exactly(n_steps: int, width: int, limit: int) -> None:
    body = metrics_body(n_steps, width)
    parts = split.split_body("metrics", body, limit)
    assert len(parts) > 1
    for part, raw in parts:  # over the limit only where nothing is left to cut
        assert len(raw) <= limit or (len(part["steps"]) == 1 and len(part["metrics"]) == 1)
    assert merged_points(parts) == merged_points([(body, json.dumps(body, separators=(",", ":")).encode())])
    ids = [p["batch_id"] for p, _ in parts]
    assert len(set(ids)) == len(ids) and "b-1" not in ids and all(len(i) == 32 for i in ids)
    assert [p["batch_id"] for p, _ in split.split_body("metrics", body, limit)] == ids  # deterministic


def test_a_body_that_fits_is_left_alone_and_a_single_value_is_not_cut() -> None:
    body = metrics_body(3, 2)
    assert split.split_body("metrics", body, 10_000) == [(body, split.encode_compact(body))]
    single = {"batch_id": "one", "steps": [1], "metrics": {"x" * 500: [1.0]}}
    assert [p for p, _ in split.split_body("metrics", single, 100)] == [single]
    odd = {"batch_id": "odd", "steps": "not a list", "metrics": 3}
    assert [p for p, _ in split.split_body("metrics", odd, 10)] == [odd]


def test_action_bodies_are_cut_by_rows() -> None:
    n = 500
    body: dict[str, Any] = {
        "batch_id": "a-1",
        "step": [7] * n,
        "traj_index": list(range(n)),
        "action_index": [0] * n,
        "n_tokens": [3] * n,
        "delta": ["NaN" if i % 9 == 0 else -i / 7 for i in range(n)],
        "old_logp_mean": [None] * n,
        "advantage": [1.0] * n,
        "reward": [None] * n,
        "is_answer": [i % 2 == 0 for i in range(n)],
        "source": ["probe"] * n,
    }
    parts = split.split_body("actions", body, 5000)
    assert len(parts) > 1 and all(len(raw) <= 5000 for _, raw in parts)
    for column in body:
        if column != "batch_id":
            assert [v for p, _ in parts for v in p[column]] == body[column]


def test_limit_from_error_reads_the_services_413_message() -> None:
    assert split.limit_from_error("decompressed body exceeds the limit of 65536 bytes (field body)") == 65536
    assert split.limit_from_error("body of 99 bytes exceeds the limit of 10 bytes") == 10
    assert split.limit_from_error("<html>413 Request Entity Too Large</html>") is None
    assert split.DEFAULT_MAX_BODY_BYTES < 32 * 1024 * 1024  # under the service's default limit


def test_split_module_is_stdlib_only() -> None:
    roots = set()
    for node in ast.walk(ast.parse(Path(split.__file__).read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    assert roots - {"__future__"} <= set(sys.stdlib_module_names)

"""`lldmon export --actions`: one row per action record, read in pages (a step may span several),
NaN/inf kept; CSV, Parquet and JSON lines; from the database and over a live server's API, on SQLite
and PostgreSQL."""

from __future__ import annotations

import io
import json
import math
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from monitor.api.app import build_state
from monitor.cli import app
from monitor.config import Settings
from monitor.domain import Principal
from monitor.errors import InvalidInput
from monitor.services.export import (
    ACTION_COLUMNS,
    ExportService,
    action_arrays,
    action_pages,
    actions_csv,
    actions_jsonl,
)
from tests.conftest import live_server_on
from tests.live_server import LiveServer
from tests.without_extras import lldmon_without

runner = CliRunner()
NAN, INF = math.nan, math.inf
OPEN = Principal()
FLOATS = ("delta", "old_logp_mean", "advantage", "reward")
Key = tuple[int, str, int, int]


def records(step: int, n: int, source: str = "loss", seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(step * 100 + seed)
    out = []
    for i in range(n):
        delta: float | None = float(np.float32(rng.normal()))
        if (step + i) % 5 == 0:
            delta = [NAN, INF, -INF, None][(step + i) % 4]
        out.append(
            {
                "step": step,
                "source": source,
                "traj_index": i // 3,
                "action_index": i % 3,
                "n_tokens": int(rng.integers(1, 90)),
                "delta": delta,
                "old_logp_mean": -INF if i == 2 else float(rng.normal()) / 3,
                "advantage": NAN if i == 4 else float(rng.choice([-1.0, 0.0, 1.0])),
                "reward": INF if i == 1 else float(i % 2),
                "is_answer": i % 3 == 2,
            }
        )
    return out


def body(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def wire(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        return v

    names = ["step", "source", "traj_index", "action_index", "n_tokens", *FLOATS, "is_answer"]
    return {"batch_id": uuid.uuid4().hex, **{n: [wire(r[n]) for r in rows] for n in names}}


# Steps 0-11 (no records at step 6), 0-11 records per step; step 5 arrives in two batches with one
# record re-sent (the later value wins); step 7 has both sources.
BATCHES = [
    [r for s in range(12) if s not in (5, 6) for r in records(s, 11 - s if s != 3 else 9)],
    records(5, 6)[:4],
    [*records(5, 6)[4:], {**records(5, 6)[0], "delta": 123.5}],
    records(7, 5, "probe", seed=1),
]


def expected_frame() -> pd.DataFrame:
    """What the export must hold, built the obvious way from what was sent."""
    latest: dict[Key, dict[str, Any]] = {}
    for batch in BATCHES:
        for r in batch:
            latest[(r["step"], r["source"], r["traj_index"], r["action_index"])] = r
    rows = [latest[k] for k in sorted(latest)]
    frame = pd.DataFrame(rows, columns=list(ACTION_COLUMNS))
    for name in FLOATS:
        frame[name] = frame[name].astype("float64")  # None -> NaN
    return frame.astype(
        {"step": "int64", "traj_index": "int64", "action_index": "int64", "n_tokens": "int64"}
    )


def assert_same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    got = got.reset_index(drop=True)
    assert list(got.columns) == list(ACTION_COLUMNS)
    for name in ACTION_COLUMNS:
        if name in FLOATS:  # NaN, +inf and -inf where they were sent
            g, w = got[name].to_numpy(np.float64), want[name].to_numpy(np.float64)
            assert np.array_equal(g, w, equal_nan=True), name
        else:
            assert got[name].tolist() == want[name].tolist(), name


class Served:
    def __init__(self, live: LiveServer, run_id: int) -> None:
        self.live, self.run_id = live, run_id
        self.local = (
            ["--database-url", live.database_url] if live.database_url else ["--data-dir", str(live.data_dir)]
        )
        self.remote = ["--url", live.url]


@pytest.fixture(scope="module")
def served(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with live_server_on(backend, tmp_path_factory.mktemp(f"export-actions-{backend}")) as live:
        run = httpx.post(f"{live.api}/runs", json={"name": "acts", "project": "nq"}).json()
        httpx.post(f"{live.api}/runs", json={"name": "empty", "project": "nq"}).raise_for_status()
        for batch in BATCHES:
            reply = httpx.post(f"{live.api}/runs/{run['id']}/actions", json=body(batch), timeout=30)
            assert reply.status_code == 200, reply.text
        yield Served(live, int(run["id"]))


@pytest.fixture
def exporter(served: Served) -> Iterator[ExportService]:
    live = served.live
    state = build_state(Settings(database_url=live.database_url, data_dir=live.data_dir))
    yield ExportService(state.query)
    state.db.dispose()


def lldmon(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


def keys_of(page: dict[str, Any]) -> list[Key]:
    return list(
        zip(
            page["step"].tolist(),
            page["source"].tolist(),
            page["traj_index"].tolist(),
            page["action_index"].tolist(),
            strict=True,
        )
    )


def test_pages_cover_every_record_once_in_key_order(exporter: ExportService, served: Served) -> None:
    want = expected_frame()
    for page_records in (1, 3, 8, 11, 12, 50, 200_000):
        pages = list(exporter.action_pages(OPEN, served.run_id, page_records=page_records))
        assert all(0 < p["step"].size <= page_records for p in pages), page_records
        keys = [k for p in pages for k in keys_of(p)]
        assert keys == sorted(set(keys)), page_records  # strictly increasing across page boundaries
        got = pd.DataFrame({n: np.concatenate([p[n] for p in pages]) for n in ACTION_COLUMNS})
        assert_same(got, want)
    window = list(exporter.action_pages(OPEN, served.run_id, 4, 8, "loss", page_records=5))
    got = pd.DataFrame({n: np.concatenate([p[n] for p in window]) for n in ACTION_COLUMNS})
    assert_same(got, want[want["step"].between(4, 8) & (want["source"] == "loss")])
    assert list(exporter.action_pages(OPEN, served.run_id, 6, 6)) == []


STORED: dict[str, list[Any]] = {
    "step": [0] * 6 + [1] * 2,
    "source": ["loss"] * 4 + ["probe"] * 2 + ["loss"] * 2,
    "traj_index": [0, 0, 1, 1, 0, 1, 0, 0],
    "action_index": [0, 1, 0, 1, 0, 0, 0, 1],
}


def fake_reader(calls: list[tuple[Any, ...]], *, honours_cursor: bool) -> Any:
    """GET /actions over STORED; `honours_cursor=False` is a service older than the cursor."""

    def read(lo: int | None, hi: int | None, src: str | None, limit: int, after: Any) -> dict[str, Any]:
        calls.append((lo, hi, src, limit, after))
        rows = list(zip(*(STORED[c] for c in ("step", "source", "traj_index", "action_index")), strict=True))
        keep = [
            i
            for i, key in enumerate(rows)
            if (lo is None or key[0] >= lo)
            and (hi is None or key[0] <= hi)
            and src in (None, key[1])
            and (not honours_cursor or after is None or key > tuple(after))
        ][:limit]
        cols = {c: [STORED[c][i] for i in keep] for c in STORED}
        return cols | {c: [0] * len(keep) for c in ACTION_COLUMNS if c not in cols}

    return read


def test_a_step_larger_than_a_page_is_read_in_parts() -> None:
    """Each read goes on after the last record's key, inside a step too: no per-step read limit."""
    calls: list[tuple[Any, ...]] = []
    pages = list(action_pages(fake_reader(calls, honours_cursor=True), None, None, None, page_records=3))
    assert [keys_of(p) for p in pages] == [
        [(0, "loss", 0, 0), (0, "loss", 0, 1), (0, "loss", 1, 0)],
        [(0, "loss", 1, 1), (0, "probe", 0, 0), (0, "probe", 1, 0)],
        [(1, "loss", 0, 0), (1, "loss", 0, 1)],
    ]
    assert [(c[0], tuple(c[4]) if c[4] else None) for c in calls] == [
        (None, None),
        (0, (0, "loss", 1, 0)),
        (0, (0, "probe", 1, 0)),
    ]
    with pytest.raises(InvalidInput, match="page_records"):
        list(action_pages(fake_reader([], honours_cursor=True), None, None, None, page_records=0))


def test_a_service_that_ignores_the_cursor_is_read_while_its_steps_are_smaller_than_a_page() -> None:
    """A service older than the cursor answers from the start of the cursor's step: the records up to
    the cursor are dropped, so nothing is read twice; a step larger than a page is then an error, not
    a loop."""
    old = fake_reader([], honours_cursor=False)
    pages = list(action_pages(old, None, None, None, page_records=7))
    assert [k for p in pages for k in keys_of(p)] == list(
        zip(*(STORED[c] for c in ("step", "source", "traj_index", "action_index")), strict=True)
    )
    with pytest.raises(InvalidInput, match="cannot read a step in parts"):
        list(action_pages(old, None, None, None, page_records=3))


def read_jsonl(text: str) -> pd.DataFrame:
    rows = [json.loads(line) for line in text.splitlines()]
    frame = pd.DataFrame(rows, columns=list(ACTION_COLUMNS))
    for name in FLOATS:
        frame[name] = [float(v) for v in frame[name]]  # "NaN", "Infinity", "-Infinity" as the API
    return frame


@pytest.mark.parametrize("mode", ["local", "remote"])
def test_export_round_trips_in_every_format(served: Served, tmp_path: Path, mode: str) -> None:
    where = served.local if mode == "local" else served.remote
    want = expected_frame()
    run = str(served.run_id)
    files = {fmt: tmp_path / f"a.{fmt}" for fmt in ("csv", "parquet", "jsonl")}
    for fmt, path in files.items():  # the format from the suffix
        code, out = lldmon("export", run, "--actions", "-o", str(path), *where)
        assert code == 0, out
        assert f"{len(want)} action records over 10 steps ({fmt})" in out
    text = files["csv"].read_text()
    assert text.startswith(",".join(ACTION_COLUMNS) + "\n0,loss,0,0,")
    assert ",nan," in text and ",inf," in text and ",-inf," in text and ",true\n" in text
    assert_same(pd.read_csv(files["csv"]), want)
    assert_same(pd.read_parquet(files["parquet"]), want)
    schema = pq.read_schema(files["parquet"])
    assert str(schema.field("delta").type) == "double" and str(schema.field("is_answer").type) == "bool"
    assert json.loads(schema.metadata[b"lldmon"]) == {"run_id": served.run_id, "run": "acts", "project": "nq"}
    assert_same(read_jsonl(files["jsonl"].read_text()), want)

    code, out = lldmon(
        "export", "acts", "--project", "nq", "--actions", "-o", "-", "--step-min", "3", "--step-max", "7",
        "--source", "loss", *where,
    )  # fmt: skip
    assert code == 0, out
    assert_same(pd.read_csv(io.StringIO(out)), want[want["step"].between(3, 7) & (want["source"] == "loss")])
    code, out = lldmon("export", run, "--actions", "-f", "jsonl", "-o", "-", "--step-min", "7", *where)
    assert code == 0, out
    assert_same(read_jsonl(out), want[want["step"] >= 7])
    empty = tmp_path / "empty.parquet"
    code, out = lldmon("export", "empty", "--actions", "-o", str(empty), *where)
    assert code == 0 and "0 action records over 0 steps" in out, out
    assert pq.read_table(empty).num_rows == 0 and pq.read_schema(empty).names == list(ACTION_COLUMNS)


def test_local_and_remote_exports_are_the_same_bytes(served: Served, tmp_path: Path) -> None:
    for fmt in ("csv", "jsonl"):
        a, b = (
            lldmon("export", str(served.run_id), "--actions", "-f", fmt, "-o", "-", *served.local),
            lldmon("export", str(served.run_id), "--actions", "-f", fmt, "-o", "-", *served.remote),
        )
        assert a == b and a[0] == 0


def test_action_export_errors_leave_no_file(served: Served, tmp_path: Path) -> None:
    run = str(served.run_id)
    target = tmp_path / "out.csv"
    for args, message in (
        (["-f", "xlsx"], "--format must be csv, parquet or jsonl"),
        (["-m", "reward/mean"], "--metrics selects metrics"),
        (["--source", "both"], "--source must be loss or probe"),
        (["--step-min", "5", "--step-max", "4"], "--step-min (5) is after --step-max (4)"),
    ):
        code, out = lldmon("export", run, "--actions", "-o", str(target), *args, *served.local)
        assert code == 2 and message in out, (args, out)
    code, out = lldmon("export", run, "--source", "loss", "-o", str(target), *served.local)
    assert code == 2 and "need --actions" in out, out
    code, out = lldmon("export", run, "--actions", "-f", "jsonl", "-o", str(target), *served.local)
    assert code == 0, out  # jsonl into a .csv name: the format option wins
    target.unlink()
    code, out = lldmon("export", run, "-f", "jsonl", "-o", str(target), *served.local)
    assert code == 2 and "--format must be csv or parquet" in out, out  # metrics have no jsonl
    code, out = lldmon("export", run, "--actions", "-f", "parquet", "-o", "-", *served.local)
    assert code == 2 and "only CSV or JSON lines can go to stdout" in out, out
    for where in (served.local, served.remote):
        code, out = lldmon("export", "999999", "--actions", "-o", "-", *where)
        assert code == 1 and "run 999999 does not exist" in out, out
        code, out = lldmon("export", "999999", "--actions", "-o", str(target), *where)
        assert code == 1 and "run 999999 does not exist" in out, out
    assert list(tmp_path.iterdir()) == []


def test_text_lines_without_pyarrow_hold_the_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    tricky = [0.1, float(np.float32(0.1)), 1e-300, -0.0, 1e22, 1e15, 1e-5, 1.0, NAN, INF, -INF, 5e-324, 1 / 3]
    n = len(tricky)
    page = action_arrays(
        {
            "step": list(range(n)),
            "source": ["loss", "probe"] * (n // 2) + ["loss"],
            "traj_index": [2**62] * n,
            "action_index": [0] * n,
            "n_tokens": [7] * n,
            **{name: tricky for name in FLOATS},
            "is_answer": [True, False] * (n // 2) + [True],
        }
    )
    with_arrow = actions_csv(page), actions_jsonl(page)
    with monkeypatch.context() as patched:
        patched.setitem(sys.modules, "pyarrow", None)  # as if not installed
        without = actions_csv(page), actions_jsonl(page)
    header = ",".join(ACTION_COLUMNS) + "\n"
    for csv_text in (with_arrow[0], without[0]):
        frame = pd.read_csv(io.StringIO(header + csv_text))
        assert_same(frame, pd.DataFrame({n: page[n] for n in ACTION_COLUMNS}))
        assert np.signbit(frame["delta"][3]) and frame["reward"].dtype == np.float64
    for jsonl in (with_arrow[1], without[1]):
        assert_same(read_jsonl(jsonl), pd.DataFrame({n: page[n] for n in ACTION_COLUMNS}))
        assert all(type(json.loads(line)["delta"]) in (float, str) for line in jsonl.splitlines())


def test_csv_export_needs_no_pyarrow(served: Served) -> None:
    result = lldmon_without("pyarrow", "export", str(served.run_id), "--actions", "-o", "-", *served.local)
    assert result.returncode == 0, result.stdout + result.stderr
    assert_same(pd.read_csv(io.StringIO(result.stdout)), expected_frame())

"""contracts.spool: file format, oldest-first order, size policy, corrupt files, replay outcomes."""

from __future__ import annotations

import ast
import gzip
import random
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from contracts import spool
from contracts.spool import Outcome, RunIdentity, SpoolEntry

pytestmark = pytest.mark.timeout(30)

RUN = RunIdentity(
    run_name="grpo-3b", project="nq", config={"lr": 1e-6, "nested": {"a": [1, 2]}}, tags=("grpo",)
)


def entry(i: int, run: RunIdentity = RUN, kind: spool.Kind = "metrics", pad: int = 0) -> SpoolEntry:
    """A small batch; `pad` adds that many incompressible values (for size tests)."""
    metrics: dict[str, list[object]] = {"x": [float(i)], "g": ["Infinity"]}
    if pad:
        rng = random.Random(i)
        metrics["pad"] = [rng.random() for _ in range(pad)]
    return SpoolEntry(run=run, kind=kind, body={"batch_id": f"b{i:04d}", "steps": [i], "metrics": metrics})


def ids(directory: Path) -> list[str]:
    return [e.batch_id for e in spool.iter_entries(directory)]


def test_roundtrip_keeps_identity_kind_and_exact_body_oldest_first(tmp_path: Path) -> None:
    written = [
        spool.write_entry(tmp_path, entry(i, kind="actions" if i == 2 else "metrics")) for i in range(5)
    ]
    assert all(w.kept and w.entry.path is not None and w.entry.path.exists() for w in written)
    entries = list(spool.iter_entries(tmp_path))
    assert [e.batch_id for e in entries] == ["b0000", "b0001", "b0002", "b0003", "b0004"]
    first = entries[0]
    assert first.run == RUN
    assert first.kind == "metrics" and entries[2].kind == "actions"
    assert first.body == {"batch_id": "b0000", "steps": [0], "metrics": {"x": [0.0], "g": ["Infinity"]}}
    assert first.path is not None and first.path.name.endswith("-b0000.json.gz")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        e.path.name for e in entries if e.path
    ]  # no temp files
    assert spool.spool_size(tmp_path) == (5, sum(e.size() for e in entries))


def test_files_are_gzip_json_and_names_are_safe(tmp_path: Path) -> None:
    odd = SpoolEntry(run=RUN, kind="metrics", body={"batch_id": "a:b/c", "steps": [], "metrics": {}})
    path = spool.write_entry(tmp_path, odd).entry.path
    assert path is not None and path.parent == tmp_path and "/" not in path.name[20:]
    doc = gzip.decompress(path.read_bytes())
    assert b'"format":"lldmon-spool"' in doc and b'"batch_id":"a:b/c"' in doc
    assert spool.read_entry(path).batch_id == "a:b/c"


def test_iter_skips_and_reports_corrupt_files_and_ignores_others(tmp_path: Path) -> None:
    spool.write_entry(tmp_path, entry(1))
    bad = {
        "00000000000000000001-trunc.json.gz": gzip.compress(b'{"format": "lldmon-spool", "ver')[:-5],
        "00000000000000000002-notgzip.json.gz": b"hello",
        "00000000000000000003-notspool.json.gz": gzip.compress(b'{"a": 1}'),
        "00000000000000000004-version.json.gz": gzip.compress(b'{"format": "lldmon-spool", "version": 9}'),
        "00000000000000000005-nobody.json.gz": gzip.compress(
            b'{"format": "lldmon-spool", "version": 1, "kind": "metrics", "run": {"run_name": "r"}}'
        ),
    }
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / ".tmp-x.part").write_bytes(b"partial")
    (tmp_path / "notes.txt").write_text("not an entry")
    (tmp_path / spool.REJECTED_DIR).mkdir()
    spool.write_entry(tmp_path / spool.REJECTED_DIR, entry(99))
    reported: list[str] = []
    got = list(spool.iter_entries(tmp_path, on_corrupt=lambda p, exc: reported.append(p.name)))
    assert [e.batch_id for e in got] == ["b0001"]
    assert sorted(reported) == sorted(bad)


def test_size_limit_drops_oldest_first_and_reports_it(tmp_path: Path) -> None:
    sizes = []
    for i in range(4):
        report = spool.write_entry(tmp_path, entry(i, pad=50))
        assert report.kept and report.dropped_batches == 0
        sizes.append(report.entry.size())
    limit = sum(sizes[1:]) + sizes[0] // 2  # the 4 fit only without the oldest
    report = spool.write_entry(tmp_path, entry(4, pad=50), max_bytes=limit)
    assert report.kept
    assert report.dropped_batches == 2 and report.dropped_bytes == sizes[0] + sizes[1]
    assert ids(tmp_path) == ["b0002", "b0003", "b0004"]
    assert spool.spool_size(tmp_path)[1] <= limit


def test_entry_larger_than_the_limit_is_not_kept_and_drops_nothing_else(tmp_path: Path) -> None:
    spool.write_entry(tmp_path, entry(0))
    small = spool.spool_size(tmp_path)[1]
    report = spool.write_entry(tmp_path, entry(1, pad=5000), max_bytes=small + 100)
    assert not report.kept and report.dropped_batches == 1
    assert ids(tmp_path) == ["b0000"]


def scripted(outcomes: dict[str, Outcome], seen: list[str]) -> Callable[[SpoolEntry], Outcome]:
    def send(e: SpoolEntry) -> Outcome:
        seen.append(e.batch_id)
        return outcomes.get(e.batch_id, "ok")

    return send


def test_replay_sends_oldest_first_deletes_ok_keeps_rejected_stops_at_retry(tmp_path: Path) -> None:
    for i in range(6):
        spool.write_entry(tmp_path, entry(i))
    seen: list[str] = []
    report = spool.replay(tmp_path, scripted({"b0001": "reject", "b0003": "retry"}, seen))
    assert seen == ["b0000", "b0001", "b0002", "b0003"]
    assert report == spool.ReplayReport(sent=2, rejected=1, corrupt=0, remaining=3, stopped=True)
    assert ids(tmp_path) == ["b0003", "b0004", "b0005"]
    assert ids(tmp_path / spool.REJECTED_DIR) == ["b0001"]
    seen.clear()
    report = spool.replay(tmp_path, scripted({}, seen))
    assert seen == ["b0003", "b0004", "b0005"]
    assert report.sent == 3 and report.remaining == 0 and not report.stopped
    assert ids(tmp_path / spool.REJECTED_DIR) == ["b0001"]  # rejected entries are not replayed


def test_replay_survives_a_raising_transport_and_corrupt_files(tmp_path: Path) -> None:
    spool.write_entry(tmp_path, entry(0))
    (tmp_path / "00000000000000000000-junk.json.gz").write_bytes(b"junk")
    spool.write_entry(tmp_path, entry(1))

    def send(e: SpoolEntry) -> Outcome:
        if e.batch_id == "b0001":
            raise ConnectionError("boom")
        return "ok"

    report = spool.replay(tmp_path, send)
    assert report.sent == 1 and report.corrupt == 1 and report.remaining == 1 and report.stopped
    assert report.error == "ConnectionError: boom"
    assert (tmp_path / spool.CORRUPT_DIR / "00000000000000000000-junk.json.gz").exists()


def test_replay_honours_should_stop(tmp_path: Path) -> None:
    for i in range(3):
        spool.write_entry(tmp_path, entry(i))
    seen: list[str] = []
    report = spool.replay(tmp_path, scripted({}, seen), should_stop=lambda: len(seen) >= 2)
    assert seen == ["b0000", "b0001"] and report.stopped and report.remaining == 1


def test_rejected_dir_is_bounded_too(tmp_path: Path) -> None:
    for i in range(5):
        spool.write_entry(tmp_path, entry(i, pad=50))
    one = spool.spool_size(tmp_path)[1] // 5
    spool.replay(tmp_path, lambda e: "reject", rejected_max_bytes=2 * one + one // 2)
    assert ids(tmp_path / spool.REJECTED_DIR) == ["b0003", "b0004"]


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, "ok"),
        (201, "ok"),
        (400, "reject"),
        (413, "reject"),
        (422, "reject"),
        (401, "retry"),
        (403, "retry"),
        (404, "retry"),
        (408, "retry"),
        (429, "retry"),
        (500, "retry"),
        (502, "retry"),
        (503, "retry"),
        (504, "retry"),
    ],
)
def test_outcome_for_status(status: int, outcome: str) -> None:
    assert spool.outcome_for_status(status) == outcome


def test_find_spool_dirs_skips_rejected_and_corrupt(tmp_path: Path) -> None:
    for sub in ("nq/run-a", "nq/run-b", "nq/run-a/rejected", "hotpot/run-c/corrupt"):
        spool.write_entry(tmp_path / sub, entry(0))
    (tmp_path / "empty").mkdir()
    found = [p.relative_to(tmp_path).as_posix() for p in spool.find_spool_dirs(tmp_path)]
    assert found == ["nq/run-a", "nq/run-b"]


def test_spool_module_is_stdlib_only() -> None:
    path = Path(spool.__file__)
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    # the stdlib and the other stdlib-only contracts (one name per concept: FINISH_STATUSES is wire's)
    assert roots - {"__future__", "contracts"} <= set(sys.stdlib_module_names)


def test_entries_sort_by_when_their_data_was_logged_not_when_written(tmp_path: Path) -> None:
    """Issue 16 #11: a batch held up by retries is written after newer overflow; it must still sort
    (replay, and be dropped by the size limit) before that newer data."""
    base = 1_700_000_000_000_000_000
    for i in (3, 4, 5):
        spool.write_entry(tmp_path, entry(i, pad=50), order_ns=base + i)
    late = spool.write_entry(tmp_path, entry(1, pad=50), order_ns=base + 1)  # written last, logged first
    assert ids(tmp_path) == ["b0001", "b0003", "b0004", "b0005"]
    one = late.entry.size()
    report = spool.write_entry(tmp_path, entry(2, pad=50), order_ns=base + 2, max_bytes=3 * one + one // 2)
    assert ids(tmp_path) == ["b0003", "b0004", "b0005"]  # the oldest data went: steps 1 and 2
    assert report.dropped_batches == 2 and not report.kept
    spool.write_entry(tmp_path, entry(6))  # no order given: now, i.e. the newest
    assert ids(tmp_path)[-1] == "b0006"


def test_finish_markers_roundtrip_replace_and_are_found(tmp_path: Path) -> None:
    other = RunIdentity(run_name="other", project=None)
    path = spool.write_finish(tmp_path / "a", RUN, "finished")
    spool.write_finish(tmp_path / "a", RUN, "failed")  # the later status replaces the earlier
    spool.write_finish(tmp_path / "a", other, "crashed")
    found = {(run.run_name, status) for _, run, status in spool.read_finishes(tmp_path / "a")}
    assert found == {("grpo-3b", "failed"), ("other", "crashed")}
    assert next(r for _, r, _ in spool.read_finishes(tmp_path / "a") if r.run_name == "grpo-3b") == RUN
    assert path.name.startswith("finish-") and not list((tmp_path / "a").glob(".tmp-*"))
    assert list(spool.iter_entries(tmp_path / "a")) == []  # markers are not batches
    with pytest.raises(ValueError, match="status"):
        spool.write_finish(tmp_path / "a", RUN, "running")
    spool.write_entry(tmp_path / "b" / spool.REJECTED_DIR, entry(0))  # only rejected batches left
    (tmp_path / "c").mkdir()
    found_dirs = [p.relative_to(tmp_path).as_posix() for p in spool.find_spool_dirs(tmp_path)]
    assert found_dirs == ["a", "b"]
    spool.remove_finish(tmp_path / "a", RUN)
    spool.remove_finish(tmp_path / "a", RUN)  # already gone: no error
    assert [r.run_name for _, r, _ in spool.read_finishes(tmp_path / "a")] == ["other"]
    (tmp_path / "a" / "finish-0123456789abcdef.json").write_text("{not json")
    assert [r.run_name for _, r, _ in spool.read_finishes(tmp_path / "a")] == ["other"]  # warned, skipped

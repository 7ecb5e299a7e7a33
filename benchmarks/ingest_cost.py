"""Server CPU per ingest request, in process: this tree against another checkout, side by side.

What one Search-R1-sized step costs the service outside the detector: `POST /runs/{id}/metrics` (one
step of every canonical metric, `benchmarks._workload`) and `POST /runs/{id}/actions` (`--records`
action records, default 2,560), bodies pre-encoded as the hooks send them (uncompressed JSON). Each
request goes straight into the real ASGI app (`monitor.api.app.create_app`: middleware, routing,
auth, body reading, decoding, the ingest transaction, the acknowledgement), with no HTTP server and
no client in between, so the CPU it takes is the server's: the process CPU time across the request
(every thread; with SQLite the database's work too) and, on PostgreSQL, the CPU of the app's backends
over each block of requests. The detector pass (`DetectionService.process`) is replaced by one that
returns the default directive: its cost is measured by `benchmarks.detector_pass`.

Each round runs every tree in a fresh interpreter (`python -P` this file, `PYTHONPATH=<tree>`, so
`monitor` comes from that tree) on a fresh database: `--warmup` steps, then `--steps` measured
steps. The trees' order rotates every round, so machine noise hits them alike. Reported per backend,
tree and request kind: the median over the rounds of each round's median CPU ms per request, and
the ratio baseline / this tree (of those medians, and the median of the per-round ratios).

`--protocol combined` sends this tree's steps as one `POST /runs/{id}/combined` each (what the hooks
send) while the baseline keeps the two requests; with `--baseline .` that isolates what the combined
request saves. The step row compares the whole step either way.

`--profile DIR` instead profiles this tree once per backend: a cProfile per thread (timer: thread
CPU time, so waiting is not counted), merged into `DIR/ingest-<backend>.pstats` and a top-N
cumulative table `DIR/ingest-<backend>.txt`.

Usage::

    python -m benchmarks.ingest_cost [--baseline /tmp/ingest_base] [--rounds 5] [--steps 100]
        [--warmup 20] [--records 2560] [--backends sqlite,postgres]
        [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test] [--protocol separate|combined]
        [--json PATH]
    python -m benchmarks.ingest_cost --profile /tmp/profile [--steps 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PG = os.environ.get("LLDMON_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
KINDS = ("metrics", "actions")
REQUESTS = (*KINDS, "combined")
BACKENDS = ("sqlite", "postgres")
API = "/api/v1"


# --- one round, in the tree's interpreter -----------------------------------------------------------


class AsgiDriver:
    """Requests handed to an ASGI app directly: one at a time, the body in one message."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def call(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        done = asyncio.Event()
        status = 0
        chunks: list[bytes] = []
        delivered = False

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    done.set()

        headers = [
            (b"host", b"bench"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("bench", 80),
        }
        await self.app(scope, receive, send)
        return status, b"".join(chunks)


def _database(backend: str, pg_url: str, tmp: Path) -> contextlib.AbstractContextManager[str]:
    if backend == "sqlite":
        return contextlib.nullcontext(f"sqlite:///{tmp / 'lldmon.db'}")
    from benchmarks import _streaming

    return _streaming.scratch_database(pg_url, "cost")


class ThreadProfiles:
    """One cProfile per thread that runs request code (the event loop's and anyio's workers), timed by
    thread CPU time, recording only inside `measuring()`; `stats()` merges them."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: list[cProfile.Profile] = []
        self._lock = threading.Lock()
        self._measuring = False
        self._patch_threads()

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        """Profile the event loop's thread, and what it hands to worker threads, in this block."""
        self._measuring = True
        try:
            with self._active():
                yield
        finally:
            self._measuring = False

    def _mine(self) -> cProfile.Profile:
        profile: cProfile.Profile | None = getattr(self._local, "profile", None)
        if profile is None:
            profile = cProfile.Profile(time.thread_time)
            self._local.profile = profile
            with self._lock:
                self._all.append(profile)
        return profile

    @contextlib.contextmanager
    def _active(self) -> Iterator[None]:
        profile = self._mine()
        profile.enable()
        try:
            yield
        finally:
            profile.disable()

    def _patch_threads(self) -> None:
        """Profile what anyio runs in worker threads (sync dependencies, run_in_threadpool) while measuring."""
        import anyio.to_thread

        original = anyio.to_thread.run_sync

        async def run_sync(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            if not self._measuring:
                return await original(func, *args, **kwargs)

            def profiled(*inner: Any) -> Any:
                with self._active():
                    return func(*inner)

            return await original(profiled, *args, **kwargs)

        anyio.to_thread.run_sync = run_sync  # type: ignore[assignment]

    def stats(self) -> pstats.Stats:
        first, *rest = self._all
        stats = pstats.Stats(first)
        for profile in rest:
            stats.add(profile)
        return stats


class Measured:
    """Per request kind: process CPU and wall ms of each measured request."""

    def __init__(self) -> None:
        self.cpu_ms: dict[str, list[float]] = {kind: [] for kind in REQUESTS}
        self.wall_ms: dict[str, list[float]] = {kind: [] for kind in REQUESTS}

    async def request(self, driver: AsgiDriver, kind: str, path: str, body: bytes, *, keep: bool) -> None:
        c0, t0 = time.process_time(), time.perf_counter()
        status, answer = await driver.call("POST", path, body)
        c1, t1 = time.process_time(), time.perf_counter()
        assert status == 200, answer
        if keep:
            self.cpu_ms[kind].append(1e3 * (c1 - c0))
            self.wall_ms[kind].append(1e3 * (t1 - t0))


def one_round(backend: str, args: argparse.Namespace, profiles: ThreadProfiles | None) -> dict[str, Any]:
    """`--warmup` + `--steps` steps into a fresh database; per request CPU (ms) and, on PostgreSQL, the
    app's backends' CPU per step over the measured steps."""
    import monitor
    from benchmarks import _streaming
    from benchmarks._workload import make_runs
    from monitor.api.app import create_app
    from monitor.config import Settings
    from monitor.domain import DirectiveInfo

    run = make_runs(1, args.warmup + args.steps, args.records, prefix="cost")[0]
    measured = Measured()
    with (
        tempfile.TemporaryDirectory(prefix="lldmon_cost_") as tmp,
        _database(backend, args.pg_url, Path(tmp)) as url,
    ):
        app = create_app(Settings(database_url=url, data_dir=Path(tmp)))
        app.state.lldmon.detection.process = lambda run_id, *, catch_up=False: DirectiveInfo()
        driver = AsgiDriver(app)

        async def drive() -> float:
            status, body = await driver.call("POST", f"{API}/runs", json.dumps({"name": run.name}).encode())
            assert status in (200, 201), body
            base = f"{API}/runs/{json.loads(body)['id']}"
            pids: list[int] = []
            for k in range(args.warmup + args.steps):
                if k == args.warmup and backend == "postgres":  # the pool's connections are open by now
                    pids = _streaming.backend_pids(url)
                    pg_start = sum(_streaming.process_cpu(p) for p in pids)
                keep = k >= args.warmup
                if args.protocol == "combined":
                    bodies = {"combined": run.combined_body(k)}
                else:
                    bodies = {"metrics": run.metrics_body(range(k, k + 1)), "actions": run.actions_body(k)}
                with profiles.measuring() if profiles is not None and keep else contextlib.nullcontext():
                    for kind, body in bodies.items():
                        await measured.request(driver, kind, f"{base}/{kind}", body, keep=keep)
            return sum(_streaming.process_cpu(p) for p in pids) - pg_start if pids else 0.0

        pg_cpu = asyncio.run(drive())
        app.state.lldmon.close()
    return {
        "monitor": str(Path(monitor.__file__).parent),
        "cpu_ms": measured.cpu_ms,
        "wall_ms": measured.wall_ms,
        "postgres_ms_per_step": 1e3 * pg_cpu / args.steps if backend == "postgres" else None,
    }


def worker(args: argparse.Namespace) -> None:
    print("RESULT " + json.dumps(one_round(args.backend, args, None)))


def profile(args: argparse.Namespace) -> None:
    out = Path(args.profile)
    out.mkdir(parents=True, exist_ok=True)
    for backend in args.backends.split(","):
        profiles = ThreadProfiles()
        result = one_round(backend, args, profiles)
        stats = profiles.stats()
        stats.dump_stats(out / f"ingest-{backend}.pstats")
        text = io.StringIO()
        stats.stream = text  # type: ignore[attr-defined]
        stats.sort_stats("cumulative").print_stats(args.top)
        medians = {k: round(statistics.median(v), 3) for k, v in result["cpu_ms"].items() if v}
        header = (
            f"backend {backend}: {args.steps} steps (metrics + actions of {args.records} records, "
            f"{args.protocol}), "
            f"process CPU ms per request, median: {medians}; thread-CPU cProfile of the measured requests\n"
        )
        (out / f"ingest-{backend}.txt").write_text(header + text.getvalue())
        print(header + text.getvalue())


# --- the comparison, in the parent ------------------------------------------------------------------


def run_tree(tree: Path, backend: str, args: argparse.Namespace, protocol: str) -> dict[str, Any]:
    command = [
        sys.executable, "-P", str(Path(__file__).resolve()), "--worker", "--backend", backend,
        "--steps", str(args.steps), "--warmup", str(args.warmup), "--records", str(args.records),
        "--pg-url", args.pg_url, "--protocol", protocol,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            if Path(result["monitor"]) != tree / "monitor":
                raise RuntimeError(f"{tree}: monitor imported from {result['monitor']}")
            return result
    raise RuntimeError(
        f"{tree} {backend}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )


def compare(args: argparse.Namespace) -> dict[str, Any]:
    trees = {"baseline": Path(args.baseline).resolve(), "this": ROOT}
    rounds: dict[str, dict[str, list[dict[str, Any]]]] = {
        b: {t: [] for t in trees} for b in args.backends.split(",")
    }
    for r in range(args.rounds):
        for backend, per_tree in rounds.items():
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for name in order:
                protocol = args.protocol if name == "this" else "separate"
                per_tree[name].append(run_tree(trees[name], backend, args, protocol))
                print(f"round {r + 1}/{args.rounds} {backend:<8} {name:<8} done", file=sys.stderr)
    summary: dict[str, Any] = {}
    for backend, per_tree in rounds.items():
        summary[backend] = {}
        for kind in KINDS if args.protocol == "separate" else ():
            per_round = {t: [statistics.median(x["cpu_ms"][kind]) for x in per_tree[t]] for t in trees}
            summary[backend][kind] = _figures(per_round)
        if backend == "postgres":
            per_round = {t: [x["postgres_ms_per_step"] for x in per_tree[t]] for t in trees}
            summary[backend]["postgres_backends_per_step"] = _figures(per_round)
        step = {
            t: [sum(statistics.median(v) for v in x["cpu_ms"].values() if v) for x in per_tree[t]]
            for t in trees
        }
        summary[backend]["step"] = _figures(step)
    return {
        "command": " ".join([sys.executable, *sys.orig_argv[1:]]),
        "args": {k: v for k, v in vars(args).items() if k not in ("json", "worker", "backend")},
        "trees": {name: str(path) for name, path in trees.items()},
        "summary": summary,
    }


def _figures(per_round: dict[str, list[float]]) -> dict[str, Any]:
    base, this = per_round["baseline"], per_round["this"]
    return {
        "baseline_ms": round(statistics.median(base), 3),
        "this_ms": round(statistics.median(this), 3),
        "ratio_of_medians": round(statistics.median(base) / statistics.median(this), 2),
        "median_round_ratio": round(statistics.median(b / t for b, t in zip(base, this, strict=True)), 2),
        "rounds_baseline_ms": [round(x, 3) for x in base],
        "rounds_this_ms": [round(x, 3) for x in this],
    }


def print_report(result: dict[str, Any]) -> None:
    a = result["args"]
    print(
        f"\nserver CPU per ingest request, in process, detector stubbed: {a['rounds']} rounds x "
        f"{a['steps']} steps ({a['records']} action records per step); median of per-round medians"
    )
    print(f"  baseline: {result['trees']['baseline']}\n  this:     {result['trees']['this']}")
    print(f"  {'backend':<9}{'what':<28}{'baseline ms':>12}{'this ms':>10}{'ratio':>8}{'per-round':>11}")
    for backend, rows in result["summary"].items():
        for what, f in rows.items():
            label = {
                "postgres_backends_per_step": "PostgreSQL backends / step",
                "step": f"step (this: {a['protocol']})",
            }
            print(
                f"  {backend:<9}{label.get(what, what + ' request'):<28}{f['baseline_ms']:>12.3f}"
                f"{f['this_ms']:>10.3f}{f['ratio_of_medians']:>7.2f}x{f['median_round_ratio']:>10.2f}x"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="/tmp/ingest_base", help="checkout to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--records", type=int, default=2560)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--protocol",
        choices=("separate", "combined"),
        default="separate",
        help="how this tree's steps are sent (the baseline's: separate)",
    )
    parser.add_argument("--profile", help="profile this tree into this folder instead of comparing")
    parser.add_argument("--top", type=int, default=60, help="rows of the profile's table")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.profile:
        profile(args)
        return 0
    result = compare(args)
    print_report(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

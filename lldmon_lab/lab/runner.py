"""Runs a lab: the grid's training runs in parallel, each streaming to one lldmon service.

- The service: `lldmon serve` on the embedded SQLite of `DIR/lldmon` (a subprocess, as `lldmon demo`
  starts it; `lldmon_lab.demo.Server`), or an existing one (`lldmon_url`). Its database is kept, so a
  resumed lab adds to it and `lldmon serve --data-dir DIR/lldmon` shows every run afterwards.
- The runs: `examples/search_r1_grpo.py` as subprocesses of this Python (never imported: `lldmon_lab`
  does not import torch), at most `jobs` at a time, each with `--threads` torch threads, a unique run
  name in the lab's project (the setting's key and seed, `-r2`, `-r3`, ... if the service has that name
  already, e.g. from an interrupted attempt) and the policy of its LLDS mode (`lldmon_lab.lab.grid`).
  Output: `DIR/logs/<run name>.log`, TRL's output and the client spool under `DIR/work/<run name>/`;
  warmed-up weights in `DIR/warmup-cache/`, one file per seed and warm-up, which the other runs of
  that seed load instead of training the same warm-up again.
- Progress: polled from the service's API (step, reward, phase, directive), shown as a live table on a
  terminal, one line per start and end otherwise.
- When a run ends, its record is read back from the API (reward series, task-success series
  `rewards/exact_match/mean`, phase events, alerts, directive history) and written to
  `DIR/runs/<key>.json`; a record with status `finished` is what makes a rerun of the same command
  skip that run; any other run is started again.
- `DIR/summary.json` and `DIR/summary.md` are rewritten after every run and at the end.
Ctrl-C (or SIGTERM) stops the trainings, records what they did as `interrupted`, and exits 130.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final

import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from contracts import metrics as M
from lldmon_client import Session
from lldmon_lab.lab.grid import RunSpec
from lldmon_lab.lab.results import (
    FINISHED,
    TASK_SUCCESS,
    analyse,
    label_metric,
    read_records,
    render_markdown,
    summary_payload,
)
from lldmon_lab.labels import collapse_step, trailing_means

__all__ = ["LabError", "LabOptions", "LabReport", "default_jobs", "run_lab", "write_summary"]

TRAINING_PACKAGES: Final = ("torch", "transformers", "trl", "datasets", "bm25s")
HEAL_POLICY: Final = "heal"
HEAL_SAVE_STEPS: Final = 10
"""Checkpoint interval of `heal` runs: a collapse without a decay warning (whose checkpoint `heal`
restores first) rolls back at most this many steps further than it must."""
_LIVE_ROWS_DONE: Final = 6
"""Finished runs kept in the live table under the running ones."""


class LabError(Exception):
    """A lab that cannot start; the message says why and what to do."""


def default_jobs() -> int:
    """Parallel runs by default: one per CPU core (each run uses one torch thread)."""
    return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class LabOptions:
    out: Path
    runs: Sequence[RunSpec]
    jobs: int = field(default_factory=default_jobs)
    project: str = "lab"
    lldmon_url: str | None = None
    """An existing service; None: start one on `out/lldmon`."""
    token: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    """0: a free port."""
    threads: int = 1
    poll_seconds: float = 2.0
    command_line: str = ""
    script: Path | None = None
    """The training script (default: examples/search_r1_grpo.py of the source checkout)."""
    python: str = sys.executable


@dataclass
class LabReport:
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    interrupted: bool = False
    seconds: float = 0.0
    service: str | None = None

    @property
    def exit_code(self) -> int:
        return 130 if self.interrupted else (1 if self.failed else 0)


@dataclass
class _Active:
    spec: RunSpec
    name: str
    training: Any  # lldmon_lab.demo.Training
    started: float
    run_id: int | None = None
    last_step: int | None = None
    phase: str | None = None
    llds: str = "-"
    note: str = "starting"
    reward_steps: list[int] = field(default_factory=list)
    reward_values: list[float] = field(default_factory=list)


@dataclass
class _Done:
    key: str
    name: str
    seed: int
    status: str
    steps: str
    reward: float | None
    phase: str | None
    collapse: int | None


# --------------------------------------------------------------------------------------------------
# helpers


def _decode(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


def _write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def write_summary(
    out: Path, records: Sequence[Mapping[str, Any]], meta: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Write `out/summary.json` and `out/summary.md`; returns the payload."""
    payload = summary_payload(records, meta)
    _write_json(out / "summary.json", payload)
    tmp = out / "summary.md.tmp"
    tmp.write_text(render_markdown(payload), encoding="utf-8")
    os.replace(tmp, out / "summary.md")
    return payload


def _training_env(model: str, threads: int, token_for_child: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(threads)
    if not token_for_child:
        env.pop("LLDMON_TOKEN", None)
    env.pop("LLDMON_URL", None)
    if model in ("tiny", "smollm2") or model.endswith(".gguf"):
        env["HF_HUB_OFFLINE"] = "1"
    return env


def _check_script(python: str, script: Path, runs: Sequence[RunSpec]) -> None:
    """Fail fast if the grid needs a flag this version of the script lacks."""
    needed = {"--num-iterations"} if any(r.setting.num_iterations is not None for r in runs) else set()
    if not needed:
        return
    proc = subprocess.run([python, str(script), "--help"], capture_output=True, text=True, timeout=120)
    missing = sorted(flag for flag in needed if flag not in proc.stdout)
    if missing:
        raise LabError(
            f"{script.name} has no {', '.join(missing)} option: drop num_iterations from the grid "
            "(the script trains one optimizer pass per mini-batch)"
        )


class _Api:
    """The few reads the lab makes, through the HTTP API."""

    def __init__(self, http: httpx.Client, project: str) -> None:
        self.http = http
        self.project = project

    def run_id(self, name: str) -> int | None:
        reply = self.http.get("/runs", params={"project": self.project, "name": name})
        if reply.status_code != 200 or not reply.json():
            return None
        return int(reply.json()[0]["id"])

    def unique_name(self, key: str) -> str:
        name, attempt = key, 1
        while self.run_id(name) is not None:
            attempt += 1
            name = f"{key}-r{attempt}"
        return name

    def poll(self, a: _Active) -> None:
        if a.run_id is None:
            a.run_id = self.run_id(a.name)
            if a.run_id is None:
                return
        info = self.http.get(f"/runs/{a.run_id}")
        if info.status_code == 200:
            body = info.json()
            a.last_step = body.get("last_step")
            a.phase = body.get("phase")
        # the live table shows the series the run is labelled on (`results.label_metric`)
        name = label_metric(a.spec.setting.as_dict())
        after = a.reward_steps[-1] + 1 if a.reward_steps else None
        params: dict[str, Any] = {"names": name}
        if after is not None:
            params["step_min"] = after
        reply = self.http.get(f"/runs/{a.run_id}/metrics", params=params)
        if reply.status_code == 200:
            series = reply.json()["series"].get(name)
            if series:
                a.reward_steps += [int(s) for s in series["steps"]]
                a.reward_values += [_decode(v) for v in series["values"]]
        directive = self.http.get(f"/runs/{a.run_id}/directive")
        if directive.status_code == 200:
            llds = directive.json()["llds"]
            a.llds = f"on {llds['lam']:g}" if llds["enabled"] else "off"

    def collect(self, run_id: int) -> dict[str, Any]:
        """The raw data a record keeps (results.analyse derives the rest)."""
        run = self.http.get(f"/runs/{run_id}")
        run.raise_for_status()
        metrics = self.http.get(f"/runs/{run_id}/metrics", params={"names": [M.REWARD_MEAN, TASK_SUCCESS]})
        metrics.raise_for_status()
        found = metrics.json()["series"]
        series = found.get(M.REWARD_MEAN) or {"steps": [], "values": []}
        values = [_decode(v) for v in series["values"]]
        task = found.get(TASK_SUCCESS) or {"steps": [], "values": []}
        task_values = [_decode(v) for v in task["values"]]
        events = self.http.get(f"/runs/{run_id}/events")
        events.raise_for_status()
        alerts = self.http.get(f"/runs/{run_id}/alerts")
        alerts.raise_for_status()
        directives = self.http.get(f"/runs/{run_id}/directives")
        directives.raise_for_status()
        rollbacks = self.http.get(f"/runs/{run_id}/rollbacks")
        rollbacks.raise_for_status()
        info = run.json()
        return {
            "run": {
                k: info.get(k)
                for k in ("id", "name", "project", "status", "phase", "last_step", "directive_policy")
            },
            "reward": {
                "steps": [int(s) for s in series["steps"]],
                "values": [v if math.isfinite(v) else None for v in values],
            },
            "task_success": {
                "steps": [int(s) for s in task["steps"]],
                "values": [v if math.isfinite(v) else None for v in task_values],
            },
            "phases": [
                {"step": e["step"], "phase": e["phase"], "previous_phase": e["previous_phase"]}
                for e in events.json()
            ],
            "alerts": [
                {k: a[k] for k in ("kind", "severity", "status", "first_step", "last_step")}
                for a in alerts.json()
            ],
            "directives": [
                {
                    "version": d["version"],
                    "step": d["step"],
                    "enabled": d["llds"]["enabled"],
                    "lam": d["llds"]["lam"],
                    "source": d["source"],
                    "reason": d["reason"],
                }
                for d in directives.json()
            ],
            # what `results.steps_wasted` counts as redone (the undone phases are in the service)
            "rollbacks": [
                {k: r[k] for k in ("from_step", "to_step", "version", "undone_phases")}
                for r in rollbacks.json()
            ],
        }


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM to the lab behaves as Ctrl-C (the trainings are stopped and recorded)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------------------------------
# the lab


class _Lab:
    def __init__(self, options: LabOptions, console: Console) -> None:
        self.o = options
        self.console = console
        self.out = options.out
        self.runs_dir = self.out / "runs"
        self.records: dict[str, dict[str, Any]] = read_records(self.runs_dir)
        self.active: list[_Active] = []
        self.done: list[_Done] = []
        self.report = LabReport()
        self.started = time.monotonic()
        self.meta: dict[str, Any] = {
            "command": options.command_line,
            "project": options.project,
            "jobs": options.jobs,
            "threads": options.threads,
        }

    # ---- records

    def _grid_records(self) -> list[dict[str, Any]]:
        return [self.records[r.key] for r in self.o.runs if r.key in self.records]

    def _summary(self) -> None:
        meta = {**self.meta, "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        write_summary(self.out, self._grid_records(), meta)

    def _record(self, a: _Active, status: str, api: _Api | None) -> dict[str, Any]:
        training = a.training
        data: dict[str, Any] = {}
        if api is not None:
            run_id = a.run_id if a.run_id is not None else api.run_id(a.name)
            if run_id is not None:
                with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                    data = api.collect(run_id)
                a.run_id = run_id
        record: dict[str, Any] = {
            "key": a.spec.key,
            "group": a.spec.setting.key,
            "seed": a.spec.seed,
            "setting": a.spec.setting.as_dict(),
            "run_name": a.name,
            "run_id": a.run_id,
            "project": self.o.project,
            "status": status,
            "returncode": training.returncode,
            "seconds": round(time.monotonic() - a.started, 1),
            "command": shlex.join(training.command),
            "log": str(training.log_path.relative_to(self.out)),
            "script_summary": training.summary,
            **data,
        }
        self.records[a.spec.key] = record
        _write_json(self.runs_dir / f"{a.spec.key}.json", record)
        return record

    # ---- processes

    def _command(self, spec: RunSpec, name: str, url: str, script: Path) -> list[str]:
        work = self.out / "work" / name
        command = [
            self.o.python,
            str(script),
            *spec.setting.script_args(),
            "--seed",
            str(spec.seed),
            "--threads",
            str(self.o.threads),
            "--lldmon-url",
            url,
            "--project",
            self.o.project,
            "--run-name",
            name,
            "--output-dir",
            str(work),
            "--summary-json",
            str(work / "summary.json"),
            # every metric the hooks sent, at every step: the raw material of recorded fixtures
            "--metrics-jsonl",
            str(work / "metrics.jsonl"),
            # the arms of a seed share their warm-up (same model, seed and warm-up settings)
            "--warmup-cache",
            str(self.out / "warmup-cache"),
        ]
        if self.o.token:
            command += ["--lldmon-token", self.o.token]
        if spec.setting.effective_policy == HEAL_POLICY:
            # `heal` rolls back to checkpoints: periodic ones, under the supervisor that restarts the job
            command += ["--save-steps", str(HEAL_SAVE_STEPS)]
            command = [self.o.python, "-m", "trainer_hooks.supervise", "--", *command]
        return command

    def _start(self, spec: RunSpec, api: _Api, url: str, script: Path) -> None:
        from lldmon_lab.demo import Training

        name = api.unique_name(spec.key)
        log_path = self.out / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = _training_env(spec.setting.model, self.o.threads, token_for_child=bool(self.o.token))
        training = Training(self._command(spec, name, url, script), log_path, env)
        training.start()
        self.active.append(_Active(spec=spec, name=name, training=training, started=time.monotonic()))
        if not self.console.is_terminal:
            self.console.print(f"start {escape(name)}")

    def _finish(self, a: _Active, api: _Api, status: str | None = None) -> None:
        training = a.training
        training.join_output()
        if training.proc is not None and training.proc.stdout is not None:
            training.proc.stdout.close()  # the reader thread is done with it
        if status is None:
            ok = training.returncode == 0 and (training.summary or {}).get("status") == FINISHED
            status = FINISHED if ok else "failed"
        record = self._record(a, status, api)
        derived = analyse(record)
        self.active.remove(a)
        self.done.append(
            _Done(
                a.spec.key,
                a.name,
                a.spec.seed,
                status,
                f"{derived.steps_done if derived.steps_done is not None else '-'}/{a.spec.setting.steps}",
                derived.final_reward,
                derived.final_phase,
                derived.collapse_step,
            )
        )
        if status == FINISHED:
            self.report.ran.append(a.spec.key)
        elif status == "failed":
            self.report.failed.append(a.spec.key)
            self.console.print(
                f"[red]{escape(a.name)} failed (exit {training.returncode})[/red]; log: {training.log_path}\n"
                + escape(training.output(12))
            )
        if not self.console.is_terminal:
            self.console.print(
                f"done {escape(a.name)}: {status}, steps {self.done[-1].steps}, collapse "
                f"{derived.collapse_step if derived.collapse_step is not None else '-'}, first warning "
                f"{derived.first_warning if derived.first_warning is not None else '-'}, best "
                f"{_fmt(derived.best_reward)}, final {_fmt(derived.final_reward)} "
                f"({record['seconds']:.0f}s)"
            )
        self._summary()

    # ---- display

    def _table(self, queued: int) -> Table:
        elapsed = time.monotonic() - self.started
        total = len(self.o.runs)
        done = len(self.report.skipped) + len(self.done)
        table = Table(
            "run",
            "seed",
            "status",
            "step",
            "reward (10)",
            "phase",
            "LLDS",
            "collapse",
            "note",
            title=f"collapse lab: {done}/{total} done, {len(self.active)} running, {queued} queued, "
            f"{len(self.report.failed)} failed ({elapsed:.0f}s)",
        )
        for a in self.active:
            while not a.training.lines.empty():
                a.note = a.training.lines.get_nowait()
            _, means = trailing_means(a.reward_steps, a.reward_values)
            collapse = collapse_step(a.reward_steps, a.reward_values)
            table.add_row(
                escape(a.name),
                str(a.spec.seed),
                "training" if a.last_step else "starting",
                f"{a.last_step or 0}/{a.spec.setting.steps}",
                _fmt(means[-1] if means else None),
                a.phase or "-",
                a.llds,
                "-" if collapse is None else str(collapse),
                escape(a.note[:48]),
            )
        for d in self.done[-_LIVE_ROWS_DONE:]:
            colour = "green" if d.status == FINISHED else "red"
            table.add_row(
                escape(d.name),
                str(d.seed),
                f"[{colour}]{d.status}[/{colour}]",
                d.steps,
                _fmt(d.reward),
                d.phase or "-",
                "",
                "-" if d.collapse is None else str(d.collapse),
                "",
            )
        return table

    # ---- main loop

    def run(self) -> LabReport:
        todo = [r for r in self.o.runs if self.records.get(r.key, {}).get("status") != FINISHED]
        self.report.skipped = [r.key for r in self.o.runs if r not in todo]
        if self.report.skipped:
            self.console.print(f"{len(self.report.skipped)} finished runs found in {self.out}: skipped")
        if not todo:
            self._summary()
            self.report.seconds = time.monotonic() - self.started
            return self.report
        from lldmon_lab.demo import DemoError, examples_script, missing_training_packages

        missing = missing_training_packages()
        if missing:
            raise LabError(
                f"the lab's training needs {', '.join(missing)}: pip install -c constraints.txt -e '.[hooks]'"
            )
        try:
            script = self.o.script or examples_script()
        except DemoError as exc:
            raise LabError(str(exc)) from None
        _check_script(self.o.python, script, todo)
        with self._service() as url, Session(url, token=self.o.token, timeout=30.0) as session:
            self.report.service = url
            self.meta["service"] = url
            api = _Api(session.http, self.o.project)
            self.console.print(
                f"{len(todo)} runs to do, {min(self.o.jobs, len(todo))} at a time, streaming to {url} "
                f"(project {self.o.project!r}; dashboard {url}/dashboard/)"
            )
            self._loop(todo, api, url, script)
        self._summary()
        self.report.seconds = time.monotonic() - self.started
        return self.report

    @contextlib.contextmanager
    def _service(self) -> Iterator[str]:
        if self.o.lldmon_url:
            yield self.o.lldmon_url.rstrip("/")
            return
        from lldmon_lab.demo import DemoError, Server

        data_dir = self.out / "lldmon"
        data_dir.mkdir(parents=True, exist_ok=True)
        server = Server(data_dir, self.o.host, self.o.port or _free_port(self.o.host))
        try:
            try:
                server.start()
            except DemoError as exc:
                raise LabError(str(exc)) from None
            self.meta["data_dir"] = str(data_dir)
            yield server.url
        finally:
            server.stop()

    def _loop(self, todo: list[RunSpec], api: _Api, url: str, script: Path) -> None:
        pending = list(todo)
        live: Live | None = None
        if self.console.is_terminal:
            live = Live(Group(), console=self.console, refresh_per_second=2, transient=False)
            live.start()
        try:
            with _sigterm_interrupts():
                while pending or self.active:
                    while pending and len(self.active) < max(1, self.o.jobs):
                        self._start(pending.pop(0), api, url, script)
                    for a in list(self.active):
                        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                            api.poll(a)
                        if not a.training.running:
                            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                                api.poll(a)
                            self._finish(a, api)
                    if live is not None:
                        live.update(self._table(len(pending)))
                    if self.active:
                        _sleep_while(
                            lambda: all(a.training.running for a in self.active), self.o.poll_seconds
                        )
        except KeyboardInterrupt:
            self.report.interrupted = True
            self.console.print("[yellow]interrupted: stopping the trainings ...[/yellow]")
            for a in self.active:
                with contextlib.suppress(Exception):
                    a.training.proc.terminate()
            for a in list(self.active):
                with contextlib.suppress(Exception):
                    a.training.stop()
                with contextlib.suppress(Exception):
                    self._finish(a, api, status="interrupted")
        finally:
            if live is not None:
                live.update(self._table(len(pending)))
                live.stop()


def _sleep_while(condition: Callable[[], bool], seconds: float) -> None:
    """Sleep up to `seconds`, waking early when `condition` turns false (a run ended)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and condition():
        time.sleep(min(0.2, seconds))


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def run_lab(options: LabOptions, console: Console) -> LabReport:
    """Run (or resume) the lab; see the module docstring."""
    if not options.runs:
        raise LabError("the grid is empty")
    options.out.mkdir(parents=True, exist_ok=True)
    return _Lab(options, console).run()

"""`lldmon demo`: the service, a real GRPO search agent and a replayed collapse, in one command.

What it runs, in this order:

1. `lldmon serve` on the embedded SQLite of a data directory (a subprocess), and prints the dashboard
   and API docs URLs.
2. A replay thread: `lldmon_lab.scenarios.collapse_scenario(seed)`, a labelled synthetic GRPO run
   that goes through the three LLD phases and collapses, is posted through the HTTP API into a second
   run (policy `auto`) in batches, a few hundred steps per second. The detector's phase events, alerts
   and the LLDS directive it switches on are visible within seconds.
3. The training: `examples/search_r1_grpo.py` (a subprocess of this Python), a real Search-R1-style
   tool-integrated GRPO run with TRL on CPU (bundled corpus, BM25 retriever, `search` tool called
   during rollouts, exact-match reward), streaming to the service through `MonitorClient` with its
   run's policy set to `auto`. Nothing in its metrics is scripted.

The terminal shows the training's warm-up and steps (reward, searches per trajectory, likelihood of
correct responses), and, polled from the API, every phase change, alert and directive change of both
runs. Ctrl-C stops everything (the subprocesses are terminated). The data directory is kept:
`lldmon serve --data-dir DIR` shows it again.

When the replay and the training are over, the dashboard stays up until Ctrl-C if the demo runs in a
terminal (stdin and stdout are TTYs: a person followed the printed link and is looking at it), and
closes at once otherwise (CI, tests, a pipe), as said when it starts; `keep_serving` decides explicitly.

`lldmon_lab` never imports torch or trainer_hooks: the training runs as a separate process, from the
`examples/` directory of the source checkout (the project installed in editable mode).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import httpx
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from contracts import metrics as M
from contracts.wire import API_PREFIX
from lldmon_client import RetryPolicy, Session, Uploader, masked, metrics_body, new_batch_id

__all__ = ["DemoError", "DemoOptions", "examples_script", "run_demo"]

PROJECT: Final = "demo"
FULL_STEPS: Final = 150
"""GRPO steps of the full demo (about 3.5 minutes on 2 idle CPU cores, warm-up included)."""
QUICK_STEPS: Final = 6
TRAINING_PACKAGES: Final = ("torch", "transformers", "trl", "datasets", "bm25s")
POLL_SECONDS: Final = 1.0
_STOP_TIMEOUT: Final = 15.0
_TRAIN_LOG_PREFIXES: Final = ("model:", "warm-up", "lldmon:", "GRPO:", "interrupted")


class DemoError(Exception):
    """A demo that cannot start or went wrong; the message says why and what to do."""


@dataclass(frozen=True)
class DemoOptions:
    data_dir: Path | None = None
    """Where the SQLite database, logs and training output go (default: a new temporary directory)."""
    host: str = "127.0.0.1"
    port: int = 8000
    """If taken, a free port is used instead (and printed)."""
    steps: int | None = None
    """GRPO steps (default: FULL_STEPS, or QUICK_STEPS with `quick`)."""
    quick: bool = False
    keep_serving: bool | None = None
    """Serve the dashboard after the run until Ctrl-C; None: when run in a terminal (`interactive`)."""
    model: str = "tiny"
    replay_seed: int = 7
    replay_speed: float = 250.0
    """Replayed steps per second."""
    replay_batch: int = 10
    train: bool = True


def examples_script() -> Path:
    """`examples/search_r1_grpo.py` of the source checkout this package is installed from."""
    import monitor

    root = Path(monitor.__file__).resolve().parents[1]
    script = root / "examples" / "search_r1_grpo.py"
    if not script.is_file():
        raise DemoError(
            f"the demo's training script is missing ({script}). `lldmon demo` runs the example in the "
            "examples/ directory of the lldmon source checkout: install the project from a checkout in "
            "editable mode, e.g. pip install -c constraints.txt -e '.[server,hooks]', or pass --no-train "
            "to see the replayed run only."
        )
    return script


def interactive() -> bool:
    """Whether a person runs the demo in a terminal: stdin and stdout are TTYs (not CI, a pipe or a
    test), so someone is there to open the dashboard and to press Ctrl-C."""
    return all(stream is not None and stream.isatty() for stream in (sys.stdin, sys.stdout))


def missing_training_packages() -> list[str]:
    return [name for name in TRAINING_PACKAGES if importlib.util.find_spec(name) is None]


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------------------------------
# subprocesses


def _stop_process(proc: subprocess.Popen[Any] | None, timeout: float = _STOP_TIMEOUT) -> None:
    """SIGTERM, wait, then SIGKILL: only the process this module started."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=timeout)


class Server:
    """`lldmon serve` on the embedded SQLite of `data_dir`, as a subprocess of this Python."""

    def __init__(self, data_dir: Path, host: str, port: int) -> None:
        self.data_dir = data_dir
        self.host = host
        self.port = port
        self.url = f"http://{host}:{port}"
        self.log_path = data_dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        env = {k: v for k, v in os.environ.items() if k != "LLDMON_DATABASE_URL"}
        code = "import sys; from monitor.cli import main; sys.argv[0] = 'lldmon'; main()"
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, "serve", "--data-dir", str(self.data_dir), *self._address()],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the demo only; it stops the server in order
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                raise DemoError(f"the server exited at start:\n{self.output()}")
            if time.monotonic() > deadline:
                raise DemoError(f"the server was not ready after {timeout:.0f}s:\n{self.output()}")
            time.sleep(0.2)

    def _address(self) -> list[str]:
        return ["--host", self.host, "--port", str(self.port)]

    def output(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        _stop_process(self.proc)
        if self._log is not None:
            self._log.close()
            self._log = None


class Training:
    """The example training script as a subprocess; its output goes to `log_path`, and the lines that
    tell progress (warm-up, set-up) are queued for the terminal."""

    def __init__(self, command: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.command = command
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str] = queue.Queue()
        self.summary: dict[str, Any] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.command,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, name="lldmon-demo-train-log", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with self.log_path.open("a", encoding="utf-8") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                text = line.rstrip("\n")
                if text.startswith("SUMMARY "):
                    with contextlib.suppress(ValueError):
                        self.summary = json.loads(text[len("SUMMARY ") :])
                    continue
                message = text.split("] ", 1)[1] if text.startswith("[") and "] " in text else ""
                if message.startswith(_TRAIN_LOG_PREFIXES):
                    self.lines.put(message)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def join_output(self, timeout: float = 10.0) -> None:
        if self._reader is not None:
            self._reader.join(timeout)

    def output(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        _stop_process(self.proc, timeout=30.0)  # the script closes its client on SIGTERM


# --------------------------------------------------------------------------------------------------
# replay of a labelled collapse scenario


@dataclass
class Replay:
    """Posts `collapse_scenario(seed)` into a new run of the service (policy `auto`)."""

    url: str
    name: str
    seed: int
    speed: float
    batch: int
    stop_event: threading.Event = field(default_factory=threading.Event)
    run_id: int | None = None
    steps_total: int = 0
    steps_sent: int = 0
    collapse_label: int | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    thread: threading.Thread | None = None

    def start(self) -> threading.Thread:
        self.thread = threading.Thread(target=self._run, name="lldmon-demo-replay", daemon=True)
        self.thread.start()
        return self.thread

    def stop(self, timeout: float = 15.0) -> None:
        """Stop sending and wait until the run is marked failed (an interrupted replay is not left
        `running` in the service), before the server goes away."""
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout)

    def _run(self) -> None:
        try:
            self._replay()
        except Exception as exc:  # shown in the terminal; the training part goes on
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()

    def _replay(self) -> None:
        from lldmon_lab.scenarios import collapse_scenario

        scenario = collapse_scenario(self.seed)
        steps = [int(s) for s in scenario.steps.tolist()]
        self.steps_total = len(steps)
        self.collapse_label = scenario.collapse_step
        with Session(self.url, timeout=30.0) as session:
            reply = session.request(
                "POST",
                "/runs",
                json={
                    "name": self.name,
                    "project": PROJECT,
                    "config": {
                        "source": "lldmon_lab.scenarios.collapse_scenario",
                        "seed": self.seed,
                        "synthetic": True,
                        "label_collapse_step": scenario.collapse_step,
                        "generating_onsets": scenario.onsets,
                    },
                    "tags": ["demo", "replay", "synthetic"],
                },
            ).raise_for_status("registering the replay run")
            self.run_id = run_id = int(reply.data["id"])
            session.request("PUT", f"/runs/{run_id}/policy", json={"policy": "auto"}).raise_for_status(
                "setting the replay run's policy"
            )
            uploader = Uploader(session, retry=RetryPolicy(attempts=1))
            started = time.monotonic()
            for first in range(0, len(steps), self.batch):
                if self.stop_event.is_set():
                    break
                last = min(first + self.batch, len(steps))
                columns = {
                    name: masked(values[first:last], scenario.present[name][first:last])
                    for name, values in scenario.values.items()
                }
                body = metrics_body(new_batch_id(), steps[first:last], columns)
                failure = uploader.send(run_id, "metrics", body).failure
                if failure is not None:
                    failure.raise_for_status(f"sending steps {steps[first]}-{steps[last - 1]}")
                self.steps_sent = last
                ahead = started + self.steps_sent / max(self.speed, 1e-9) - time.monotonic()
                if ahead > 0 and self.stop_event.wait(ahead):
                    break
            status = "failed" if self.stop_event.is_set() else "finished"  # as the training script does
            session.request("POST", f"/runs/{run_id}/finish", json={"status": status}).raise_for_status(
                f"marking the replay run {status}"
            )


# --------------------------------------------------------------------------------------------------
# watching the runs through the API


@dataclass
class RunView:
    """What the terminal has shown of one run so far."""

    label: str
    run_id: int
    events: set[int] = field(default_factory=set)
    alerts: dict[int, str] = field(default_factory=dict)
    directive_version: int = 0
    last_step: int = -1
    phase: str | None = None
    directive: str = "LLDS off"
    n_alerts: int = 0


TRAIN_METRICS: Final = (
    M.REWARD_MEAN,
    M.SEARCH_VALID_PER_TRAJ,
    M.LOGP_POS,
    M.LOGP_NEG,
    M.GRAD_NORM,
    M.ENTROPY_MEAN,
)


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, (int, float)):
        return f"{value:.{digits}f}"
    return str(value)


class Watcher:
    """Polls the API and prints what changed: training steps, phases, alerts, directives."""

    def __init__(self, http: httpx.Client, console: Console) -> None:
        self.http = http
        self.console = console
        self.runs: dict[int, RunView] = {}
        self.train: RunView | None = None
        self.train_steps: int | None = None
        self.train_last: dict[str, float | str] = {}

    def add(self, label: str, run_id: int, *, training: bool = False) -> RunView:
        view = self.runs.setdefault(run_id, RunView(label, run_id))
        if training:
            self.train = view
        return view

    def find_run(self, name: str) -> int | None:
        reply = self.http.get("/runs", params={"project": PROJECT, "limit": 1000})
        if reply.status_code != 200:
            return None
        for run in reply.json():
            if run.get("name") == name:
                return int(run["id"])
        return None

    def poll(self) -> None:
        for view in list(self.runs.values()):
            if view is self.train:
                self._poll_training(view)
            self._poll_detector(view)

    def _poll_training(self, view: RunView) -> None:
        params: list[tuple[str, str | int | float | bool | None]] = [("names", n) for n in TRAIN_METRICS]
        params.append(("step_min", view.last_step + 1))
        reply = self.http.get(f"/runs/{view.run_id}/metrics", params=params)
        if reply.status_code != 200:
            return
        series: dict[str, dict[str, list[Any]]] = reply.json()["series"]
        new_steps: set[int] = set()
        for name, points in series.items():
            if points["steps"]:
                new_steps.update(int(s) for s in points["steps"])
                self.train_last[name] = points["values"][-1]
        if not new_steps:
            return
        latest = view.last_step = max(new_steps)
        last = self.train_last
        total = f"/{self.train_steps}" if self.train_steps else ""
        logp = last.get(M.LOGP_POS, "-")
        self.console.print(
            f"[cyan]\\[train][/cyan] step {latest}{total}  reward {_fmt(last.get(M.REWARD_MEAN, '-'))}  "
            f"searches/traj {_fmt(last.get(M.SEARCH_VALID_PER_TRAJ, '-'), 2)}  "
            f"logp(correct) {_fmt(logp)}  grad_norm {_fmt(last.get(M.GRAD_NORM, '-'))}"
        )

    def _poll_detector(self, view: RunView) -> None:
        tag = f"[magenta]\\[{view.label}][/magenta]"
        reply = self.http.get(f"/runs/{view.run_id}/events")
        if reply.status_code == 200:
            for event in sorted(reply.json(), key=lambda e: (e["step"], e["id"])):
                if event["id"] in view.events:
                    continue
                view.events.add(event["id"])
                view.phase = event["phase"]
                colour = {
                    "decay": "yellow",
                    "collapse": "red",
                    "stagnation": "yellow",
                    "not_learning": "yellow",
                }.get(event["phase"], "green")
                self.console.print(
                    f"{tag} step {event['step']}: phase {event['previous_phase'] or '-'} -> "
                    f"[{colour}]{event['phase']}[/{colour}]"
                )
        reply = self.http.get(f"/runs/{view.run_id}/alerts")
        if reply.status_code == 200:
            alerts = reply.json()
            view.n_alerts = len(alerts)
            for alert in sorted(alerts, key=lambda a: a["id"]):
                if view.alerts.get(alert["id"]) == alert["status"]:
                    continue
                new = alert["id"] not in view.alerts
                view.alerts[alert["id"]] = alert["status"]
                colour = "red" if alert["severity"] == "critical" else "yellow"
                what = "ALERT" if new else f"alert {alert['status']}:"
                self.console.print(
                    f"{tag} [{colour}]{what} {alert['severity']} {escape(alert['kind'])}[/{colour}] "
                    f"(steps {alert['first_step']}-{alert['last_step']}): {escape(alert['message'])}"
                )
        reply = self.http.get(f"/runs/{view.run_id}/directives")
        if reply.status_code == 200:
            for directive in sorted(reply.json(), key=lambda d: d["version"]):
                if directive["version"] <= view.directive_version:
                    continue
                view.directive_version = directive["version"]
                llds = directive["llds"]
                view.directive = f"LLDS {'on' if llds['enabled'] else 'off'}, lambda {llds['lam']}"
                self.console.print(
                    f"{tag} [bold]directive v{directive['version']}: {view.directive}[/bold] "
                    f"({directive['source']}, step {directive['step']}: {escape(directive['reason'])})"
                )

    def run_info(self, run_id: int) -> dict[str, Any]:
        reply = self.http.get(f"/runs/{run_id}")
        return dict(reply.json()) if reply.status_code == 200 else {}


# --------------------------------------------------------------------------------------------------
# the command


@contextlib.contextmanager
def _cleanup(*stoppers: Any) -> Iterator[None]:
    try:
        yield
    finally:
        for stop in stoppers:
            with contextlib.suppress(Exception):
                stop()


def _training_command(
    script: Path, options: DemoOptions, url: str, run_name: str, data_dir: Path
) -> list[str]:
    steps = options.steps if options.steps is not None else (QUICK_STEPS if options.quick else FULL_STEPS)
    command = [
        sys.executable,
        str(script),
        "--model",
        options.model,
        "--lldmon-url",
        url,
        "--project",
        PROJECT,
        "--run-name",
        run_name,
        "--policy",
        "auto",
        "--steps",
        str(steps),
        "--output-dir",
        str(data_dir / "train"),
        "--summary-json",
        str(data_dir / "train-summary.json"),
    ]
    return command


def _training_env(model: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.pop("LLDMON_TOKEN", None)  # the demo's own service is open
    if model in ("tiny", "smollm2") or model.endswith(".gguf"):
        env["HF_HUB_OFFLINE"] = "1"  # nothing to download: fail fast instead of trying
    return env


def run_demo(options: DemoOptions, console: Console) -> int:
    """Run the demo; returns the process exit code (0: everything finished, 130: interrupted)."""
    script = examples_script() if options.train else None
    if options.train:
        missing = missing_training_packages()
        if missing:
            raise DemoError(
                f"the training part needs {', '.join(missing)}: pip install -c constraints.txt -e "
                "'.[server,hooks]' (or pass --no-train to see the replayed run only)"
            )
    data_dir = options.data_dir or Path(tempfile.mkdtemp(prefix="lldmon-demo-"))
    data_dir = data_dir.expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    port = options.port
    if port == 0:  # as for `serve`: any free port (printed with the URLs)
        port = _free_port(options.host)
    elif not _port_free(options.host, port):
        port = _free_port(options.host)
        console.print(f"[yellow]port {options.port} is taken; using {port}[/yellow]")

    keep_serving = options.keep_serving if options.keep_serving is not None else interactive()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    train_name = f"search-r1-{Path(options.model).name}-{stamp}"
    replay_name = f"replay-collapse-seed{options.replay_seed}-{stamp}"
    server = Server(data_dir, options.host, port)
    training: Training | None = None
    replay: Replay | None = None
    interrupted = serving = False
    started = time.monotonic()

    def stop_all() -> None:
        _ignore_stop_signals()  # a second Ctrl-C must not cut the cleanup short
        if replay is not None:
            replay.stop()
        if training is not None:
            training.stop()
        server.stop()

    with _interrupt_on_stop_signals(), _cleanup(stop_all):
        try:
            console.print(f"starting lldmon on the embedded SQLite in [bold]{data_dir}[/bold] ...")
            server.start()
            url = server.url
            console.print(
                f"dashboard:  [bold link={url}/dashboard/]{url}/dashboard/[/bold link={url}/dashboard/]"
            )
            console.print(f"API docs:   [bold]{url}/docs[/bold]   (API under {url}{API_PREFIX})")
            why = "not a terminal" if options.keep_serving is None else "--no-keep-serving"
            console.print(
                "the dashboard stays up after the run; Ctrl-C stops it"
                if keep_serving
                else f"the dashboard closes when the run ends ({why}); --keep-serving keeps it up",
                soft_wrap=True,
            )
            replay = Replay(url, replay_name, options.replay_seed, options.replay_speed, options.replay_batch)
            replay.start()
            console.print(
                f"replaying the labelled collapse scenario (seed {options.replay_seed}) into run "
                f"[bold]{replay_name}[/bold], policy auto, {options.replay_speed:.0f} steps/s"
            )
            if script is not None:
                command = _training_command(script, options, url, train_name, data_dir)
                training = Training(command, data_dir / "train.log", _training_env(options.model))
                training.start()
                console.print(
                    f"training a {options.model} Search-R1 agent with TRL GRPO on CPU into run "
                    f"[bold]{train_name}[/bold] (log: {training.log_path})"
                )
            with Session(url, timeout=10.0) as session:
                watcher = Watcher(session.http, console)
                watcher.train_steps = (
                    int(command[command.index("--steps") + 1]) if script is not None else None
                )
                replay_announced = False
                while True:
                    if replay.run_id is not None and replay.run_id not in watcher.runs:
                        watcher.add("replay", replay.run_id)
                    if training is not None:
                        while not training.lines.empty():
                            console.print(f"[cyan]\\[train][/cyan] {escape(training.lines.get_nowait())}")
                        if watcher.train is None:
                            run_id = watcher.find_run(train_name)
                            if run_id is not None:
                                watcher.add("train", run_id, training=True)
                    _poll(watcher, server)
                    if replay.done.is_set() and not replay_announced:
                        replay_announced = True
                        if replay.error:
                            console.print(f"[red]replay failed:[/red] {escape(replay.error)}")
                        else:
                            console.print(
                                f"[magenta]\\[replay][/magenta] all {replay.steps_sent} steps sent "
                                f"(labelled reward collapse at step {replay.collapse_label})"
                            )
                    if replay.done.is_set() and (training is None or not training.running):
                        break
                    time.sleep(POLL_SECONDS)
                if training is not None:
                    training.join_output()
                    while not training.lines.empty():
                        console.print(f"[cyan]\\[train][/cyan] {escape(training.lines.get_nowait())}")
                time.sleep(0.5)
                _poll(watcher, server)
                _print_summary(console, watcher, training, time.monotonic() - started, data_dir)
                failed = training is not None and training.returncode != 0
                if failed and training is not None:
                    console.print(
                        f"[red]training exited with {training.returncode}[/red]:\n{escape(training.output())}"
                    )
                done = "replay" if training is None else "replay and training"
                if keep_serving:
                    serving = True
                    console.print(
                        f"{done} done; the dashboard stays at [bold]{url}/dashboard/[/bold] until Ctrl-C",
                        soft_wrap=True,
                    )
                    while server.proc is not None and server.proc.poll() is None:
                        time.sleep(1.0)
                    console.print(f"[red]the server exited[/red]:\n{escape(server.output())}")
                    return 1
                console.print(
                    f"{done} done; the dashboard at {url}/dashboard/ closes now "
                    "(--keep-serving keeps it up until Ctrl-C)",
                    soft_wrap=True,
                )
                return 1 if failed or (replay.error is not None) else 0
        except KeyboardInterrupt:
            interrupted = True
            console.print(
                "[yellow]stopping ...[/yellow]" if serving else "[yellow]interrupted: stopping ...[/yellow]"
            )
    if interrupted and not serving:
        console.print(f"data kept in {data_dir} (lldmon serve --data-dir {data_dir})")
        return 130
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def _interrupt_on_stop_signals() -> Iterator[None]:
    """SIGTERM and SIGINT stop the demo like Ctrl-C (its service, training and replay end cleanly),
    whatever disposition the parent left: SIGTERM's default killed the demo alone and left its server
    and trainer running; an ignored SIGINT (a job started in the background) could not stop it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _ignore_stop_signals() -> None:
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)


def _poll(watcher: Watcher, server: Server) -> None:
    """One poll; a failed request is skipped, unless the server is gone."""
    try:
        watcher.poll()
    except httpx.HTTPError as exc:
        if server.proc is None or server.proc.poll() is not None:
            raise DemoError(f"the server exited:\n{server.output()}") from exc


def _print_summary(
    console: Console, watcher: Watcher, training: Training | None, seconds: float, data_dir: Path
) -> None:
    table = Table("run", "id", "steps", "phase", "alerts", "directive", title=f"lldmon demo ({seconds:.0f}s)")
    for view in watcher.runs.values():
        try:
            info = watcher.run_info(view.run_id)
        except httpx.HTTPError:
            info = {}
        table.add_row(
            f"{view.label}: {escape(str(info.get('name', '')))}",
            str(view.run_id),
            str(info.get("last_step", "")),
            str(info.get("phase") or view.phase or "-"),
            str(view.n_alerts),
            view.directive,
        )
    console.print(table)
    summary = training.summary if training is not None else None
    if summary:
        console.print(
            f"training: {summary.get('steps')} GRPO steps, {summary.get('trajectories')} trajectories, "
            f"reward {_fmt(summary.get('reward_first'))} (first {summary.get('reward_window')} rollouts) -> "
            f"{_fmt(summary.get('reward_last'))} (last {summary.get('reward_window')}), mean "
            f"{_fmt(summary.get('reward_mean'))}; searches per trajectory "
            f"{_fmt(summary.get('searches_per_traj'), 2)}; {_fmt(summary.get('seconds'), 0)}s"
        )
    console.print(f"data kept in {data_dir}; look again with: lldmon serve --data-dir {data_dir}")

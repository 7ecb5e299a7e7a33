"""`lldmon` command line, one module per command group.

Local commands work on the database (`--database-url` / `--data-dir`); `runs`, `alerts`, `directive`,
`export` and `import` also work on a remote service over its HTTP API with `--url` / `LLDMON_URL` and
`--token` / `LLDMON_TOKEN` (the token's project scope). `serve`, `db`, `token` and `auth` administer the
server itself and stay local.

The remote mode, `sync` and `watch` need the `cli` extra only (numpy, pydantic: no FastAPI, SQLAlchemy or
Dash): a command imports the server's packages only on its local path.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import typer

from monitor.cli import demo as _demo
from monitor.cli import directive as _directive
from monitor.cli import evaluate as _evaluate
from monitor.cli import export as _export
from monitor.cli import importing as _importing
from monitor.cli import serve as _serve
from monitor.cli import sync as _sync
from monitor.cli import watch as _watch
from monitor.cli._common import AlertStatus, Policy, RunStatus, console
from monitor.cli.alerts import alerts_app
from monitor.cli.db import db_app
from monitor.cli.runs import runs_app
from monitor.cli.tokens import auth_app, token_app
from monitor.lab.cli import lab_app

__all__ = ["AlertStatus", "Policy", "RunStatus", "app", "main"]

app = typer.Typer(help="lldmon: collapse diagnostics for GRPO agent training.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(alerts_app, name="alerts")
app.add_typer(token_app, name="token")
app.add_typer(runs_app, name="runs")
app.add_typer(lab_app, name="lab")
app.add_typer(auth_app, name="auth")
app.command()(_serve.serve)
app.command("export")(_export.export_run)
app.command()(_directive.directive)
app.command()(_sync.sync)
app.command()(_watch.watch)
app.command("import")(_importing.import_logs)
app.command("eval")(_evaluate.evaluate_detector)
app.command()(_demo.demo)


def main() -> None:
    """The `lldmon` entry point. Commands import their extra's packages when they run, so a command
    whose extra is not installed ends in one line naming it, not in a ModuleNotFoundError traceback."""
    try:
        app()
    except ModuleNotFoundError as exc:
        words, command = _invoked()
        extra = _extra_providing(exc.name or "", prefer="cli" if _over_http(command) else "server")
        if extra is None:
            raise
        from rich.markup import escape

        install = f"pip install 'lldmon[{extra}] @ <wheel, checkout or git URL>'"
        console.print(
            f"[red]error:[/red] {escape(words)} needs lldmon's {extra} extra ({exc.name!r} is "
            f"not installed): {escape(install)}",
            highlight=False,
            soft_wrap=True,
        )
        raise SystemExit(1) from None


def _invoked() -> tuple[str, Any]:
    """`lldmon runs list` from sys.argv (the sub-command names only), and that command."""
    words = ["lldmon"]
    command: Any = typer.main.get_command(app)
    for arg in sys.argv[1:]:
        commands = getattr(command, "commands", {})  # a group (Typer's does not subclass click.Group)
        if arg not in commands:
            break
        words.append(arg)
        command = commands[arg]
    return " ".join(words), command


def _over_http(command: Any) -> bool:
    """Whether `command` was run against a service's HTTP API, which the `cli` extra covers: `sync` and
    `watch` always (their --url has a default), the others with --url or LLDMON_URL."""
    url = next((p for p in getattr(command, "params", []) if p.name == "url"), None)
    if url is None:
        return False
    given = any(arg == "--url" or arg.startswith("--url=") for arg in sys.argv[1:])
    return url.default is not None or given or bool(os.environ.get("LLDMON_URL"))


_TEST_EXTRAS = ("verl-test", "dev")


def _extra_providing(module: str, prefer: str) -> str | None:
    """The extra in lldmon's metadata that installs top-level `module` (distribution `prometheus-client`
    -> module `prometheus_client`): `prefer` if it is one of them (numpy is in `cli` and `server`),
    else the first; None if none does."""
    import importlib.metadata
    import re

    try:
        requirements = importlib.metadata.requires("lldmon") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    top = module.partition(".")[0].lower()
    extras = []
    for requirement in requirements:
        name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        if (
            name
            and extra
            and extra.group(1) not in _TEST_EXTRAS
            and re.sub(r"[-.]+", "_", name.group(1)).lower() == top
        ):
            extras.append(extra.group(1))
    return prefer if prefer in extras else next(iter(extras), None)

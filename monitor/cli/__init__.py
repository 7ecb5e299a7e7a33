"""`lldmon` command line, one module per command group.

Local commands work on the database (`--database-url` / `--data-dir`); `runs`, `alerts`, `directive`,
`export` and `import` also work on a remote service over its HTTP API with `--url` / `LLDMON_URL` and
`--token` / `LLDMON_TOKEN` (the token's project scope). `serve`, `db`, `token` and `auth` administer the
server itself and stay local.

The remote mode, `sync` and `watch` need the `cli` extra only (numpy, pydantic: no FastAPI, SQLAlchemy or
Dash): a command imports the server's packages only on its local path.

Other installed packages add commands through the `lldmon.commands` entry points (`COMMANDS_GROUP`):
the experiment tooling's `lab`, `eval` and `demo` (`lldmon_lab.cli`), which depends on `monitor` and so
cannot be imported by it.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from typing import Any

import typer
import typer.main
from typer.core import TyperGroup

from monitor.cli import directive as _directive
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

__all__ = ["COMMANDS_GROUP", "AlertStatus", "Policy", "RunStatus", "app", "installed_commands", "main"]

COMMANDS_GROUP = "lldmon.commands"


def installed_commands() -> dict[str, Any]:
    """The commands of the `COMMANDS_GROUP` entry points, by entry-point name: a Typer app becomes a
    command group, a function a command, each built as `app.add_typer` / `app.command` would build it."""
    extensions = typer.Typer()
    for entry_point in importlib.metadata.entry_points(group=COMMANDS_GROUP):
        target = entry_point.load()
        if isinstance(target, typer.Typer):
            extensions.add_typer(target, name=entry_point.name)
        else:
            extensions.command(entry_point.name)(target)
    return dict(typer.main.get_group(extensions).commands)


class _Lldmon(TyperGroup):
    """`lldmon`'s own commands, then the installed ones. Added when Typer builds the command line (on
    every run, and in tests), not on import: importing `monitor.cli` loads none of their packages."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for name, command in installed_commands().items():
            self.add_command(command, name)


app = typer.Typer(
    cls=_Lldmon, help="lldmon: collapse diagnostics for GRPO agent training.", no_args_is_help=True
)
app.add_typer(db_app, name="db")
app.add_typer(alerts_app, name="alerts")
app.add_typer(token_app, name="token")
app.add_typer(runs_app, name="runs")
app.add_typer(auth_app, name="auth")
app.command()(_serve.serve)
app.command("export")(_export.export_run)
app.command()(_directive.directive)
app.command()(_sync.sync)
app.command()(_watch.watch)
app.command("import")(_importing.import_logs)


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

"""What every command module shares: the console, option types, settings, the state a command works on
(the database, or a remote service over its HTTP API) and how a domain error becomes one line."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape

from monitor.text import printable

if TYPE_CHECKING:
    from monitor.bootstrap import Services
    from monitor.ports import ServicePort

PIPE_WIDTH = 1 << 16
"""The console's width when stdout is not a terminal: wide enough that no table cell is cut and no line
is wrapped."""


class CliConsole(Console):
    """rich's Console, except that when stdout is not a terminal (a pipe, a file, a CI log) its width is
    `PIPE_WIDTH` whatever the terminal or COLUMNS say: table cells print whole (a run name can be grepped
    for) and messages and hints stay on one line (a command in a hint can be copied). In a terminal it
    fits the terminal as rich does."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return size if self.is_terminal else ConsoleDimensions(PIPE_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


console = CliConsole()


def shown(text: object) -> str:
    """`printable(text)` (`monitor.text`) with rich markup escaped too: how user-supplied text goes into a
    `console.print` markup string or a table cell (rich reads both as markup, so `[link=...]` in a name
    would be a link)."""
    return escape(printable(str(text)))


def quoted(text: object) -> str:
    """`text` as a quoted literal, `printable` inside, rich markup escaped (an error that names a run or
    project the user typed)."""
    return escape(f"'{printable(str(text))}'")


# Enumerated options are Literal choices: a typo is a one-line usage error (exit 2), never a traceback or
# an empty answer. The same values as contracts.wire's RUN_STATUSES and DIRECTIVE_POLICIES (a test checks).
RunStatus = Literal["running", "finished", "failed", "crashed", "stalled"]
AlertStatus = Literal["open", "acknowledged", "resolved"]
Policy = Literal["off", "alert", "auto", "heal"]

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url", envvar="LLDMON_DATABASE_URL", help="SQLAlchemy URL (default: embedded SQLite)."
    ),
]
DataDir = Annotated[
    Path | None,
    typer.Option("--data-dir", envvar="LLDMON_DATA_DIR", help="Directory of the embedded SQLite file."),
]
RemoteUrl = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="LLDMON_URL",
        help="Base URL of a remote lldmon service: work over its HTTP API (the token's project) instead of "
        "the database.",
    ),
]
RemoteToken = Annotated[
    str | None, typer.Option("--token", envvar="LLDMON_TOKEN", help="API token for --url, if auth is on.")
]
AsJson = Annotated[bool, typer.Option("--json", help="The API's JSON shapes (strict JSON).")]


def settings_from(database_url: str | None, data_dir: Path | None, **extra: Any) -> Any:
    from monitor.config import Settings

    values: dict[str, Any] = {k: v for k, v in extra.items() if v is not None}
    if database_url:
        values["database_url"] = database_url
    if data_dir:
        values["data_dir"] = data_dir
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    try:
        return Settings(**values)
    except ValidationError as exc:  # a bad LLDMON_* variable: one line naming it, not a traceback
        error = exc.errors()[0]
        name = "LLDMON_" + str(error["loc"][0]).upper() if error["loc"] else "settings"
        console.print(f"[red]error:[/red] {name}: {error['msg']}", highlight=False)
        raise typer.Exit(2) from None
    except SettingsError as exc:  # e.g. LLDMON_WEBHOOK_URLS that is not a JSON list
        console.print(f"[red]error:[/red] {exc} (lists are JSON: '[\"https://...\"]')", highlight=False)
        raise typer.Exit(2) from None


def require_server() -> None:
    """Import what the local mode needs (the server extra) now: a command that works before it opens the
    database (`import` parses its whole input first) names a missing extra before that work, not after."""
    import importlib

    importlib.import_module("monitor.api.app")


def services(database_url: str | None, data_dir: Path | None, **extra: Any) -> Services:
    from monitor.api.app import SchemaOutdated, build_state

    try:
        return build_state(settings_from(database_url, data_dir, **extra))
    except SchemaOutdated as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def open_state(
    url: str | None, token: str | None, database_url: str | None, data_dir: Path | None
) -> ServicePort:
    """The service state a command works on: a remote service's HTTP API when `url` is given (the
    token's project scope), otherwise the database, as `services` builds it."""
    if url:
        from monitor.cli.remote import RemoteState

        return RemoteState(url, token)
    return services(database_url, data_dir)


@contextmanager
def closing(state: Any, exit_code: int | None = None) -> Iterator[None]:
    """Close the database (or the HTTP client) when the command is done; a domain error (unknown run or
    alert, a value out of bounds; over HTTP the API's error, mapped back) becomes one line: exit 2 for bad
    input, 1 otherwise (or always `exit_code`)."""
    from monitor.errors import InvalidInput, LLDMonError

    try:
        yield
    except LLDMonError as exc:
        console.print(f"[red]error:[/red] {shown(exc.message)}")
        code = exit_code if exit_code is not None else 2 if isinstance(exc, InvalidInput) else 1
        raise typer.Exit(code) from None
    finally:
        state.db.dispose()


def run_id_of(state: ServicePort, ref: str, project: str | None = None) -> int:
    """A run given by id, or by name (unique across projects, or within `project`)."""
    from monitor.domain import Principal, RunFilter

    if ref.isascii() and ref.isdigit():  # str.isdigit() is true for '²', which int() refuses
        return int(ref)
    matches = state.runs.list(Principal(), RunFilter(name=ref, project=project, limit=1000))
    where = f" in project {quoted(project)}" if project is not None else ""
    if not matches:
        console.print(f"[red]error:[/red] no run is named {quoted(ref)}{where}")
        raise typer.Exit(1)
    if len(matches) > 1:
        projects = ", ".join(sorted(r.project for r in matches))
        console.print(
            f"[red]error:[/red] {len(matches)} runs are named {quoted(ref)} (projects: "
            f"{shown(projects)}); pass --project or use the run id"
        )
        raise typer.Exit(1)
    return int(matches[0].id)


ProjectOfRun = Annotated[
    str | None, typer.Option("--project", help="Project of the run, when its name is not unique.")
]


def print_json(value: Any) -> None:
    """Strict JSON (non-finite floats are already wire strings), indented, on stdout."""
    import json

    typer.echo(json.dumps(value, indent=2, allow_nan=False))


def redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)

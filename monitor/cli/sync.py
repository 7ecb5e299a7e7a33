"""`lldmon sync`: upload what a training job spooled while the service was unreachable."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from monitor.cli._common import console, quoted, shown

if TYPE_CHECKING:
    import httpx

    from monitor.cli.remote import Api


def sync(
    directory: Annotated[
        Path,
        typer.Argument(help="A client spool directory, or a folder above several (e.g. ~/.lldmon/spool)."),
    ],
    url: Annotated[str, typer.Option(envvar="LLDMON_URL", help="Base URL of the service.")] = (
        "http://127.0.0.1:8000"
    ),
    token: Annotated[
        str | None, typer.Option(envvar="LLDMON_TOKEN", help="API token, if auth is on.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds per HTTP request.")] = 30.0,
) -> None:
    """Upload batches a training job spooled while the service was unreachable (oldest first).

    Idempotent: every batch keeps its batch_id, so one the service already has is a duplicate.
    Batches the service once refused (`rejected/`) are offered again first, and any batch over the
    service's body limit is split, so one refused only for its size is not lost; one still refused
    stays in `rejected/`. When every batch of a directory is delivered, its runs get the final
    status their job recorded (finished / failed / crashed). Stops at the first batch that cannot
    be delivered now (the service out of reach, a URL that is not an lldmon API, a refusal to retry
    later): one line naming why and what is left, exit code 1.
    """
    from contracts import spool
    from monitor.cli.remote import Api

    if not directory.is_dir():
        console.print(f"[red]error:[/red] {directory} is not a directory")
        raise typer.Exit(2)
    dirs = spool.find_spool_dirs(directory)
    stopped = False
    finished: set[tuple[str | None, str]] = set()
    api = Api(url, token, timeout)
    try:
        uploader = _SyncUploader(api)
        for path in dirs:
            stopped = not uploader.resend_rejected(path)
            if stopped:
                break
            report = spool.replay(path, uploader.send)
            uploader.counts["rejected"] += report.rejected
            uploader.counts["corrupt"] += report.corrupt
            if report.error is not None:  # send raised: not a refusal it could name
                uploader.problem = report.error
            if report.rejected:
                console.print(f"{report.rejected} rejected batches kept in {path / spool.REJECTED_DIR}")
            if report.stopped:
                stopped = True
                break
            applied = uploader.apply_finishes(path)
            if applied is None:
                stopped = True
                break
            finished |= applied
    finally:
        api.close()
    counts = uploader.counts
    remaining = sum(spool.spool_size(path)[0] for path in dirs)
    tally = (
        f"sent {counts['sent']}, duplicates {counts['duplicates']}, rejected {counts['rejected']}, "
        f"remaining {remaining}" + (f", corrupt {counts['corrupt']}" if counts["corrupt"] else "")
    )
    if remaining or stopped:
        console.print(
            f"[red]error:[/red] {shown(uploader.problem or 'not delivered')} (sync stopped: {tally})",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)
    console.print(tally)
    for key in sorted(uploader.created - finished, key=str):
        console.print(
            f"run {quoted(key[1])}: the spool holds no final status (its job did not close its client): "
            "left 'running'"
        )


class _SyncUploader:
    """`lldmon sync`'s side of the wire: run ids by (project, name), batches sent once each
    (`lldmon_client.Uploader`: cut to the service's body limit, the one a 413 names), rejected batches
    offered again, finish markers applied.

    Every answer goes through `Api` (monitor.cli.remote), as the other remote commands': an
    unreachable service is a ServiceUnavailable, an answer that is not the API's JSON a NotAnApi;
    either stops the sync with its message in `problem`."""

    def __init__(self, api: Api) -> None:
        from lldmon_client import RetryPolicy, Uploader

        self.api = api
        self.uploader = Uploader(api.session, retry=RetryPolicy(attempts=1))
        self.run_ids: dict[tuple[str | None, str], int] = {}
        self.created: set[tuple[str | None, str]] = set()
        """Runs this sync registered: their data arrived only through it."""
        self.counts = {"sent": 0, "duplicates": 0, "rejected": 0, "corrupt": 0}
        self.problem = ""

    def run_id(self, run: Any) -> int | None:
        """The run's id (an existing run is looked up, not re-registered: that would make a finished
        run `running` again), or None with `problem` set. Raises the LLDMonError of an answer that is
        not the API's."""
        from contracts.wire import DEFAULT_PROJECT, encode_json
        from monitor.cli.remote import list_of

        if run.key in self.run_ids:
            return self.run_ids[run.key]
        params: dict[str, Any] = {"name": run.run_name, "limit": 2}
        if run.project is not None:
            params["project"] = run.project
        elif not self.api.has_token:  # registered without a project and a token: the default project
            params["project"] = DEFAULT_PROJECT
        page = self.api.request("GET", "/runs", params=params)
        if not page.is_success:
            self.problem = self._refused(f"looking up run {run.run_name!r}", page)
            return None
        found: list[int] = [
            run_id
            for run_id, name in self.api.decoded(page, list_of(lambda r: (int(r["id"]), r["name"])))
            if name == run.run_name
        ]
        if len(found) == 1:
            self.run_ids[run.key] = found[0]
            return found[0]
        registered = self.api.request("POST", "/runs", json=encode_json(run.register_body()))  # NaN: "NaN"
        if not registered.is_success:
            self.problem = self._refused(f"registering run {run.run_name!r}", registered)
            return None
        run_id: int = self.api.decoded(registered, lambda body: int(body["id"]))
        if registered.status_code == 201:
            self.created.add(run.key)
        self.run_ids[run.key] = run_id
        return run_id

    def send(self, entry: Any) -> Any:
        """One spool entry, in parts if it is over the body limit: "ok", "retry" or "reject"."""
        from monitor.errors import LLDMonError

        try:
            run_id = self.run_id(entry.run)
            if run_id is None:
                return "retry"
            outcome = self.uploader.send(run_id, entry.kind, entry.body)
            for sent in outcome.delivered:
                self.api.acknowledged(sent.reply)  # another server's 2xx: NotAnApi
                self.counts["duplicates" if sent.duplicate else "sent"] += 1
            failure = outcome.failure
            if failure is not None:
                if failure.response is None:  # no answer: ServiceUnavailable
                    raise self.api.failure(failure)
                self.problem = self._refused(f"batch {entry.batch_id}", failure.response)
                if failure.status == 404:
                    self.run_ids.pop(entry.run.key, None)
        except LLDMonError as exc:
            self.problem = exc.message
            return "retry"
        return outcome.verdict

    def resend_rejected(self, path: Path) -> bool:
        """Offer `path/rejected/` again (older than the spool: first); False if the service is out of
        reach. Delivered batches leave `rejected/`; those refused again stay and are listed."""
        from contracts import spool

        rejected_dir = path / spool.REJECTED_DIR
        delivered, refused = 0, []
        for entry in spool.iter_entries(rejected_dir):
            outcome = self.send(entry)
            if outcome == "retry":
                return False
            if outcome == "ok":
                spool.remove(entry)
                delivered += 1
            else:
                refused.append(self.problem)
        if delivered or refused:
            console.print(
                f"{rejected_dir}: {delivered} earlier rejected batches delivered, {len(refused)} refused "
                "again and kept" + "".join(f"\n  {shown(reason)}" for reason in refused[:20])
            )
        return True

    def apply_finishes(self, path: Path) -> set[tuple[str | None, str]] | None:
        """The final status of each run with a finish marker in `path` (all its batches are
        delivered); the runs done, or None if the service could not be told."""
        from contracts import spool
        from monitor.cli.remote import api_object
        from monitor.errors import LLDMonError

        done: set[tuple[str | None, str]] = set()
        for marker, run, status in spool.read_finishes(path):
            try:
                run_id = self.run_id(run)
                if run_id is None:
                    return None
                response = self.api.request("POST", f"/runs/{run_id}/finish", json={"status": status})
                if not response.is_success:
                    self.problem = self._refused(f"marking run {run.run_name!r} {status}", response)
                    return None
                self.api.decoded(response, api_object)
            except LLDMonError as exc:
                self.problem = exc.message
                return None
            marker.unlink(missing_ok=True)
            done.add(run.key)
            console.print(f"run {quoted(run.run_name)} (id {run_id}): {status}")
        return done

    def _refused(self, what: str, response: httpx.Response) -> str:
        """`what: HTTP 401: <the API's message>` for an error the API answered; raises NotAnApi for one
        that is not the API's JSON (another server's page), except a 413, which a proxy's body limit
        answers too."""
        from monitor.cli.remote import NotAnApi
        from monitor.errors import LLDMonError

        error = self.api.error(response)
        if isinstance(error, NotAnApi):
            if response.status_code != 413:
                raise error
            return f"{what}: HTTP 413: {response.text.strip()[:300]}"
        if type(error) is LLDMonError:  # a status without its own error: the message names it
            return f"{what}: {error.message}"
        return f"{what}: HTTP {response.status_code}: {error.message}"

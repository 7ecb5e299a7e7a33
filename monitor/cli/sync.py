"""`lldmon sync`: upload what a training job spooled while the service was unreachable."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from monitor.cli._common import console, quoted, shown


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
    be delivered now; exit code 1 if any are left.
    """
    import httpx

    from contracts import spool
    from contracts.wire import API_PREFIX

    if not directory.is_dir():
        console.print(f"[red]error:[/red] {directory} is not a directory")
        raise typer.Exit(2)
    dirs = spool.find_spool_dirs(directory)
    headers = {"authorization": f"Bearer {token}"} if token else {}
    stopped = False
    finished: set[tuple[str | None, str]] = set()
    base_url = url.strip().rstrip("/").removesuffix(API_PREFIX) + API_PREFIX  # ".../api/v1" works too
    with httpx.Client(base_url=base_url, headers=headers, timeout=timeout) as http:
        uploader = _SyncUploader(http, has_token=token is not None)
        for path in dirs:
            stopped = not uploader.resend_rejected(path)
            if stopped:
                break
            report = spool.replay(path, uploader.send)
            uploader.counts["rejected"] += report.rejected
            uploader.counts["corrupt"] += report.corrupt
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
    counts = uploader.counts
    remaining = sum(spool.spool_size(path)[0] for path in dirs)
    console.print(
        f"sent {counts['sent']}, duplicates {counts['duplicates']}, rejected {counts['rejected']}, "
        f"remaining {remaining}" + (f", corrupt {counts['corrupt']}" if counts["corrupt"] else "")
    )
    for key in [] if stopped else sorted(uploader.created - finished, key=str):
        console.print(
            f"run {quoted(key[1])}: the spool holds no final status (its job did not close its client): "
            "left 'running'"
        )
    if remaining or stopped:
        console.print(f"[yellow]stopped:[/yellow] {shown(uploader.problem or 'not delivered')}")
        raise typer.Exit(1)


class _SyncUploader:
    """`lldmon sync`'s side of the wire: run ids by (project, name), batches cut to the service's
    body limit (the one a 413 names), rejected batches offered again, finish markers applied."""

    def __init__(self, http: Any, *, has_token: bool) -> None:
        from contracts import split

        self.http = http
        self.has_token = has_token
        self.run_ids: dict[tuple[str | None, str], int] = {}
        self.created: set[tuple[str | None, str]] = set()
        """Runs this sync registered: their data arrived only through it."""
        self.counts = {"sent": 0, "duplicates": 0, "rejected": 0, "corrupt": 0}
        self.problem = ""
        self.max_bytes = split.DEFAULT_MAX_BODY_BYTES

    def run_id(self, run: Any) -> int | None:
        """The run's id (an existing run is looked up, not re-registered: that would make a finished
        run `running` again), or None with `problem` set."""
        from contracts.wire import DEFAULT_PROJECT, encode_json

        if run.key in self.run_ids:
            return self.run_ids[run.key]
        params: dict[str, Any] = {"name": run.run_name, "limit": 2}
        if run.project is not None:
            params["project"] = run.project
        elif not self.has_token:  # registered without a project and a token: the default project
            params["project"] = DEFAULT_PROJECT
        page = self.http.get("/runs", params=params)
        found = [r["id"] for r in page.json() if r.get("name") == run.run_name] if page.is_success else []
        if len(found) == 1:
            self.run_ids[run.key] = int(found[0])
            return self.run_ids[run.key]
        registered = self.http.post("/runs", json=encode_json(run.register_body()))  # NaN as "NaN"
        if not registered.is_success:
            self.problem = (
                f"registering run {run.run_name!r}: HTTP {registered.status_code} {registered.text[:300]}"
            )
            return None
        if registered.status_code == 201:
            self.created.add(run.key)
        self.run_ids[run.key] = int(registered.json()["id"])
        return self.run_ids[run.key]

    def send(self, entry: Any) -> Any:
        """One spool entry, in parts if it is over the body limit: "ok", "retry" or "reject"."""
        import gzip

        import httpx

        from contracts import split, spool

        try:
            run_id = self.run_id(entry.run)
            if run_id is None:
                return "retry"
            pending = split.split_body(entry.kind, entry.body, self.max_bytes)
            while pending:
                body, raw = pending.pop(0)
                response = self.http.post(
                    f"/runs/{run_id}/{entry.kind}",
                    content=gzip.compress(raw),
                    headers={"content-type": "application/json", "content-encoding": "gzip"},
                )
                if response.status_code == 413:
                    limit = split.limit_from_error(response.text) or len(raw) // 2
                    self.max_bytes = min(self.max_bytes, max(1024, limit))
                    parts = split.split_body(entry.kind, body, self.max_bytes)
                    if len(parts) > 1:
                        pending[:0] = parts
                        continue
                outcome = spool.outcome_for_status(response.status_code)
                if outcome == "ok":
                    self.counts["duplicates" if response.json().get("duplicate") else "sent"] += 1
                    continue
                self.problem = f"batch {entry.batch_id}: HTTP {response.status_code} {response.text[:300]}"
                if response.status_code == 404:
                    self.run_ids.pop(entry.run.key, None)
                return outcome
        except httpx.HTTPError as exc:
            self.problem = f"{type(exc).__name__}: {exc}"
            return "retry"
        return "ok"

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
        import httpx

        from contracts import spool

        done: set[tuple[str | None, str]] = set()
        for marker, run, status in spool.read_finishes(path):
            try:
                run_id = self.run_id(run)
                if run_id is None:
                    return None
                response = self.http.post(f"/runs/{run_id}/finish", json={"status": status})
            except httpx.HTTPError as exc:
                self.problem = f"{type(exc).__name__}: {exc}"
                return None
            if not response.is_success:
                self.problem = f"marking run {run.run_name!r} {status}: HTTP {response.status_code} "
                self.problem += response.text[:300]
                return None
            marker.unlink(missing_ok=True)
            done.add(run.key)
            console.print(f"run {quoted(run.run_name)} (id {run_id}): {status}")
        return done

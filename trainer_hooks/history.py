"""A run's metric history and action records as pandas DataFrames, read over the HTTP API (for notebooks).

    from trainer_hooks.history import fetch_actions, fetch_action_summaries, fetch_metrics, fetch_runs

    runs = fetch_runs("http://lldmon:8000", project="nq", token="lldm_...")
    df = fetch_metrics("http://lldmon:8000", "grpo-3b-nq", project="nq", token="lldm_...")
    df[["lld/logp_pos", "reward/mean"]].plot()
    acts = fetch_actions("http://lldmon:8000", "grpo-3b-nq", project="nq", step_min=100, source="loss")
    acts[acts.advantage > 0].groupby("step").delta.median().plot()

Needs only httpx (a base dependency of lldmon) and pandas, imported when first called; it never
imports the service stack, so `pip install lldmon pandas` is enough on a laptop.

The frame is indexed by step (ascending) with one float64 column per metric. NaN and +-inf are
data (collapse signals) and come back as float NaN/inf; a step at which a metric was not logged is
NaN as well (pandas has no separate "missing" in a float64 column; `lldmon export --format parquet`
keeps the two apart). Long histories are read in pages of consecutive step windows of about
`page_points` values each, so neither side builds one huge response; the pages are disjoint and
cover the whole step range, so nothing is read twice or skipped.

`fetch_actions` returns one row per action record (the columns of `lldmon export --actions`), read
in pages of at most `page_records` records, each going on after the last record read (a step larger
than a page is read in parts); `fetch_action_summaries` the per-step delta
quantiles the service stores with each step's records (kept when retention prunes the records).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import httpx

from contracts.action_pages import (
    DEFAULT_PAGE_RECORDS,
    MAX_ACTION_READ,
    ActionCursor,
    PagingUnsupported,
    action_pages,
)
from contracts.wire import decode_float
from lldmon_client import Session

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "AccessDenied",
    "HistoryError",
    "RunNotFound",
    "fetch_action_summaries",
    "fetch_actions",
    "fetch_metrics",
    "fetch_runs",
    "resolve_run",
]

DEFAULT_PAGE_POINTS = 200_000
"""Values per metrics request (a 10,000-step run with 30 metrics is 1.5 requests)."""
_RUNS_PAGE = 1000  # the API's largest `limit`
ACTION_DTYPES: dict[str, str] = {
    "step": "int64",
    "source": "object",
    "traj_index": "int64",
    "action_index": "int64",
    "n_tokens": "int64",
    "delta": "float64",
    "old_logp_mean": "float64",
    "advantage": "float64",
    "reward": "float64",
    "is_answer": "bool",
}


class HistoryError(RuntimeError):
    """The service could not be reached or answered with an error (the message says which)."""


class RunNotFound(HistoryError, LookupError):
    """No run with that id, or no run of that name visible to the token."""


class AccessDenied(HistoryError, PermissionError):
    """401: auth is on and no valid token was given; 403: the token belongs to another project."""


def fetch_metrics(
    base_url: str,
    run: int | str,
    *,
    metrics: Sequence[str] | None = None,
    token: str | None = None,
    project: str | None = None,
    step_min: int | None = None,
    step_max: int | None = None,
    page_points: int = DEFAULT_PAGE_POINTS,
    timeout: float = 60.0,
    transport: httpx.BaseTransport | None = None,
) -> pd.DataFrame:
    """Metric history of `run` (an int id, or a name: give `project` if the name is not unique).

    `metrics` selects and orders columns (default: all, sorted by name); asking for a metric the run
    does not have raises ValueError. Raises RunNotFound, AccessDenied or HistoryError.
    """
    pd = _pandas()
    if page_points < 1:
        raise ValueError(f"page_points must be >= 1, got {page_points}")
    wanted = list(dict.fromkeys(metrics)) if metrics is not None else None
    with _session(base_url, token, timeout, transport) as http:
        run_id = _resolve(http, run, project)
        extents = _get(http, f"/runs/{run_id}/metric-names")
        known = {e["name"]: e for e in extents}
        if wanted is not None:
            unknown = [name for name in wanted if name not in known]
            if unknown:
                raise ValueError(
                    f"run {run_id} has no metric {', '.join(map(repr, unknown))}; it has: "
                    + (", ".join(sorted(known)) or "none")
                )
        selected = [known[name] for name in (wanted if wanted is not None else sorted(known))]
        steps: dict[str, list[int]] = {e["name"]: [] for e in selected}
        values: dict[str, list[float]] = {e["name"]: [] for e in selected}
        for lo, hi in _windows(selected, step_min, step_max, page_points):
            params: dict[str, Any] = {"step_min": lo, "step_max": hi}
            if wanted is not None:  # all metrics: no names, so the URL stays short
                params["names"] = wanted
            page = _get(http, f"/runs/{run_id}/metrics", params=params)["series"]
            for name, s in page.items():
                if name in steps:  # a metric created while paging is left out, not half-read
                    steps[name] += s["steps"]
                    values[name] += [v if type(v) is float else decode_float(v) for v in s["values"]]
    columns = {
        name: pd.Series(values[name], index=pd.Index(steps[name], dtype="int64"), dtype="float64")
        for name in steps
    }
    frame = pd.DataFrame(columns, columns=list(steps), dtype="float64")
    frame = frame.sort_index()
    frame.index = frame.index.astype("int64")
    frame.index.name = "step"
    frame.attrs["run_id"] = run_id
    return frame


def fetch_actions(
    base_url: str,
    run: int | str,
    *,
    token: str | None = None,
    project: str | None = None,
    step_min: int | None = None,
    step_max: int | None = None,
    source: str | None = None,
    page_records: int = DEFAULT_PAGE_RECORDS,
    timeout: float = 60.0,
    transport: httpx.BaseTransport | None = None,
) -> pd.DataFrame:
    """Action records of `run`, one row each, ordered by (step, source, traj_index, action_index).

    Columns: step, source ("loss" or "probe"), traj_index, action_index, n_tokens, delta,
    old_logp_mean, advantage, reward (float64: NaN and +-inf as logged), is_answer (bool). `source`
    keeps one source (default: both). Steps whose raw records retention pruned have no rows (their
    quantiles: `fetch_action_summaries`). Raises RunNotFound, AccessDenied or HistoryError.

    Read in pages (`contracts.action_pages`, the pager `lldmon export --actions` uses), each after the
    last record read: no record is skipped or kept twice, and a step of any size is read in parts.
    """
    pd = _pandas()
    if not 1 <= page_records <= MAX_ACTION_READ:
        raise ValueError(f"page_records must be in 1..{MAX_ACTION_READ}, got {page_records}")
    if source not in (None, "loss", "probe"):
        raise ValueError(f"source must be 'loss', 'probe' or None, got {source!r}")
    np = _numpy()
    with _session(base_url, token, timeout, transport) as http:
        run_id = _resolve(http, run, project)

        def read(
            lo: int | None, hi: int | None, src: str | None, limit: int, after: ActionCursor | None
        ) -> dict[str, Any]:
            params: dict[str, Any] = {"step_min": lo, "step_max": hi, "source": src, "limit": limit}
            if after is not None:
                params |= {f"after_{name}": value for name, value in after._asdict().items()}
            reply = _get(
                http, f"/runs/{run_id}/actions", params={k: v for k, v in params.items() if v is not None}
            )
            return _action_arrays(reply)

        try:
            pages = list(action_pages(read, step_min, step_max, source, page_records))
        except PagingUnsupported as exc:
            raise HistoryError(str(exc)) from None
    columns = _join_actions(pages) if pages else {n: np.empty(0, dtype=d) for n, d in ACTION_DTYPES.items()}
    frame = pd.DataFrame(columns).astype(ACTION_DTYPES)
    frame.attrs["run_id"] = run_id
    return frame


def fetch_action_summaries(
    base_url: str,
    run: int | str,
    *,
    token: str | None = None,
    project: str | None = None,
    step_min: int | None = None,
    step_max: int | None = None,
    source: str | None = None,
    timeout: float = 60.0,
    transport: httpx.BaseTransport | None = None,
) -> pd.DataFrame:
    """Per-step quantiles of the action deltas, one row per (step, source), also for pruned steps.

    Columns: step, source, pruned (the raw records were dropped by retention), n_all (records with a
    finite delta), all_p10 ... all_p90 (their delta quantiles at the service's levels, NaN when none),
    n_pos, pos_p10 ... pos_p90 (the same over records with advantage > 0). One request: a step is one
    small row whatever it logged.
    """
    pd = _pandas()
    np = _numpy()
    if source not in (None, "loss", "probe"):
        raise ValueError(f"source must be 'loss', 'probe' or None, got {source!r}")
    with _session(base_url, token, timeout, transport) as http:
        run_id = _resolve(http, run, project)
        params = {"step_min": step_min, "step_max": step_max, "source": source}
        body = _get(
            http, f"/runs/{run_id}/actions/summary", {k: v for k, v in params.items() if v is not None}
        )
    levels = [float(level) for level in body["levels"]]
    names = [f"p{level * 100:g}" for level in levels]
    columns: dict[str, Any] = {
        "step": np.asarray(body["steps"], dtype=np.int64),
        "source": np.asarray(body["sources"], dtype=object),
        "pruned": np.asarray(body["pruned"], dtype=bool),
    }
    for group in ("all", "pos"):
        q = np.asarray(body[f"q_{group}"], dtype=np.float64).reshape(len(columns["step"]), len(levels))
        columns[f"n_{group}"] = np.asarray(body[f"n_{group}"], dtype=np.int64)
        columns |= {f"{group}_{name}": q[:, j] for j, name in enumerate(names)}
    frame = pd.DataFrame(columns)
    frame.attrs["run_id"] = run_id
    frame.attrs["levels"] = levels
    return frame


def _join_actions(pages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Pages as one, their columns concatenated in order."""
    np = _numpy()
    return {name: np.concatenate([p[name] for p in pages]) for name in ACTION_DTYPES}


def _action_arrays(reply: dict[str, Any]) -> dict[str, Any]:
    """The API's action columns as numpy arrays (wire strings 'NaN', 'Infinity' -> float)."""
    np = _numpy()
    return {name: np.asarray(reply[name], dtype=dtype) for name, dtype in ACTION_DTYPES.items()}


def fetch_runs(
    base_url: str,
    *,
    project: str | None = None,
    status: str | None = None,
    tag: str | None = None,
    token: str | None = None,
    timeout: float = 60.0,
    transport: httpx.BaseTransport | None = None,
) -> pd.DataFrame:
    """The runs the token can see (newest first), one row per run, indexed by run id."""
    pd = _pandas()
    filters = {k: v for k, v in {"project": project, "status": status, "tag": tag}.items() if v is not None}
    rows: dict[int, dict[str, Any]] = {}
    with _session(base_url, token, timeout, transport) as http:
        offset = 0
        while True:
            page = _get(http, "/runs", params={**filters, "limit": _RUNS_PAGE, "offset": offset})
            for r in page:
                rows.setdefault(int(r["id"]), r)  # a run created while paging shifts the offsets
            if len(page) < _RUNS_PAGE:
                break
            offset += _RUNS_PAGE
    columns = ["name", "project", "status", "phase", "last_step", "directive_policy", "tags"]
    times = ["created_at", "last_seen_at", "finished_at"]
    frame = pd.DataFrame(
        [[r.get(c) for c in columns + times] for r in rows.values()],
        index=pd.Index(list(rows), name="id", dtype="int64"),
        columns=columns + times,
    )
    for column in times:
        frame[column] = pd.to_datetime(frame[column], utc=True, format="ISO8601")
    frame["last_step"] = frame["last_step"].astype("Int64")
    return frame


def resolve_run(
    base_url: str,
    run: int | str,
    *,
    project: str | None = None,
    token: str | None = None,
    timeout: float = 60.0,
    transport: httpx.BaseTransport | None = None,
) -> int:
    """The id of a run given by id or name (checking that it exists and the token may read it)."""
    with _session(base_url, token, timeout, transport) as http:
        return _resolve(http, run, project)


def _windows(
    extents: Sequence[dict[str, Any]], step_min: int | None, step_max: int | None, page_points: int
) -> Iterator[tuple[int, int]]:
    """Consecutive, disjoint [lo, hi] step windows covering the range, each about page_points values.

    The window width assumes the points are spread evenly over the range, from the per-metric counts
    and step ranges the service reports; uneven runs only make some pages bigger than others.
    """
    if not extents:
        return
    lo = max(min(e["first_step"] for e in extents), step_min if step_min is not None else 0)
    hi = max(e["last_step"] for e in extents)
    if step_max is not None:
        hi = min(hi, step_max)
    if lo > hi:
        return
    points = sum(e["points"] for e in extents)
    span = max(e["last_step"] for e in extents) - min(e["first_step"] for e in extents) + 1
    width = max(1, math.floor(page_points * span / max(points, 1)))
    while lo <= hi:
        yield lo, min(hi, lo + width - 1)
        lo += width


def _resolve(http: httpx.Client, run: int | str, project: str | None) -> int:
    if isinstance(run, bool) or not isinstance(run, (int, str)):
        raise TypeError(f"run must be an id (int) or a name (str), not {type(run).__name__}")
    if isinstance(run, int):
        found = _get(http, f"/runs/{run}")
        if project is not None and found["project"] != project:
            raise RunNotFound(f"run {run} belongs to project {found['project']!r}, not {project!r}")
        return run
    params: dict[str, Any] = {"name": run, "limit": _RUNS_PAGE}
    if project is not None:
        params["project"] = project
    matches = _get(http, "/runs", params=params)
    if not matches:
        where = f" in project {project!r}" if project is not None else ""
        raise RunNotFound(f"no run named {run!r}{where} (that this token can see)")
    if len(matches) > 1:
        projects = ", ".join(sorted(m["project"] for m in matches))
        raise HistoryError(f"{len(matches)} runs are named {run!r} (projects: {projects}); pass project=")
    return int(matches[0]["id"])


@contextmanager
def _session(
    base_url: str, token: str | None, timeout: float, transport: httpx.BaseTransport | None
) -> Iterator[httpx.Client]:
    with Session(
        base_url, token=token, timeout=timeout, transport=transport, user_agent="lldmon-history/0.1"
    ) as session:
        yield session.http


def _get(http: httpx.Client, path: str, params: dict[str, Any] | None = None) -> Any:
    try:
        response = http.get(path, params=params)
    except httpx.HTTPError as exc:
        raise HistoryError(f"cannot reach {http.base_url}: {type(exc).__name__}: {exc}") from exc
    if response.is_success:
        return response.json()
    message = _error_message(response)
    if response.status_code == 401:
        hint = "" if "authorization" in http.headers else " (pass token=, see `lldmon token create`)"
        raise AccessDenied(f"{message}{hint}")
    if response.status_code == 403:
        raise AccessDenied(message)
    if response.status_code == 404:
        raise RunNotFound(message)
    raise HistoryError(f"GET {response.request.url.path}: HTTP {response.status_code}: {message}")


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return f"HTTP {response.status_code}: {response.text[:300]}"


def _numpy() -> Any:
    import numpy  # a dependency of pandas

    return numpy


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError(
            "trainer_hooks.history needs pandas: pip install pandas (the rest of lldmon does not)"
        ) from None
    return pandas

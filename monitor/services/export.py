"""`lldmon export`: a run's metric history as one wide file (CSV or Parquet), written atomically;
with `--actions`, its action records, one row per record (CSV, Parquet or JSON lines).

Shape: a `step` column (int64, ascending) and one float64 column per metric. NaN and +-inf are data
(collapse signals) and survive: Parquet stores them as IEEE floats, CSV as `nan`, `inf`, `-inf`.
A step at which a metric was not logged is kept apart from a logged NaN: an empty CSV cell, a Parquet
null. `pandas.read_csv(path)` and `pandas.read_parquet(path)` fold both into NaN; to keep them
apart read with `dtype_backend="pyarrow"` (CSV also with `engine="pyarrow", keep_default_na=False,
na_values=[""]`).

Action records are read in pages of at most `page_records` records through the query layer's `actions`
(or the API's `GET /runs/{id}/actions` in remote mode), each read going on after the last record's key
(`contracts.action_pages`, so a step larger than a page is read in parts), each page turned into numpy
columns and written as a whole (a Parquet row group, a block of CSV or JSON lines), so a long run is
neither one giant query nor one giant table in memory. Their non-finite values survive as in the metrics export (Parquet: IEEE
floats; CSV: `nan`, `inf`, `-inf`); JSON lines use the API's strings `"NaN"`, `"Infinity"`,
`"-Infinity"` (strict JSON has no bare NaN). Steps whose raw records retention pruned have none.

The file appears complete or not at all: it is written to a temporary file next to the target,
flushed to disk and renamed over it, so an error (or Ctrl-C) never leaves a truncated export behind
and never damages an existing file of that name.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from contracts.action_pages import DEFAULT_PAGE_RECORDS, MAX_ACTION_READ, ActionCursor, PagingUnsupported
from contracts.action_pages import action_pages as pages_of_records
from contracts.wire import ACTION_COLUMNS as WIRE_ACTION_COLUMNS
from contracts.wire import ACTION_FLOAT_COLUMNS
from monitor.domain import Principal, Series
from monitor.errors import InvalidInput
from monitor.importers.lldmon_export import PARQUET_METADATA_KEY
from monitor.services.tables import wide_table

if TYPE_CHECKING:  # the CLI's remote mode exports through an HTTP stand-in, without the store
    from monitor.services.query import QueryService

EXPORT_FORMATS: Final = ("csv", "parquet")
ACTION_EXPORT_FORMATS: Final = ("csv", "parquet", "jsonl")
ACTION_COLUMNS: Final = ("step", "source", *(c for c in WIRE_ACTION_COLUMNS if c not in ("step", "source")))
"""An exported action record: the wire's columns, keys first."""
ACTION_DTYPES: Final[dict[str, Any]] = {
    "step": np.int64,
    "source": np.str_,
    "traj_index": np.int64,
    "action_index": np.int64,
    "n_tokens": np.int64,
    "delta": np.float64,
    "old_logp_mean": np.float64,
    "advantage": np.float64,
    "reward": np.float64,
    "is_answer": np.bool_,
}

ActionReader = Callable[[int | None, int | None, str | None, int, ActionCursor | None], Mapping[str, Any]]
"""(step_min, step_max, source, limit, after) -> action columns ordered by (step, source, traj_index,
action_index), at most `limit` records, those after `after` if given: `QueryService.actions` or the
API's `GET /runs/{id}/actions`."""
ActionPage = dict[str, npt.NDArray[Any]]


@dataclass(frozen=True)
class ExportResult:
    path: Path
    format: str
    rows: int
    metrics: list[str]


@dataclass(frozen=True)
class ActionExportResult:
    path: Path
    format: str
    records: int
    steps: int


class ExportService:
    def __init__(self, query: QueryService) -> None:
        self.query = query

    def series(self, principal: Principal, run_id: int, metrics: Sequence[str] | None) -> list[Series]:
        """The run's series, all or `metrics` in the order given; an unknown name is an error."""
        self.query.runs.get(principal, run_id)
        if not metrics:
            return self.query.history(principal, run_id, None)
        wanted = list(dict.fromkeys(metrics))
        known = {m.name for m in self.query.metric_names(principal, run_id)}
        unknown = [name for name in wanted if name not in known]
        if unknown:
            hint = ", ".join(sorted(known)[:30]) or "none"
            raise InvalidInput(
                f"run {run_id} has no metric {', '.join(map(repr, unknown))} (it has: {hint})",
                field="metrics",
            )
        by_name = {s.name: s for s in self.query.history(principal, run_id, wanted)}
        return [by_name[name] for name in wanted if name in by_name]

    def csv(self, principal: Principal, run_id: int, metrics: Sequence[str] | None = None) -> str:
        return self.query.history_csv(self.series(principal, run_id, metrics), nonfinite="python")

    def write(
        self,
        principal: Principal,
        run_id: int,
        fmt: str,
        path: Path,
        metrics: Sequence[str] | None = None,
    ) -> ExportResult:
        """Write the export to `path` atomically (replacing an existing file only on success)."""
        if fmt not in EXPORT_FORMATS:
            raise InvalidInput(f"format must be one of {list(EXPORT_FORMATS)}, not {fmt!r}", field="format")
        run = self.query.runs.get(principal, run_id)
        series = self.series(principal, run_id, metrics)
        if fmt == "csv":
            data = self.query.history_csv(series, nonfinite="python").encode()
            write_atomically(path, lambda f: f.write(data))
            rows = len(set().union(*(s.steps for s in series)))
        else:
            table = arrow_table(series, {"run_id": run.id, "run": run.name, "project": run.project})
            pq = _pyarrow_parquet()
            write_atomically(path, lambda f: pq.write_table(table, f))
            rows = table.num_rows
        return ExportResult(path=path, format=fmt, rows=rows, metrics=[s.name for s in series])

    def write_actions(
        self,
        principal: Principal,
        run_id: int,
        fmt: str,
        path: Path,
        *,
        step_min: int | None = None,
        step_max: int | None = None,
        source: str | None = None,
        read: ActionReader | None = None,
        page_records: int = DEFAULT_PAGE_RECORDS,
    ) -> ActionExportResult:
        """Write the run's action records (one row each, ACTION_COLUMNS) to `path` atomically.

        `read` defaults to this database's query layer; the CLI's remote mode passes the API's."""
        if fmt not in ACTION_EXPORT_FORMATS:
            raise InvalidInput(
                f"format must be one of {list(ACTION_EXPORT_FORMATS)}, not {fmt!r}", field="format"
            )
        run = self.query.runs.get(principal, run_id)
        pages = self.action_pages(principal, run_id, step_min, step_max, source, read, page_records)
        counted = _Counted(pages)
        if fmt == "parquet":
            pq = _pyarrow_parquet()
            meta = {"run_id": run.id, "run": run.name, "project": run.project}
            write_atomically(path, lambda f: _write_parquet(pq, f, counted, meta))
        else:
            render = actions_csv if fmt == "csv" else actions_jsonl
            header = actions_csv_header() if fmt == "csv" else ""

            def write_text(f: IO[bytes]) -> None:
                f.write(header.encode())
                for page in counted:
                    f.write(render(page).encode())

            write_atomically(path, write_text)
        return ActionExportResult(path=path, format=fmt, records=counted.records, steps=counted.steps)

    def action_pages(
        self,
        principal: Principal,
        run_id: int,
        step_min: int | None = None,
        step_max: int | None = None,
        source: str | None = None,
        read: ActionReader | None = None,
        page_records: int = DEFAULT_PAGE_RECORDS,
    ) -> Iterator[ActionPage]:
        """The run's action records as numpy column pages (see `action_pages`)."""
        if read is None:

            def read(
                lo: int | None, hi: int | None, src: str | None, limit: int, after: ActionCursor | None
            ) -> Mapping[str, Any]:
                return self.query.actions(principal, run_id, lo, hi, src, limit, after)

        return action_pages(read, step_min, step_max, source, page_records)


def action_pages(
    read: ActionReader,
    step_min: int | None,
    step_max: int | None,
    source: str | None,
    page_records: int = DEFAULT_PAGE_RECORDS,
) -> Iterator[ActionPage]:
    """Every action record of the step range once, in order, as typed pages of at most `page_records`
    records (`contracts.action_pages.action_pages`: a step may span pages); a bad page size, or a step
    larger than a page on a service that cannot read a step in parts, is InvalidInput on `limit`."""
    if not 1 <= page_records <= MAX_ACTION_READ:
        raise InvalidInput(f"page_records must be in 1..{MAX_ACTION_READ}, not {page_records}", field="limit")
    try:
        yield from pages_of_records(
            lambda lo, hi, src, limit, after: action_arrays(read(lo, hi, src, limit, after)),
            step_min,
            step_max,
            source,
            page_records,
        )
    except PagingUnsupported as exc:
        raise InvalidInput(str(exc), field="limit") from None


def action_arrays(columns: Mapping[str, Any]) -> ActionPage:
    """Action columns (lists from the query layer or the API's JSON, or arrays) as typed numpy arrays;
    None and the wire strings 'NaN', 'Infinity', '-Infinity' become float NaN/inf."""
    return {name: np.asarray(columns[name], dtype=ACTION_DTYPES[name]) for name in ACTION_COLUMNS}


class _Counted:
    """Pages passed through, counting records and distinct steps (pages come in step order; a step
    that spans pages counts once)."""

    def __init__(self, pages: Iterator[ActionPage]) -> None:
        self.pages = pages
        self.records = 0
        self.steps = 0
        self._last_step: int | None = None

    def __iter__(self) -> Iterator[ActionPage]:
        for page in self.pages:
            steps = page["step"]
            self.records += int(steps.size)
            self.steps += int(np.unique(steps).size) - int(self._last_step == int(steps[0]))
            self._last_step = int(steps[-1])
            yield page


def actions_csv_header() -> str:
    return ",".join(ACTION_COLUMNS) + "\n"


def actions_csv(page: ActionPage) -> str:
    """CSV lines of a page (no header): floats as shortest round-trip text (`1.0`, not `1`), non-finite
    as nan, inf, -inf (what `lldmon export` writes for metrics), is_answer as true/false."""
    return _lines(page, "", ",", "\n", {"nan": "nan", "inf": "inf", "-inf": "-inf"}, quote="")


def actions_jsonl(page: ActionPage) -> str:
    """One JSON object per record and line; non-finite floats as the API's strings."""
    return _lines(page, "{", ",", "}\n", {"nan": '"NaN"', "inf": '"Infinity"', "-inf": '"-Infinity"'}, '"')


def _lines(
    page: ActionPage, start: str, between: str, end: str, nonfinite: dict[str, str], quote: str
) -> str:
    """The page as text lines, one per record, built by Arrow's string kernels over whole columns (no
    Python object per value); JSON lines when `start` is "{" (each value preceded by its key). Without
    pyarrow (it comes with the formats extra) numpy builds the same values, about 4x slower."""
    if not page["step"].size:
        return ""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
    except ModuleNotFoundError:
        return _lines_numpy(page, start, between, end, nonfinite, quote)
    table = _arrow_page(page)
    parts: list[Any] = []
    for name in ACTION_COLUMNS:
        column = table.column(name)
        if name == "source":
            text = pc.binary_join_element_wise(quote, column, quote, "")
        elif name == "is_answer":
            text = pc.if_else(column, "true", "false")
        else:
            text = pc.cast(column, pa.string())
        if name in _FLOAT_COLUMNS:  # 1 -> 1.0 (a float column stays float when read back), -0 -> -0.0
            integral = pc.match_substring_regex(text, r"^-?[0-9]+$")
            text = pc.if_else(integral, pc.binary_join_element_wise(text, ".0", ""), text)
            for bad, wire in (
                (pc.is_nan(column), nonfinite["nan"]),
                (pc.equal(column, math.inf), nonfinite["inf"]),
                (pc.equal(column, -math.inf), nonfinite["-inf"]),
            ):
                text = pc.if_else(bad, wire, text)
        key = json.dumps(name) + ":" if start == "{" else ""
        parts += [(between if parts else start) + key, text]
    lines = pc.binary_join_element_wise(*parts, end, "").combine_chunks()
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32, count=len(lines) + 1, offset=4 * lines.offset)
    data: bytes = lines.buffers()[2].to_pybytes()
    return data[int(offsets[0]) : int(offsets[-1])].decode()


def _lines_numpy(
    page: ActionPage, start: str, between: str, end: str, nonfinite: dict[str, str], quote: str
) -> str:
    """`_lines` with numpy string arrays (the same values; floats in numpy's shortest repr)."""
    line: npt.NDArray[Any] | None = None
    for name in ACTION_COLUMNS:
        column = page[name]
        if name == "source":
            text = quote + column.astype(object) + quote
        elif name == "is_answer":
            text = np.where(column, "true", "false").astype(object)
        else:
            text = column.astype(str).astype(object)
        if name in _FLOAT_COLUMNS:
            text[np.isnan(column)] = nonfinite["nan"]
            text[column == np.inf] = nonfinite["inf"]
            text[column == -np.inf] = nonfinite["-inf"]
        key = json.dumps(name) + ":" if start == "{" else ""
        line = (start + key + text) if line is None else line + (between + key) + text
    assert line is not None
    return "".join((line + end).tolist())


def _arrow_page(page: ActionPage) -> Any:
    import pyarrow as pa

    arrays = [
        _source_array(page[name])
        if name == "source"
        else pa.array(page[name], type=getattr(pa, _ARROW_TYPES[name])())
        for name in ACTION_COLUMNS
    ]
    return pa.Table.from_arrays(arrays, schema=action_schema())


def _source_array(source: npt.NDArray[Any]) -> Any:
    """The source column as Arrow strings, taken from its two values (10x faster than converting
    numpy's fixed-width unicode)."""
    import pyarrow as pa

    probe = source == "probe"
    if not (probe | (source == "loss")).all():  # not from the database (its CHECK allows only these)
        return pa.array(source.astype(object), type=pa.string())
    return pa.array(["loss", "probe"]).take(pa.array(probe.astype(np.int8)))


_FLOAT_COLUMNS: Final = frozenset(ACTION_FLOAT_COLUMNS)
_ARROW_TYPES: Final[dict[str, str]] = {
    "step": "int64",
    "source": "string",
    "traj_index": "int64",
    "action_index": "int64",
    "n_tokens": "int64",
    "delta": "float64",
    "old_logp_mean": "float64",
    "advantage": "float64",
    "reward": "float64",
    "is_answer": "bool_",
}


def action_schema(run: dict[str, Any] | None = None) -> Any:
    """The Parquet/Arrow schema of an action export (no nulls: NaN is a float value)."""
    import pyarrow as pa

    fields = [pa.field(name, getattr(pa, _ARROW_TYPES[name])(), nullable=False) for name in ACTION_COLUMNS]
    metadata = {PARQUET_METADATA_KEY: json.dumps(run).encode()} if run is not None else None
    return pa.schema(fields, metadata=metadata)


def _write_parquet(pq: Any, f: IO[bytes], pages: Iterable[ActionPage], run: dict[str, Any]) -> None:
    """One row group per page; a run without records is a valid file with the schema and no rows."""
    import pyarrow as pa

    schema = action_schema(run)
    with pq.ParquetWriter(f, schema) as writer:
        for page in pages:
            table = _arrow_page(page)
            writer.write_table(pa.Table.from_arrays(table.columns, schema=schema))


def arrow_table(series: Sequence[Series], run: dict[str, Any]) -> Any:
    """A pyarrow Table: `step` int64 and one float64 column per metric, null where not logged."""
    import pyarrow as pa

    table = wide_table(series)
    columns = [pa.array(table.steps, type=pa.int64())]
    columns += [
        pa.array(table.values[:, j], type=pa.float64(), mask=~table.logged[:, j])
        for j in range(len(table.names))
    ]
    schema = pa.schema(
        [pa.field("step", pa.int64(), nullable=False)]
        + [pa.field(name, pa.float64()) for name in table.names],
        metadata={PARQUET_METADATA_KEY: json.dumps(run).encode()},
    )
    return pa.Table.from_arrays(columns, schema=schema)


def write_atomically(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Call `write` on a temporary file next to `path`, fsync it and rename it over `path`.

    On any error the temporary file is removed and `path` is left as it was.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow is part of the formats extra
        raise InvalidInput(
            "Parquet export needs pyarrow: pip install 'lldmon[formats]' (or pip install pyarrow)",
            field="format",
        ) from None
    return pq

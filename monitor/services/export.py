"""`lldmon export`: a run's metric history as one wide file (CSV or Parquet), written atomically.

Shape: a `step` column (int64, ascending) and one float64 column per metric. NaN and +-inf are data
(collapse signals) and survive: Parquet stores them as IEEE floats, CSV as `nan`, `inf`, `-inf`.
A step at which a metric was not logged is kept apart from a logged NaN: an empty CSV cell, a Parquet
null. `pandas.read_csv(path)` and `pandas.read_parquet(path)` fold both into NaN; to keep them
apart read with `dtype_backend="pyarrow"` (CSV also with `engine="pyarrow", keep_default_na=False,
na_values=[""]`).

The file appears complete or not at all: it is written to a temporary file next to the target,
flushed to disk and renamed over it, so an error (or Ctrl-C) never leaves a truncated export behind
and never damages an existing file of that name.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

from monitor.domain import Principal, Series
from monitor.errors import InvalidInput
from monitor.importers.lldmon_export import PARQUET_METADATA_KEY
from monitor.services.query import QueryService, wide_table

EXPORT_FORMATS: Final = ("csv", "parquet")


@dataclass(frozen=True)
class ExportResult:
    path: Path
    format: str
    rows: int
    metrics: list[str]


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


def arrow_table(series: Sequence[Series], run: dict[str, Any]) -> Any:
    """A pyarrow Table: `step` int64 and one float64 column per metric, null where not logged."""
    import json

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
    except ImportError:  # pragma: no cover - pyarrow is part of the server extra
        raise InvalidInput(
            "Parquet export needs pyarrow: pip install 'lldmon[server]' (or pip install pyarrow)",
            field="format",
        ) from None
    return pq

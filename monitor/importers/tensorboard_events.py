"""TensorBoard event files (`events.out.tfevents.*`), read with the `tensorboard` package.

Written by verl's `tensorboard` logger (`SummaryWriter.add_scalar(key, value, step)` with verl's names) or
transformers' TensorBoard callback (`train/<name>`); names are mapped like W&B columns. Scalars come as
`simple_value` (torch's SummaryWriter, TF1) or as a 0-d tensor of the `scalars` plugin (TF2 summaries);
histograms, images and text are not metrics and are skipped. A directory stands for every event file under
it, oldest first by the timestamp in the file name (a resumed run writes a new file: the later one wins).
Diagnostics name the record number (event files are binary, there are no lines). A file cut off mid-record
or with a checksum error keeps the records before it, and the rest is reported.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

from contracts.trainer_keys import TRACKER
from monitor.importers.parsed import FileColumns, ParsedLog, Paths, as_path_list, merge_columns
from monitor.importers.reading import (
    Diagnostics,
    LogImportError,
    ProgressCallback,
    StepRecords,
    parse_number,
)

EVENT_FILE_MARKER: Final = "tfevents"
RECORD_OVERHEAD: Final = 16
"""TFRecord framing around each event: length (8), its CRC (4), the data's CRC (4)."""
SCALARS_PLUGIN: Final = "scalars"

_INSTALL_HINT: Final = (
    "reading TensorBoard files needs the tensorboard package: pip install 'lldmon[formats]'"
)


def _tensorboard() -> Any:
    """The tensorboard modules used here, imported on first use (an optional, heavy dependency)."""
    try:
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
        from tensorboard.compat.proto import event_pb2
        from tensorboard.util import tensor_util
    except ImportError as exc:
        raise LogImportError(f"{_INSTALL_HINT} ({exc})") from None
    return RawEventFileLoader, event_pb2, tensor_util


def event_files(path: str | os.PathLike[str]) -> list[str]:
    """The event file itself, or the event files under a directory, oldest first."""
    root = Path(path)
    if not root.is_dir():
        return [os.fspath(root)]
    found = [p for p in root.rglob(f"*{EVENT_FILE_MARKER}*") if p.is_file()]
    return [os.fspath(p) for p in sorted(found, key=_written_at)]


def _written_at(path: Path) -> tuple[int, str]:
    """`events.out.tfevents.<unix time>.<host>...`: the creation time, then the name."""
    parts = path.name.split(".")
    i = parts.index(EVENT_FILE_MARKER) if EVENT_FILE_MARKER in parts else -1
    stamp = parts[i + 1] if 0 <= i < len(parts) - 1 else ""
    return (int(stamp) if stamp.isascii() and stamp.isdigit() else 0, os.fspath(path))


def parse_event_file(
    path: str, diagnostics: Diagnostics, progress: ProgressCallback | None = None
) -> FileColumns:
    """Step records (canonical names) of one event file."""
    loader_cls, event_pb2, tensor_util = _tensorboard()
    records = StepRecords(path, diagnostics, TRACKER)
    scalar_tags: set[str] = set()
    size = os.path.getsize(path)
    consumed = 0
    number = 0
    for number, record in enumerate(loader_cls(path).Load(), start=1):
        consumed += len(record) + RECORD_OVERHEAD
        if progress is not None:
            progress(len(record) + RECORD_OVERHEAD)
        try:
            event = event_pb2.Event.FromString(record)
        except Exception:  # protobuf's DecodeError; the record passed its CRC but is no Event
            diagnostics.report(path, number, f"record {number} is not a TensorBoard event")
            continue
        if not event.HasField("summary"):
            continue
        if event.step < 0:
            diagnostics.report(path, number, f"negative step {event.step}")
            continue
        for value in event.summary.value:
            scalar = _scalar(value, scalar_tags, tensor_util)
            if scalar is not None:
                records.add(int(event.step), number, value.tag, scalar)
    if consumed < size:
        if progress is not None:
            progress(size - consumed)
        diagnostics.report(
            path,
            number + 1,
            f"record {number + 1} is cut off or fails its checksum (byte {consumed} of {size}); "
            "the rest of the file is not read",
        )
    return records.columns()


def _scalar(value: Any, scalar_tags: set[str], tensor_util: Any) -> float | None:
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind != "tensor":
        return None
    # TF2 writes the plugin metadata with the first value of a tag only.
    if value.metadata.plugin_data.plugin_name == SCALARS_PLUGIN:
        scalar_tags.add(value.tag)
    if value.tag not in scalar_tags:
        return None
    array = tensor_util.make_ndarray(value.tensor)
    if array.size != 1:
        return None
    return parse_number(array.reshape(()).item())


def load_tensorboard(
    paths: Paths, *, strict: bool = False, progress: ProgressCallback | None = None
) -> ParsedLog:
    """Columns of one run from event files or directories of them, in order (a later file wins per step)."""
    diagnostics = Diagnostics(strict)
    files = [f for p in as_path_list(paths) for f in event_files(p)]
    if not files:
        raise LogImportError(f"no TensorBoard event files (*{EVENT_FILE_MARKER}*) under {paths}")
    return merge_columns([parse_event_file(f, diagnostics, progress) for f in files], diagnostics.items)

"""TensorBoard event files -> canonical metric columns (files written here with tensorboard's writer)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.compat.proto.summary_pb2 import HistogramProto, SummaryMetadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util

from contracts import metrics as M
from monitor.importers import MalformedLog, load_log, load_tensorboard

Value: Any = summary_pb2.Summary.Value


def simple(tag: str, value: float) -> Any:
    """What torch's SummaryWriter.add_scalar (verl's tensorboard logger) writes."""
    return Value(tag=tag, simple_value=value)


def tensor(tag: str, value: float, first: bool) -> Any:
    """What TF2 summaries write: a 0-d tensor, the plugin metadata only with a tag's first value."""
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))
    proto = tensor_util.make_tensor_proto(value)
    return Value(tag=tag, tensor=proto, metadata=metadata) if first else Value(tag=tag, tensor=proto)


def write_events(directory: Path, stamp: int, events: list[tuple[int, list[Any]]]) -> Path:
    """One event file named as TensorBoard names them, with the given creation time."""
    directory.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(directory))
    for step, values in events:
        writer.add_event(event_pb2.Event(step=step, wall_time=1.0, summary=summary_pb2.Summary(value=values)))
    writer.close()
    (written,) = [
        p for p in directory.iterdir() if p.name.startswith("events.out.tfevents") and "." in p.name
    ]
    target = directory / f"events.out.tfevents.{stamp}.host.{stamp}"
    written.rename(target)
    return target


def test_scalars_of_both_writers(tmp_path: Path) -> None:
    histo = Value(tag="weights", histo=HistogramProto(min=0.0, max=1.0, num=2.0))
    path = write_events(
        tmp_path / "run",
        1_700_000_000,
        [
            (
                0,
                [
                    simple("actor/entropy", 0.5),
                    simple("critic/score/mean", 0.1),
                    histo,
                    tensor("lr", 1e-6, True),
                ],
            ),
            (
                1,
                [
                    simple("actor/entropy", math.nan),
                    simple("actor/grad_norm", math.inf),
                    tensor("lr", 2e-6, False),
                ],
            ),
            (2, [simple("train/reward", 0.7), simple("train/grad_norm", -math.inf), simple("ü/λ", 3.0)]),
        ],
    )
    log = load_tensorboard(path)
    assert log.steps.tolist() == [0, 1, 2] and log.diagnostics == ()
    assert set(log.values) == {M.ENTROPY_MEAN, M.REWARD_MEAN, M.GRAD_NORM, "lr", "ü/λ"}  # no histogram
    assert log.values[M.REWARD_MEAN][[0, 2]].tolist() == [pytest.approx(0.1), pytest.approx(0.7)]
    assert math.isnan(log.values[M.ENTROPY_MEAN][1]) and log.present[M.ENTROPY_MEAN][1]
    assert log.values[M.GRAD_NORM][1:].tolist() == [math.inf, -math.inf]
    assert log.values["lr"][:2].tolist() == [pytest.approx(1e-6), pytest.approx(2e-6)]


def test_directory_of_a_resumed_run_later_file_wins(tmp_path: Path) -> None:
    run = tmp_path / "run"
    # names sort the other way round: the creation time in the name decides
    write_events(run, 999_999_999, [(s, [simple("loss", 1.0)]) for s in range(4)])
    write_events(run / "resumed", 1_000_000_000, [(s, [simple("loss", 2.0)]) for s in range(2, 6)])
    log = load_log([run])  # auto: a directory of event files
    assert log.steps.tolist() == list(range(6))
    assert log.values[M.LOSS].tolist() == [1.0, 1.0, 2.0, 2.0, 2.0, 2.0]


def test_cut_off_file_keeps_the_records_before(tmp_path: Path) -> None:
    path = write_events(tmp_path, 1_700_000_000, [(s, [simple("loss", s / 10)]) for s in range(5)])
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # the trainer was killed while writing the last event
    calls: list[int] = []
    log = load_tensorboard(path, progress=calls.append)
    assert log.steps.tolist() == [0, 1, 2, 3]
    # record 1 is the file_version event; records 2-5 hold steps 0-3; record 6 is cut off
    (diagnostic,) = log.diagnostics
    assert diagnostic.line == 6
    assert str(diagnostic).startswith(f"{path}:6: record 6 is cut off or fails its checksum (byte ")
    assert sum(calls) == len(data) - 7
    with pytest.raises(MalformedLog, match=rf"^{path}:6: record 6 is cut off"):
        load_tensorboard(path, strict=True)

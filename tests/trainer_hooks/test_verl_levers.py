"""verl's path for the levers (issue 15), without verl: the driver's `attach` writes every new directive
(not only LLDS changes) to the directive file; `DirectiveLevers` in verl's driver loop returns each
checkpoint/stop request once and the acknowledgement to merge into the metrics verl logs; the workers'
LLDS reader still reads the file."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import trainer_hooks.verl as tv
from contracts.directive import APPLIED_VERSION_METRIC, Directive, Levers, LLDSDirective
from trainer_hooks._warn import WarnOnce
from trainer_hooks.verl.directive import DirectiveFile


class FakeTracking:
    """What `attach` needs of `verl.utils.tracking.Tracking`: a `log(data, step)`."""

    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, Any]]] = []

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self.logged.append((step, dict(data)))


class ClientLike:
    """A sink with the client's `directive` (as the service's acknowledgements would set it)."""

    def __init__(self) -> None:
        self.directive = Directive()
        self.calls: list[tuple[int, dict[str, float]]] = []

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.calls.append((step, dict(metrics)))


def test_directive_file_carries_requests_to_the_driver_loop(tmp_path: Path) -> None:
    path = tmp_path / "lldmon" / "directive.json"
    tracking, sink = FakeTracking(), ClientLike()
    tv.attach(tracking, sink, on_directive=tv.directive_file_writer(path))
    levers = tv.DirectiveLevers(path)
    assert levers.take() == Levers()  # no file yet: nothing to do

    llds = LLDSDirective(True, 0.2)
    sink.directive = Directive(llds, version=1, source="detector")
    tracking.log({"actor/entropy": 1.0}, step=1)
    # A checkpoint request changes neither LLDS switch nor lambda: it still reaches the file.
    sink.directive = Directive(llds, version=2, source="manual", checkpoint=2)
    tracking.log({"actor/entropy": 1.0}, step=2)
    assert json.loads(path.read_text())["checkpoint"] == 2
    todo = levers.take()
    assert todo == Levers(checkpoint=True, acknowledge=2)
    assert levers.take() == Levers()  # once per request

    # The documented loop merges the acknowledgement into verl's metrics; it reaches the sink as is.
    metrics = {"actor/entropy": 1.0, **todo.metrics()}
    tracking.log(metrics, step=3)
    assert sink.calls[-1] == (3, {"entropy/mean": 1.0, APPLIED_VERSION_METRIC: 2.0})

    sink.directive = Directive(llds, version=3, source="manual", checkpoint=2, stop=3, stop_reason="budget")
    tracking.log({"actor/entropy": 1.0}, step=4)
    assert levers.take() == Levers(stop=True, stop_reason="budget", acknowledge=3)
    # The workers' LLDS reader reads the same file.
    assert DirectiveFile().read(str(path), WarnOnce(logging.getLogger("test"))) == (True, 0.2)


def test_a_bad_directive_file_means_nothing_to_do(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "directive.json"
    path.write_text('{"llds": {"enabled": true, "lam": 0.2}, "version": 2, "stop": "now"}')
    levers = tv.DirectiveLevers(path)
    with caplog.at_level(logging.WARNING, "lldmon.verl"):
        assert levers.take() == Levers()
        path.write_text("{not json")
        assert levers.take() == Levers()
    assert len([r for r in caplog.records if "directive file" in r.getMessage()]) == 1  # warned once
    assert tv.write_directive(path, {"stop": 1}) is False  # malformed: nothing written
    assert path.read_text() == "{not json"

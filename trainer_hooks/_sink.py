"""The one `MetricSink` protocol: what every adapter (TRL, verl, plain PyTorch) sends to."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

__all__ = ["MetricSink", "ScalarSink"]


class ScalarSink(Protocol):
    """The least a sink must do: take one step's scalar metrics (verl's `attach` needs no more)."""

    def log(self, step: int, metrics: Mapping[str, float], /) -> object:
        """Queue scalar metrics (canonical or pass-through names) of one step."""


class MetricSink(ScalarSink, Protocol):
    """`trainer_hooks.client.MonitorClient`, or any object with these methods.

    Parameters are positional-only so implementations may name them freely. An optional `directive`
    property (the client's) is duck-typed where LLDS follows the service, so it is not part of the
    protocol.
    """

    def log_actions(self, step: int, columns: Mapping[str, Sequence[Any]], /) -> object:
        """Queue columnar action records (keys `contracts.wire.ACTION_COLUMNS`) of one step."""

    def flush(self, timeout: float, /) -> object:
        """Block until queued data is sent or `timeout` seconds passed."""

    def close(self) -> object:
        """Flush and release resources."""


if TYPE_CHECKING:
    from trainer_hooks.client import MonitorClient

    def _client_is_a_sink(client: MonitorClient) -> MetricSink:  # checked by mypy only
        return client

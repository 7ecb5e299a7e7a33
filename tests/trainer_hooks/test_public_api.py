"""The public surface of the trainer-side packages is explicit: `__all__` is pinned and resolves.

A name leaving or joining `__all__` is an API change users see (httpx pins its surface the same way).
"""

from __future__ import annotations

import importlib

import pytest

PUBLIC = {
    "trainer_hooks.trl": [
        "LLDMonitorCallback",
        "MetricSink",
        "MonitoredGRPOTrainer",
        "TRL_TO_CANONICAL",
        "auto_anchor_size",
        "auto_probe_size",
        "map_trl_logs",
    ],
    "trainer_hooks.client": [
        "ClientStats",
        "Directive",
        "LLDSDirective",
        "Levers",
        "MonitorClient",
        "RetryPolicy",
    ],
    "trainer_hooks.anchors": ["AnchorBatch", "AnchorSet"],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_api_is_pinned(module: str) -> None:
    if module == "trainer_hooks.trl":
        pytest.importorskip("trl")
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PUBLIC[module])
    for name in mod.__all__:
        assert getattr(mod, name) is not None, name

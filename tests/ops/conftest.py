"""Ops tests need Prometheus' binaries (Debian's `prometheus` package: `prometheus`, `promtool`)."""

from __future__ import annotations

import os
import shutil

import pytest


def require_binary(name: str) -> str:
    """The path of `name`; skips without it on a developer machine, fails in CI (`CI` or
    LLDMON_REQUIRE_PROMETHEUS set: .ci/run installs it), so a missing binary is never a silent skip."""
    path = shutil.which(name)
    if path is not None:
        return path
    message = f"{name} is not installed (apt-get install prometheus)"
    if os.environ.get("CI") or os.environ.get("LLDMON_REQUIRE_PROMETHEUS"):
        pytest.fail(message)
    pytest.skip(message)

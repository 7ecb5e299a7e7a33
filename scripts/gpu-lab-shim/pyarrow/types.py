"""Import-only stand-in for `pyarrow.types` (see ../README.md): every function raises."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"pyarrow.types.{name} is not available: this is the GPU lab's stand-in (scripts/gpu-lab-shim)"
        )

    return missing

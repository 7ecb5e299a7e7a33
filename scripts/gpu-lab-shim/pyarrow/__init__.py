"""Import-only stand-in for pyarrow on the GPU lab's bare machine (see ../README.md).

TRL's `data_utils` imports pyarrow for sequence packing, which GRPO never calls; its annotations
(`pa.Table`, `pa.Array`) are evaluated at import, so any attribute is a placeholder class that cannot
be instantiated. The version is below every minimum, so pandas and others treat pyarrow as absent.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.0.0+lldmon.gpu.lab.stand.in"


class _Missing:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "pyarrow is not available: this is the GPU lab's stand-in (scripts/gpu-lab-shim)"
        )


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (_Missing,), {})

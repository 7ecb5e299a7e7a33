"""HTTP layer: routes, request/response schemas, error mapping. `create_app(settings)` builds it.

The package imports `create_app` (FastAPI, SQLAlchemy) only when it is asked for: the CLI's remote mode
prints the API's response schemas (`monitor.api.schemas`) in an install without the server extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monitor.api.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from monitor.api.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

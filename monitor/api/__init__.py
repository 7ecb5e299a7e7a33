"""HTTP layer: routes, request/response schemas, error mapping. `create_app(settings)` builds it."""

from monitor.api.app import create_app

__all__ = ["create_app"]

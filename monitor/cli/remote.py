"""The CLI's remote mode: a service state that works over a lldmon service's HTTP API.

`RemoteState` has the same `runs`, `query`, `alerts` and `liveness` methods the commands call on the
local state, and returns the same domain objects, so a command is one code path for both modes and
prints the same output for the same run. The bearer token decides the project scope (the service
enforces it). HTTP errors come back as the domain errors the service raised (404 -> NotFound, 422 ->
InvalidInput, ...), so the commands turn them into the same one-line messages and exit codes as
locally; an unreachable service is a ServiceUnavailable naming the URL.

Every answer is decoded in one place, `Api.decoded`: the lldmon API answers JSON of known shapes, errors
included, so an answer that is not JSON (an HTML page, a proxy's error page, an empty body) or JSON of
another shape means the URL is not an lldmon API (a dashboard URL, another server on the port): a
`NotAnApi` naming the URL and where the API would be, which the commands print as one line (exit 1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar, overload

import httpx

from contracts.directive import Directive, LLDSDirective, parse_directive
from contracts.wire import decode_float
from lldmon_client import Reply, Session
from lldmon_client.answers import json_body, non_json_kind, not_an_api_message
from monitor.domain import (
    AlertInfo,
    DeliveryInfo,
    DirectiveInfo,
    Liveness,
    MetricLast,
    MetricSummary,
    PhaseEventInfo,
    Principal,
    RollbackInfo,
    RunFilter,
    RunInfo,
    RunSummary,
    Series,
)
from monitor.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    LLDMonError,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    Unauthorized,
)

if TYPE_CHECKING:
    from monitor.ports import ServicePort

DEFAULT_TIMEOUT: Final = 30.0
_ERRORS: Final[dict[int, type[LLDMonError]]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: InvalidInput,
    503: ServiceUnavailable,
}


class NotAnApi(LLDMonError):
    """The URL answered, but not as an lldmon API does (not JSON, or JSON of another shape)."""

    status_code = 502
    code = "not_an_api"


T = TypeVar("T")

_SHAPE_ERRORS: Final = (KeyError, TypeError, ValueError, AttributeError, IndexError)
"""What a decoder raises on JSON of another shape (a missing key, a list where an object should be)."""


class Api:
    """An httpx client on the service (`lldmon_client.Session`: the URL taken as given, the bearer
    token) whose non-2xx answers raise the matching domain error. `session` sends batches
    (`lldmon_client.Uploader`) through the same connection."""

    def __init__(
        self,
        url: str,
        token: str | None,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.strip()
        self.session = Session(url, token=token, timeout=timeout, transport=transport)
        self.base_url = self.session.base_url
        self.has_token = self.session.has_token
        self.http = self.session.http

    def close(self) -> None:
        self.session.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The response, whatever its status; a transport failure raises ServiceUnavailable."""
        try:
            return self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ServiceUnavailable(f"cannot reach {self.base_url}: {type(exc).__name__}: {exc}") from None

    def failure(self, reply: Reply) -> LLDMonError:
        """The domain error of an answer that is no success (`lldmon_client.Reply`): ServiceUnavailable
        when there was none, else `error` of it."""
        if reply.response is None:
            return ServiceUnavailable(f"cannot reach {self.base_url}: {reply.error}")
        return self.error(reply.response)

    def acknowledged(self, reply: Reply) -> dict[str, Any]:
        """The JSON object a successful `reply` carries; the domain error of any other, and NotAnApi
        for a success that is not the API's JSON (another server's page)."""
        if reply.response is None:
            raise self.failure(reply)
        return self.decoded(reply.response, api_object)

    def response(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The successful response; a transport failure or an error status raises an LLDMonError."""
        return self.check(self.request(method, path, **kwargs))

    def check(self, response: httpx.Response) -> httpx.Response:
        """`response` if it is a success, else the domain error its status and body name."""
        if response.is_success:
            return response
        raise self.error(response)

    def error(self, response: httpx.Response) -> LLDMonError:
        """The domain error an error `response` stands for: the one its status and JSON body name, or
        NotAnApi when the body is not JSON (the API's errors are JSON too: this is another server)."""
        if json_body(response) is None:
            return self.not_an_api(response, non_json_kind(response))
        message, field = _error_of(response)
        if response.status_code == 401:
            message += " (pass --token or set LLDMON_TOKEN)" if not self.has_token else " (check --token)"
        error = _ERRORS.get(response.status_code, LLDMonError)
        if error is LLDMonError:
            message = f"HTTP {response.status_code} from {self.base_url}: {message}"
        return error(message, field=field)

    @overload
    def json(self, method: str, path: str, decode: Callable[[Any], T], **kwargs: Any) -> T: ...
    @overload
    def json(self, method: str, path: str, decode: None = None, **kwargs: Any) -> Any: ...
    def json(self, method: str, path: str, decode: Callable[[Any], Any] | None = None, **kwargs: Any) -> Any:
        """The decoded body of a successful answer (`decode(body)`, or the body as parsed)."""
        return self.decoded(self.response(method, path, **kwargs), decode)

    @overload
    def decoded(self, response: httpx.Response, decode: Callable[[Any], T]) -> T: ...
    @overload
    def decoded(self, response: httpx.Response, decode: None = None) -> Any: ...
    def decoded(self, response: httpx.Response, decode: Callable[[Any], Any] | None = None) -> Any:
        """`decode` applied to the JSON body of a successful `response`; an error status, a body that is
        not JSON or JSON that `decode` cannot read (another server's shapes) raises an LLDMonError."""
        self.check(response)
        body = json_body(response)
        if body is None:
            raise self.not_an_api(response, non_json_kind(response))
        try:
            return body if decode is None else decode(body)
        except _SHAPE_ERRORS as exc:
            raise self.not_an_api(response, f"JSON without {_missing(exc)}") from None

    def not_an_api(self, response: httpx.Response, kind: str) -> NotAnApi:
        """One line: which URL answered what, and where the API would be."""
        return NotAnApi(not_an_api_message(self.url, self.base_url, response, kind))


def _missing(exc: BaseException) -> str:
    """What a decoder missed: `the key 'id'` or the type error's words."""
    if isinstance(exc, KeyError):
        return f"the key {exc.args[0]!r}" if exc.args else "an expected key"
    return f"the expected shape: {type(exc).__name__}: {exc}"[:200]


def list_of(decode: Callable[[Any], Any]) -> Callable[[Any], list[Any]]:
    """A decoder of a JSON array whose items `decode` reads (an object where a list belongs is a
    TypeError, not an empty list)."""

    def decoded(body: Any) -> list[Any]:
        if not isinstance(body, list):
            raise TypeError(f"an array was expected, not {type(body).__name__}")
        return [decode(item) for item in body]

    return decoded


def api_object(body: Any) -> dict[str, Any]:
    """A JSON object, as is (a decoder for answers the caller reads itself)."""
    if not isinstance(body, dict):
        raise TypeError(f"an object was expected, not {type(body).__name__}")
    return body


def _error_of(response: httpx.Response) -> tuple[str, str | None]:
    """(message, field) of the API's error body `{"error": {"message", "field"}}`, else its text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:300] or response.reason_phrase, None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and "message" in error:
        return str(error["message"]), error.get("field")
    detail = body.get("detail", body) if isinstance(body, dict) else body
    return str(detail)[:300], None


def parse_time(value: str | None) -> datetime | None:
    """An API timestamp (ISO 8601, `Z` for UTC) as a datetime."""
    if value is None:
        return None
    return datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)


def _time(value: str) -> datetime:
    parsed = parse_time(value)
    assert parsed is not None
    return parsed


def run_of(body: dict[str, Any]) -> RunInfo:
    return RunInfo(
        id=int(body["id"]),
        project=body["project"],
        project_id=0,  # not in the API; no command prints it
        name=body["name"],
        config=body["config"],
        tags=list(body["tags"]),
        status=body["status"],
        directive_policy=body["directive_policy"],
        phase=body["phase"],
        last_step=body["last_step"],
        created_at=_time(body["created_at"]),
        last_seen_at=_time(body["last_seen_at"]),
        finished_at=parse_time(body["finished_at"]),
    )


def directive_of(body: dict[str, Any]) -> DirectiveInfo:
    """The API's directive: its wire body, read by the parser the trainers use, plus when the version
    was made and acknowledged."""
    directive = parse_directive(body)
    if directive is None:
        raise ValueError("a directive was expected")
    wire = {f.name: getattr(directive, f.name) for f in fields(Directive)}
    return DirectiveInfo(**wire, updated_at=parse_time(body["updated_at"]), applied_step=body["applied_step"])


def alert_of(run_id: int, body: dict[str, Any]) -> AlertInfo:
    return AlertInfo(
        id=body["id"],
        run_id=run_id,
        kind=body["kind"],
        severity=body["severity"],
        status=body["status"],
        message=body["message"],
        evidence=body["evidence"],
        first_step=body["first_step"],
        last_step=body["last_step"],
        created_at=_time(body["created_at"]),
        updated_at=_time(body["updated_at"]),
        acknowledged_at=parse_time(body["acknowledged_at"]),
        resolved_at=parse_time(body["resolved_at"]),
        reopen_count=int(body.get("reopen_count") or 0),  # absent from servers older than the field
        resolved_step=body.get("resolved_step"),
        deliveries=tuple(
            DeliveryInfo(
                sink=d["sink"],
                event=d["event"],
                status=d["status"],
                attempts=d["attempts"],
                last_error=d["last_error"],
                updated_at=_time(d["updated_at"]),
            )
            for d in body.get("deliveries", [])
        ),
    )


def phase_event_of(run_id: int, body: dict[str, Any]) -> PhaseEventInfo:
    return PhaseEventInfo(
        id=body["id"],
        run_id=run_id,
        step=body["step"],
        phase=body["phase"],
        previous_phase=body["previous_phase"],
        evidence=body["evidence"],
        created_at=_time(body["created_at"]),
    )


class RemoteRuns:
    def __init__(self, api: Api) -> None:
        self.api = api

    def list(self, principal: Principal, query: RunFilter) -> list[RunInfo]:
        params = {
            "project": query.project,
            "status": query.status,
            "tag": query.tag,
            "name": query.name,
            "limit": query.limit,
            "offset": query.offset,
        }
        params = {k: v for k, v in params.items() if v is not None}
        return self.api.json("GET", "/runs", params=params, decode=list_of(run_of))

    def get(self, principal: Principal, run_id: int) -> RunInfo:
        return self.api.json("GET", f"/runs/{run_id}", decode=run_of)

    def set_policy(self, principal: Principal, run_id: int, policy: str) -> RunInfo:
        return self.api.json("PUT", f"/runs/{run_id}/policy", json={"policy": policy}, decode=run_of)


class RemoteQuery:
    def __init__(self, api: Api, runs: RemoteRuns) -> None:
        self.api = api
        self.runs = runs

    def metric_names(self, principal: Principal, run_id: int) -> list[MetricSummary]:
        def metric(r: dict[str, Any]) -> MetricSummary:
            return MetricSummary(r["name"], r["points"], r["first_step"], r["last_step"])

        return self.api.json("GET", f"/runs/{run_id}/metric-names", decode=list_of(metric))

    def history(
        self, principal: Principal, run_id: int, names: Sequence[str] | None, *_: Any, **__: Any
    ) -> list[Series]:
        """Every stored point of `names` (all if None), NaN and inf decoded."""
        params = {"names": list(names)} if names else {}

        def series(body: dict[str, Any]) -> list[Series]:
            return [
                Series(name, list(s["steps"]), [decode_float(v) for v in s["values"]])
                for name, s in body["series"].items()
            ]

        return self.api.json("GET", f"/runs/{run_id}/metrics", params=params, decode=series)

    def history_csv(self, series: list[Series], nonfinite: Any = "wire") -> str:
        """The same CSV as the service writes (the rendering needs no database)."""
        from monitor.services.tables import history_csv

        return history_csv(series, nonfinite)

    def summary(self, principal: Principal, run_id: int) -> RunSummary:
        """`GET /runs/{id}/summary`: what `QueryService.summary` reads, without the metric history."""
        return self.api.json("GET", f"/runs/{run_id}/summary", decode=lambda body: _summary_of(run_id, body))

    def phase_events(self, principal: Principal, run_id: int) -> list[PhaseEventInfo]:
        decode = list_of(lambda e: phase_event_of(run_id, e))
        return self.api.json("GET", f"/runs/{run_id}/events", decode=decode)


def _summary_of(run_id: int, body: dict[str, Any]) -> RunSummary:
    steps = body["steps"]
    return RunSummary(
        run=run_of(body["run"]),
        n_steps=int(steps["count"]),
        first_step=steps["first"],
        last_step=steps["last"],
        metrics=[
            MetricLast(m["name"], m["points"], m["first_step"], m["last_step"], decode_float(m["last_value"]))
            for m in body["metrics"]
        ],
        phases=[phase_event_of(run_id, e) for e in body["phases"]],
        alerts=[alert_of(run_id, a) for a in body["alerts"]],
        directives=[directive_of(d) for d in body["directives"]],
        directive=directive_of(body["directive"]),
        rollbacks=[rollback_of(run_id, r) for r in body.get("rollbacks", [])],  # absent from older servers
    )


def rollback_of(run_id: int, body: dict[str, Any]) -> RollbackInfo:
    return RollbackInfo(
        id=body["id"],
        run_id=run_id,
        from_step=body["from_step"],
        to_step=body["to_step"],
        version=body["version"],
        undone_phases=list(body["undone_phases"]),
        created_at=_time(body["created_at"]),
    )


class RemoteDirectives:
    """`DirectiveService` over the API."""

    def __init__(self, api: Api) -> None:
        self.api = api

    def current(self, principal: Principal, run_id: int) -> DirectiveInfo:
        return self.api.json("GET", f"/runs/{run_id}/directive", decode=directive_of)

    def set_manual(
        self,
        principal: Principal,
        run_id: int,
        *,
        llds_enabled: bool | None = None,
        lam: float | None = None,
        checkpoint: bool = False,
        stop: bool | None = None,
        stop_on_collapse: bool | None = None,
        reason: str = "",
        rollback_to: int | None = None,
        lr_scale: float | None = None,
    ) -> DirectiveInfo:
        """PUT /directive: what is left out keeps its value (as `DirectiveService.set_manual`)."""
        body: dict[str, Any] = {"reason": reason}
        if llds_enabled is not None or lam is not None:
            current = self.current(principal, run_id).llds
            body["llds"] = LLDSDirective(
                enabled=current.enabled if llds_enabled is None else llds_enabled,
                lam=current.lam if lam is None else lam,
            ).to_wire()
        if checkpoint:
            body["checkpoint"] = True
        if stop is not None:
            body["stop"] = stop
        if stop_on_collapse is not None:
            body["stop_on_collapse"] = stop_on_collapse
        if rollback_to is not None:
            body["rollback"] = {"to_step": rollback_to, "lr_scale": lr_scale}
        return self.api.json("PUT", f"/runs/{run_id}/directive", json=body, decode=directive_of)


class RemoteAlerts:
    def __init__(self, api: Api) -> None:
        self.api = api

    def list(self, principal: Principal, run_id: int, status: str | None = None) -> list[AlertInfo]:
        params = {"status": status} if status else {}
        decode = list_of(lambda a: alert_of(run_id, a))
        return self.api.json("GET", f"/runs/{run_id}/alerts", params=params, decode=decode)

    def acknowledge(self, principal: Principal, run_id: int, alert_id: int) -> AlertInfo:
        return self.api.json(
            "POST", f"/runs/{run_id}/alerts/{alert_id}/ack", decode=lambda a: alert_of(run_id, a)
        )


class RemoteLiveness:
    def __init__(self, api: Api) -> None:
        self.api = api

    def get(self, principal: Principal, run_id: int) -> Liveness:
        return self.api.json("GET", f"/runs/{run_id}/liveness", decode=_liveness_of)

    def set_thresholds(
        self, principal: Principal, run_id: int, stall_after_s: float | None, crash_after_s: float | None
    ) -> Liveness:
        body = {"stall_after_s": stall_after_s, "crash_after_s": crash_after_s}
        return self.api.json("PUT", f"/runs/{run_id}/liveness", json=body, decode=_liveness_of)


def _liveness_of(body: dict[str, Any]) -> Liveness:
    return Liveness(
        **{
            **body,
            "last_seen_at": _time(body["last_seen_at"]),
            "last_step_at": parse_time(body["last_step_at"]),
        }
    )


class RemoteState:
    """What a command needs of the service, over HTTP. `db.dispose()` closes the client (the commands
    close the local database that way)."""

    def __init__(
        self,
        url: str,
        token: str | None,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.api = Api(url, token, timeout, transport)
        self.db = self
        self.runs = RemoteRuns(self.api)
        self.query = RemoteQuery(self.api, self.runs)
        self.alerts = RemoteAlerts(self.api)
        self.directives = RemoteDirectives(self.api)
        self.liveness = RemoteLiveness(self.api)

    def dispose(self) -> None:
        self.api.close()


if TYPE_CHECKING:  # mypy holds the remote state to the port the commands use

    def _command_port(state: RemoteState) -> ServicePort:
        return state

"""schemathesis against the app's own OpenAPI schema: every operation, schema-valid (positive) and
schema-violating (negative) cases, with auth on and a valid token or none. No answer may be a 5xx,
and every documented response must match its schema. Below: regressions for what it found."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import response_schema_conformance

from contracts.wire import API_PREFIX
from tests.monitor.api.helpers import history, metrics_batch, new_run

pytestmark = pytest.mark.timeout(180)

MAX_EXAMPLES = {"token": 25, "no-token": 6}
"""Per operation and generation mode: about 10 s per backend with a token on a loaded 2-core box.
Without one, every operation but the public ones answers 401 before its input is read (the same
answer whatever the input; tests/hostile/test_security.py checks it per operation), so a few cases
per operation show its 401 matches the schema; the public ones ignore the header and are fuzzed in
full with a token."""
RUNS = f"{API_PREFIX}/runs"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def fuzz_operation(strategy: st.SearchStrategy[Any], call: Callable[[Any], None], examples: int) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],  # no shrinking: the failure report keeps the case as generated
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        call(case)

    with contextlib.suppress(Unsatisfiable):  # negative mode, operation without parameters
        run()


@pytest.mark.slow  # about 20 s per backend with a token, 5 s without
@pytest.mark.parametrize("auth", ["token", "no-token"])
def test_no_operation_answers_5xx_and_responses_match_the_schema(app: Any, auth: str) -> None:
    token = app.state.lldmon.auth.create_token("fuzz")[0]
    with TestClient(app) as client:
        run_id = new_run(client, "target", headers=bearer(token))
        client.post(
            f"{RUNS}/{run_id}/metrics",
            json=metrics_batch([0, 1], {"loss": [1.0, "NaN"]}),
            headers=bearer(token),
        )
    headers = bearer(token) if auth == "token" else {}
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    results = list(schema.get_all_operations())
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert len(operations) == len(results), "schemathesis could not read some operations"
    labels = {op.label for op in operations}
    assert f"POST {RUNS}/{{run_id}}/metrics" in labels and "GET /readyz" in labels

    failures: list[str] = []
    calls = 0

    def call(case: Any) -> None:
        nonlocal calls
        calls += 1
        response = case.call(headers=headers)
        case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])

    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = op.as_strategy(generation_mode=mode)
            if "{run_id}" in op.path:  # half the cases on a real run, so they get past the 404
                strategy = st.one_of(
                    strategy, op.as_strategy(generation_mode=mode, path_parameters={"run_id": run_id})
                )
            try:
                fuzz_operation(strategy, call, MAX_EXAMPLES[auth])
            except Exception as exc:
                failures.append(f"{op.label} ({mode.value}): {exc}")
    assert not failures, "\n\n".join(failures)
    assert calls > 0.8 * MAX_EXAMPLES[auth] * len(operations)


# --- regressions: inputs the fuzzing found that used to answer 500 ---------------------------------


@pytest.mark.parametrize(
    "path",
    [
        f"{RUNS}/{2**63}",  # OverflowError in SQLite, "integer out of range" in PostgreSQL
        f"{RUNS}/{2**31}/metrics",  # runs.id is a 32-bit INTEGER on PostgreSQL
        f"{RUNS}/-{2**70}/events",
        f"{RUNS}/1/metrics?step_min={2**64}",
        f"{RUNS}/1/actions?step_max={2**64}",
        f"{RUNS}?offset={2**64}",
    ],
)
def test_ids_and_steps_beyond_the_columns_are_422(client: TestClient, path: str) -> None:
    new_run(client)
    response = client.get(path)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_input"


def test_alert_id_beyond_bigint_is_422(client: TestClient) -> None:
    run_id = new_run(client)
    response = client.post(f"{RUNS}/{run_id}/alerts/{2**64}/ack")
    assert response.status_code == 422 and response.json()["error"]["field"].endswith("alert_id")


def test_the_run_service_treats_an_impossible_id_as_not_found(app: Any) -> None:
    """The dashboard passes ids from its URL straight to the service."""
    from monitor.domain import Principal
    from monitor.errors import NotFound

    with pytest.raises(NotFound, match=str(2**40)):
        app.state.lldmon.runs.get(Principal(), 2**40)


@pytest.mark.parametrize(
    ("method", "path", "raw", "where"),
    [
        ("post", RUNS, rb'{"name": "x\ud800"}', "name"),
        ("post", RUNS, rb'{"name": "ok", "config": {"k\ud800": 1}}', "config.k\\ud800"),
        ("post", RUNS, rb'{"name": "ok", "config": {"k": ["a", "\udfff"]}}', "config.k[1]"),
        ("post", RUNS, rb'{"name": "ok", "tags": ["t\udc00"]}', "tags[0]"),
        ("post", RUNS, rb'{"name": "ok", "project": "p\ud800"}', "project"),
        ("put", "/{run}/directive", rb'{"llds": {"enabled": true}, "reason": "\ud83d"}', "reason"),
    ],
)
def test_lone_surrogates_in_json_bodies_are_422_and_nothing_stored(
    client: TestClient, method: str, path: str, raw: bytes, where: str
) -> None:
    """JSON may escape a lone surrogate; it is not text. It used to be a 500 (the driver cannot
    encode it), and inside `config` it was stored and broke every later listing of runs."""
    run_id = new_run(client, "existing")
    url = path if path.startswith("/api") else f"{RUNS}/{run_id}{path.split('}', 1)[1]}"
    response = getattr(client, method)(url, content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert f"{where}: not valid Unicode text" in response.json()["error"]["message"]
    listing = client.get(RUNS)
    assert listing.status_code == 200 and [r["name"] for r in listing.json()] == ["existing"]
    assert client.get(f"{RUNS}/{run_id}/directive").json()["version"] == 0


def test_lone_surrogate_metric_name_is_422_naming_it(client: TestClient) -> None:
    run_id = new_run(client)
    raw = b'{"batch_id": "s1", "steps": [0], "metrics": {"ok": [1.0], "a\\ud800": [1.0]}}'
    response = client.post(f"{RUNS}/{run_id}/metrics", content=raw)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "metrics.a\\ud800"
    assert history(client, run_id) == {}


@pytest.mark.parametrize("lam", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_finite_lambda_is_422_with_a_strict_json_answer(client: TestClient, lam: bytes) -> None:
    """The 422 echoes the input; a non-finite float used to make rendering it fail (a 500)."""
    run_id = new_run(client)
    response = client.put(
        f"{RUNS}/{run_id}/directive",
        content=b'{"llds": {"enabled": true, "lam": ' + lam + b"}}",
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "body.llds.lam"
    json.loads(response.text, parse_constant=reject_token)  # strict JSON: no bare NaN / Infinity


def reject_token(token: str) -> None:
    raise AssertionError(f"non-standard JSON token {token} in a response")

"""Callback inputs, checked before they reach a service: a callback's arguments are whatever JSON the
browser (or anyone with a token) posts, not what the layout put there.

Wrong types and unusable text are an `InvalidInput` naming the input (the callbacks show it as
"422: ..."); numbers are clamped to what the page offers and the database columns hold, so a crafted
step or window can neither overflow a query nor keep a server thread busy. Lists of picks (compare
page) drop the entries that cannot be valid instead of failing the whole page.
"""

from __future__ import annotations

import math
from typing import Final

from pydantic import TypeAdapter, ValidationError

from contracts.directive import DEFAULT_LLDS_LAMBDA, directive_problem
from contracts.metrics import MAX_METRIC_NAME_LENGTH
from contracts.wire import ACTION_SOURCES, DIRECTIVE_POLICIES
from monitor.domain import MAX_BIGINT, MAX_RUN_ID
from monitor.errors import InvalidInput
from monitor.surrogates import is_valid_text

__all__ = [
    "DEFAULT_ACTION_WINDOW",
    "MAX_ACTION_WINDOW",
    "MAX_BIGINT",
    "MAX_COMPARE_METRICS",
    "MAX_TEXT_LENGTH",
    "action_source",
    "action_step",
    "action_window",
    "directive_policy",
    "lam",
    "metric_name",
    "metric_names",
    "run_id",
    "run_id_text",
    "run_ids",
    "text",
]

MAX_ACTION_WINDOW: Final = 500
"""The widest action window the run page offers: the work of one histogram request is bounded by it."""
DEFAULT_ACTION_WINDOW: Final = 100
MAX_COMPARE_METRICS: Final = 48
"""Graphs on the compare page (each is a callback and a query per run)."""
MAX_TEXT_LENGTH: Final = 256
"""Filters and names: the longest run name or metric name the API stores."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def run_id(value: object) -> int:
    """The run id a page stored (an int); ids no run can have are left to the service (404)."""
    if not _is_int(value):
        raise InvalidInput(f"run id must be an integer, not {type(value).__name__}", field="run_id")
    assert isinstance(value, int)
    return value


def run_id_text(value: str) -> int | None:
    """A run id spelled in a URL ("12"), or None if `value` is not one (ASCII digits only)."""
    if not (value.isascii() and value.isdigit()) or len(value) > 20:
        return None
    return int(value)


def run_ids(value: object) -> list[int]:
    """The picked run ids, in order, without duplicates; entries that are not ints are dropped."""
    if not isinstance(value, list):
        return []
    return list(dict.fromkeys(v for v in value if _is_int(v) and 0 <= v <= MAX_RUN_ID))


def _number(value: object, field: str) -> float | int:
    if _is_int(value):
        assert isinstance(value, int)
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise InvalidInput(f"{field} must be a finite number", field=field)


def action_step(value: object) -> int | None:
    """The step box: None (empty: the latest step), else clamped into 0..MAX_BIGINT."""
    if value is None or value == "":
        return None
    number = _number(value, "step")
    return int(min(max(number, 0), MAX_BIGINT))


def action_window(value: object) -> int:
    """Steps in the quantile window: None means the default; clamped into 1..MAX_ACTION_WINDOW."""
    if value is None:
        return DEFAULT_ACTION_WINDOW
    number = _number(value, "window")
    return int(min(max(number, 1), MAX_ACTION_WINDOW))


def action_source(value: object) -> str | None:
    """ "all" (or None) means both sources."""
    if value is None or value == "all":
        return None
    if isinstance(value, str) and value in ACTION_SOURCES:
        return value
    raise InvalidInput(f"source must be one of {['all', *ACTION_SOURCES]}", field="source")


_NUMBER: Final = TypeAdapter(float)
"""A number as the API's request bodies read one (lax: "0.3" is 0.3), bounds checked separately."""


def lam(value: object) -> float:
    """The lambda box: empty means the default lambda; otherwise a number within the bounds every
    entry point applies (`contracts.directive.directive_problem`)."""
    if value is None or value == "":
        return DEFAULT_LLDS_LAMBDA
    try:
        number = _NUMBER.validate_python(value)
    except ValidationError:
        raise InvalidInput(f"llds.lam: lambda must be a number, not {value!r}", field="llds.lam") from None
    problem = directive_problem(lam=number)
    if problem is not None:
        raise InvalidInput(f"llds.{problem[0]}: {problem[1]}", field=f"llds.{problem[0]}")
    return number


def directive_policy(value: object) -> str:
    """The policy picker: one of `contracts.wire.DIRECTIVE_POLICIES`."""
    if isinstance(value, str) and value in DIRECTIVE_POLICIES:
        return value
    raise InvalidInput(f"policy: must be one of {list(DIRECTIVE_POLICIES)}, not {value!r}", field="policy")


def _usable(value: str, max_length: int) -> bool:
    """Text a query can carry: not too long, no NUL (PostgreSQL refuses it), no lone surrogate."""
    return len(value) <= max_length and "\x00" not in value and is_valid_text(value)


def text(value: object, field: str, max_length: int = MAX_TEXT_LENGTH) -> str | None:
    """A free-text filter: None or "" means no filter."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be text, not {type(value).__name__}", field=field)
    if not _usable(value, max_length):
        raise InvalidInput(
            f"{field} must be at most {max_length} characters of valid text without NUL", field=field
        )
    return value


def metric_name(value: object) -> str:
    if not (isinstance(value, str) and value and _usable(value, MAX_METRIC_NAME_LENGTH)):
        raise InvalidInput(
            f"a metric name must be 1 to {MAX_METRIC_NAME_LENGTH} characters of valid text without NUL",
            field="metric",
        )
    return value


def metric_names(value: object) -> list[str]:
    """Picked metric names, without duplicates, at most MAX_COMPARE_METRICS; unusable ones are dropped."""
    if not isinstance(value, list):
        return []
    names: list[str] = []
    for item in value:
        try:
            names.append(metric_name(item))
        except InvalidInput:
            continue
    return list(dict.fromkeys(names))[:MAX_COMPARE_METRICS]

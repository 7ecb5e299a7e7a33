"""The ingest wire format, shared by `trainer_hooks.client` and `monitor.api`.

Batches are columnar: one JSON array per field, all of the same length, never one object per row.

Metrics batch (POST /api/v1/runs/{run_id}/metrics)::

    {"batch_id": "9f0c...", "steps": [10, 11],
     "metrics": {"reward/mean": [0.41, 0.43], "grad/norm": [1.2, "Infinity"]}}

A `null` in a metric column means "not logged at this step" (no row is stored); NaN and +-inf are
data (collapse signals) and may be sent as JSON tokens (`NaN`, `Infinity`, `-Infinity`) or as the
strings in NONFINITE_STRINGS. Responses always use the strings, so every response is strict JSON.

Action batch (POST /api/v1/runs/{run_id}/actions): `batch_id` plus the columns in ACTION_COLUMNS.

Both at once (POST /api/v1/runs/{run_id}/combined): `{"metrics": <metrics batch>, "actions": <action
batch>}`, one transaction, each half acknowledged under its own `batch_id` (`{"metrics": <ack>,
"actions": <ack>}`), so either may be re-sent alone through its own endpoint.
"""

from __future__ import annotations

import math
from typing import Any, Final

API_PREFIX: Final = "/api/v1"
DEFAULT_PROJECT: Final = "default"
"""The project of a run created without one (and without a project-scoped token)."""
MAX_BODY_HEADER: Final = "lldmon-max-body-bytes"
"""Response header on every API answer: the service's body limit (bytes of decompressed JSON), so a
client splits its batches under it before the first one is refused."""

BATCH_ID_MAX_LENGTH: Final = 64
IMPORT_BATCH_PREFIX: Final = "import-"
"""Batch ids of imports (`lldmon import`, local and `--url`) start with this: an imported log is history,
so its `directive/applied_version` values are stored as data but acknowledge none of the run's
directives (they were logged against another run's, or an earlier life's, versions). Trainers' ids
never start with it."""

NAN: Final = "NaN"
POS_INF: Final = "Infinity"
NEG_INF: Final = "-Infinity"
NONFINITE_STRINGS: Final = {NAN: math.nan, POS_INF: math.inf, NEG_INF: -math.inf}

ACTION_SOURCES: Final = ("loss", "probe")
"""`loss`: deltas seen inside the loss computation; `probe`: exact post-update re-scoring."""

ACTION_COLUMNS: Final = (
    "step",
    "traj_index",
    "action_index",
    "n_tokens",
    "delta",
    "old_logp_mean",
    "advantage",
    "reward",
    "is_answer",
    "source",
)
"""The one list of action columns: code that lists them derives from it, and the typed models that must
spell them out (API wire model, domain batch, block codec, export and history dtypes) are tested
against it (tests/test_action_columns.py)."""
ACTION_FLOAT_COLUMNS: Final = ("delta", "old_logp_mean", "advantage", "reward")
"""The float columns of ACTION_COLUMNS, in its order: a number, one of NONFINITE_STRINGS, or null (unknown)."""

RUN_STALLED: Final = "stalled"
"""A running run silent (no batch, no heartbeat) past its stall threshold; a new batch or heartbeat revives it."""
RUN_CRASHED: Final = "crashed"
"""Ended without `finish`: reported by the job itself, or silent past its crash threshold."""
FINISH_STATUSES: Final = ("finished", "failed", RUN_CRASHED)
"""Statuses `POST /runs/{id}/finish` accepts."""
RUN_STATUSES: Final = ("running", *FINISH_STATUSES, RUN_STALLED)
ALERT_RUN_STALLED: Final = "run_stalled"
"""Alert kind raised by the liveness sweeper (warning when stalled, critical once crashed)."""
ALERT_HEAL_EXHAUSTED: Final = "heal_exhausted"
"""Alert kind raised when policy `heal` meets a collapse after its last allowed rollback (critical; it
requested a stop instead)."""
DIRECTIVE_POLICIES: Final = ("off", "alert", "auto", "heal")


def encode_float(value: float) -> float | str:
    """Map a float to its strict-JSON wire form (non-finite values become strings)."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return NAN
    return POS_INF if value > 0 else NEG_INF


def encode_json(obj: Any) -> Any:
    """Free-form JSON (config, evidence, error details) in strict form: every float through
    `encode_float`, dict keys as strings, tuples as lists, numpy scalars and arrays as Python values."""
    if isinstance(obj, float):
        return encode_float(obj)
    if isinstance(obj, dict):
        return {str(k): encode_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode_json(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return encode_json(obj.item())
    if hasattr(obj, "tolist"):  # numpy arrays
        return encode_json(obj.tolist())
    return obj


def decode_float(value: float | int | str) -> float:
    """Inverse of `encode_float`; raises ValueError for any other string."""
    if isinstance(value, str):
        try:
            return NONFINITE_STRINGS[value]
        except KeyError:
            raise ValueError(
                f"expected a number or one of {sorted(NONFINITE_STRINGS)}, got {value!r}"
            ) from None
    return float(value)

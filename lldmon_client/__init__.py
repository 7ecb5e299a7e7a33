"""The one client of the lldmon service's ingest protocol, for every sender of batches.

`trainer_hooks.client.MonitorClient`, `lldmon watch`, `lldmon sync`, `lldmon import --url`, the remote
CLI, the demo, the lab and the history readers all talk to the service through this package, so the
protocol (where the API lives, how a request is retried, how an answer is classified, how a body over
the service's limit is cut) is written once. It imports only httpx, the standard library and
`contracts`: it ships into training images with `trainer_hooks`.

- `urls`: the service's base URL from what a person typed (`normalize_url`, strict; `api_url`).
- `http`: `Session` (one attempt per call, never raising, answers as `Reply`), `RetryPolicy` and the one
  Retry-After parser.
- `bodies`: the ingest bodies of `contracts.wire` (`metrics_body`, `actions_body`) and batch ids.
- `upload`: `Uploader.send(run_id, kind, body) -> Outcome`: retries, the 413 learn-and-split, and which
  parts were delivered, refused or left for later.
- `answers`: an answer that is not the API's (a dashboard page, a proxy's error page) in one line.
"""

from lldmon_client.bodies import actions_body, masked, metrics_body, new_batch_id, stable_batch_id
from lldmon_client.http import (
    TRANSIENT_STATUSES,
    Reply,
    RetryPolicy,
    ServiceError,
    Session,
    parse_retry_after,
)
from lldmon_client.upload import Outcome, Sent, Uploader
from lldmon_client.urls import api_url, normalize_url

__all__ = [
    "TRANSIENT_STATUSES",
    "Outcome",
    "Reply",
    "RetryPolicy",
    "Sent",
    "ServiceError",
    "Session",
    "Uploader",
    "actions_body",
    "api_url",
    "masked",
    "metrics_body",
    "new_batch_id",
    "normalize_url",
    "parse_retry_after",
    "stable_batch_id",
]

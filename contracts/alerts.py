"""Alert names shared by the service, its CLI and whatever receives its notifications (stdlib only).

Webhook receivers see `NOTIFICATION_EVENTS` in the payload's `event` and verify `SIGNATURE_HEADER`;
`DELIVERY_STATUSES` is what `lldmon alerts list` and the API's alert output show per sink.
"""

from __future__ import annotations

from typing import Final

SEVERITIES: Final = ("info", "warning", "critical")
"""Lowest first: a sink's minimum severity lets through that one and every later one."""
SEVERITY_RANK: Final = {name: rank for rank, name in enumerate(SEVERITIES)}

ALERT_STATUSES: Final = ("open", "acknowledged", "resolved")

FIRING: Final = "firing"
ESCALATED: Final = "escalated"
"""The alert's severity rose (a warning became critical): never sent as `resolved`."""
RESOLVED: Final = "resolved"
NOTIFICATION_EVENTS: Final = (FIRING, ESCALATED, RESOLVED)

PENDING: Final = "pending"
RETRYING: Final = "retrying"
DELIVERED: Final = "delivered"
FAILED: Final = "failed"
DELIVERY_STATUSES: Final = (PENDING, RETRYING, DELIVERED, FAILED)
"""Per alert and sink, for its latest notification: queued, failed at least once and retried,
accepted by the receiver (2xx), or given up after the last attempt."""

SIGNATURE_HEADER: Final = "X-LLDMon-Signature"
"""`sha256=<hex HMAC-SHA256 of the raw request body with the webhook secret>` (GitHub's scheme)."""

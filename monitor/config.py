"""Service settings, built once at start-up (CLI or app factory) and passed down; never read at import."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.directive import DEFAULT_LLDS_LAMBDA

DEFAULT_DATA_DIR = Path.home() / ".lldmon"
Severity = Literal["info", "warning", "critical"]
"""contracts.alerts.SEVERITIES (a test checks they agree)."""
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024

DURATION_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_DURATION: Final = timedelta(days=36500)
"""A century: longer retention is surely a unit mistake (and `now - it` would leave the calendar)."""
_DURATION = re.compile(r"\s*(\d{1,9})\s*([smhdw])\s*")

Seconds = Annotated[float, Field(gt=0, le=MAX_DURATION.total_seconds())]
"""Every duration setting in seconds: positive, and at most a century, so that it always fits a
`timedelta` and a thread's wait (`threading.TIMEOUT_MAX`); NaN and +-inf are refused for every float
setting by `Settings.model_config`."""


def parse_duration(text: str) -> timedelta:
    """`30d`, `12h`, `90m`, `45s`, `2w` as a timedelta; ValueError saying what is accepted otherwise."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration: a whole number and a unit (s, m, h, d, w), e.g. 30d")
    duration = timedelta(seconds=int(match[1]) * DURATION_UNITS[match[2]])
    if not timedelta(0) < duration <= MAX_DURATION:
        raise ValueError(f"{text!r} must be more than 0 and at most {MAX_DURATION.days}d")
    return duration


class Settings(BaseSettings):
    """Every knob of the service. Environment variables use the `LLDMON_` prefix."""

    model_config = SettingsConfigDict(env_prefix="LLDMON_", extra="ignore", allow_inf_nan=False)
    """`allow_inf_nan=False`: no float setting may be NaN or +-inf (`inf` seconds would overflow a
    timedelta at start-up or end a background loop's wait at once)."""

    data_dir: Path = Field(default=DEFAULT_DATA_DIR, description="Where the embedded SQLite file lives.")
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; default: sqlite:///<data_dir>/lldmon.db. "
        "PostgreSQL: postgresql+psycopg://user@host:5432/db",
    )
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, gt=0)
    auto_upgrade: bool = Field(
        default=True, description="Upgrade an empty or outdated SQLite schema on start-up."
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="If set, GET /metrics needs `Authorization: Bearer <it>` (its series name runs).",
    )
    db_pool_size: int = Field(default=8, gt=0)
    ingest_threads: int = Field(
        default=4,
        gt=0,
        description="Ingest requests handled at once per worker process (the rest wait their turn): "
        "ingest is CPU work under the GIL, and more threads only contend for it (monitor/api/threads.py).",
    )
    log_level: str = "info"

    # Alerting (issue: detector). Webhook lists come from JSON in the environment, e.g.
    # LLDMON_WEBHOOK_URLS='["http://hooks.internal/lldmon"]'.
    webhook_urls: list[str] = Field(default_factory=list, description="Generic JSON webhooks.")
    slack_webhook_urls: list[str] = Field(default_factory=list, description="Slack-compatible webhooks.")
    renotify_seconds: Seconds = Field(default=3600.0, description="Re-notify a still-open alert after this.")
    alert_hold_steps: int = Field(
        default=20,
        ge=0,
        description="A detector finding that comes back at most this many steps after its alert resolved "
        "continues that alert (re-opened, counted, not notified again) instead of opening a new one. "
        "20: on the lab runs a flickering reward_zero came back 4 steps after clearing in 54 of 61 "
        "returns and within 20 in 3 more. 0 turns this off.",
    )
    # Delivery: one worker per sink, so a dead sink only delays itself.
    webhook_min_severity: Severity = Field(
        default="warning", description="Least severe alert a webhook gets (`info`: the diagnoses too)."
    )
    slack_min_severity: Severity = Field(
        default="warning", description="Least severe alert Slack gets (`info`: the diagnoses too)."
    )
    webhook_secret: SecretStr | None = Field(
        default=None,
        description="Signs webhook bodies: X-LLDMon-Signature: sha256=<hex HMAC-SHA256 of the raw body>.",
    )
    public_url: str | None = Field(
        default=None,
        description="Base URL people reach the service at (https://lldmon.example.org); notifications "
        "link to <it>/dashboard/run/<id>.",
    )
    sink_timeout_seconds: Seconds = Field(
        default=10.0, description="Total seconds per delivery attempt to a sink (connect, send, answer)."
    )
    sink_max_attempts: int = Field(default=5, gt=0, description="Tries per notification and sink.")

    # Closed loop: what `auto` runs get when they slide (docs/science.md section 4).
    llds_trigger_phase: Literal["decay", "collapse"] = "decay"
    llds_lambda: float = Field(
        default=DEFAULT_LLDS_LAMBDA, ge=0, description="Paper default (0.3 for Qwen2.5-7B-Instruct)."
    )
    llds_lambda_max: float = Field(default=0.3, ge=0, description="Escalation cap when decay continues.")
    llds_escalate_after_steps: int = Field(
        default=40,
        gt=0,
        description="Raise lambda to llds_lambda_max if still sliding this many steps later.",
    )
    heal_max_rollbacks: int = Field(
        default=2,
        ge=0,
        description="Rollbacks policy `heal` requests per run; a collapse after the last one requests a stop.",
    )
    heal_lr_scale: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Factor on the learning rate at each `heal` rollback (cumulative; 1: unchanged).",
    )

    # Liveness (monitor.services.liveness): a silent run is marked stalled, then crashed.
    liveness_sweep_seconds: Seconds = Field(
        default=30.0, description="How often running runs are checked for silence."
    )
    stall_after_seconds: Seconds = Field(
        default=900.0, description="Default stall threshold's floor (scaled up for slow steps)."
    )
    stall_step_factor: float = Field(
        default=10.0, ge=0, description="Default stall threshold: this many median step intervals."
    )
    crash_after_factor: float = Field(
        default=4.0, gt=1, description="Default crash threshold: this times the stall threshold."
    )

    # Retention: raw action records older than this lose their payload; per-step quantile
    # summaries stay. Checked at start-up and then every `actions_prune_seconds` by each server process.
    actions_retention: timedelta | None = Field(
        default=None,
        description="Keep raw action records this long (e.g. 30d, 12h, 90m); unset: forever. Pruned "
        "steps keep their per-step delta quantiles.",
    )
    actions_prune_seconds: Seconds = Field(
        default=3600.0, description="How often the server prunes by `actions_retention`."
    )

    @field_validator("actions_retention", mode="before")
    @classmethod
    def _retention(cls, value: Any) -> Any:
        """`30d` style (like `lldmon db prune --actions-older-than`); empty means unset."""
        if isinstance(value, str):
            return parse_duration(value) if value.strip() else None
        if isinstance(value, timedelta) and not timedelta(0) < value <= MAX_DURATION:
            raise ValueError(f"must be more than 0 and at most {MAX_DURATION.days}d")
        return value

    def resolved_database_url(self) -> str:
        """The URL actually used: the explicit one, or the embedded SQLite file in `data_dir`."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'lldmon.db').expanduser().resolve()}"

    @property
    def is_sqlite(self) -> bool:
        return self.resolved_database_url().startswith("sqlite")

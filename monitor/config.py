"""Service settings, built once at start-up (CLI or app factory) and passed down; never read at import."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.directive import DEFAULT_LLDS_LAMBDA

DEFAULT_DATA_DIR = Path.home() / ".lldmon"
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


class Settings(BaseSettings):
    """Every knob of the service. Environment variables use the `LLDMON_` prefix."""

    model_config = SettingsConfigDict(env_prefix="LLDMON_", extra="ignore")

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
    log_level: str = "info"

    # Alerting (issue: detector). Webhook lists come from JSON in the environment, e.g.
    # LLDMON_WEBHOOK_URLS='["http://hooks.internal/lldmon"]'.
    webhook_urls: list[str] = Field(default_factory=list, description="Generic JSON webhooks.")
    slack_webhook_urls: list[str] = Field(default_factory=list, description="Slack-compatible webhooks.")
    renotify_seconds: float = Field(
        default=3600.0, gt=0, description="Re-notify a still-open alert after this."
    )

    # Closed loop: what `auto` runs get when they slide (lld-reference.md section 4).
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

    def resolved_database_url(self) -> str:
        """The URL actually used: the explicit one, or the embedded SQLite file in `data_dir`."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'lldmon.db').expanduser().resolve()}"

    @property
    def is_sqlite(self) -> bool:
        return self.resolved_database_url().startswith("sqlite")

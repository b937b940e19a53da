"""`alerts:`: where alerts go besides the `alerts` table and the log (a JSON webhook, PagerDuty), and the dead man's
switch's thresholds."""

from __future__ import annotations

from pydantic import Field, ValidationInfo, field_validator

from dunning.config.base import EnvName, Number, Strict
from dunning.urls import http_url


class Alerts(Strict):
    """Where alerts go besides the `alerts` table and the log: a JSON webhook and/or PagerDuty."""

    webhook_url: str | None = None
    """A URL that receives every alert as JSON (a Slack incoming webhook works: the `text` has `&`, `<` and `>`
    escaped, so a customer's words quoted in it are never Slack markup); https, or http to this machine only."""
    pagerduty_routing_key_env: EnvName | None = None
    """The name of the environment variable holding a PagerDuty Events v2 routing key: alerts then page."""
    pagerduty_url: str = "https://events.pagerduty.com/v2/enqueue"
    """PagerDuty's Events v2 endpoint."""
    timeout_seconds: Number = Field(default=5.0, gt=0, le=60)
    """Seconds to wait for the webhook or PagerDuty."""
    stale_after_hours: Number = Field(default=3.0, gt=0, le=24 * 366)
    """The dead man's switch: page when no live run has completed for this long (a deployment that never ran one is not
    paged)."""
    unknown_after_hours: Number = Field(default=24.0, gt=0, le=24 * 366)
    """Page when an `unknown` outcome has waited this long for a human (`dunning resolve`)."""

    @field_validator("webhook_url", "pagerduty_url")
    @classmethod
    def _http_only(cls, value: str | None, info: ValidationInfo) -> str | None:
        return http_url(value, f"alerts.{info.field_name}")

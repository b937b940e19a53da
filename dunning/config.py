"""The deployment's policy, from one optional YAML file.

Every key has a documented default so that an empty (or absent) file is a
working configuration; unknown keys and wrong types are refused with a message
that names the key, because a typo in a dunning policy silently falling back to
a default is how customers get the wrong email.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import babel
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dunning.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Stage(_Strict):
    """One reminder stage: reached at `days_overdue`, allowed while enough is still owed."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_-]+$")
    days_overdue: int = Field(ge=0)
    min_remaining_ratio: float = Field(default=0.0, ge=0.0, le=1.0)


DEFAULT_STAGES = (
    Stage(name="day3", days_overdue=3, min_remaining_ratio=0.0),
    Stage(name="day7", days_overdue=7, min_remaining_ratio=0.0),
    Stage(name="day14", days_overdue=14, min_remaining_ratio=0.25),
)


class Breaker(_Strict):
    max_emails: int = Field(default=2, ge=1)
    window_hours: int = Field(default=24, ge=1)


class Provider(_Strict):
    """Where accepted emails go: `file` writes .eml files to DIR/outbox, `smtp` talks to a server."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    kind: Literal["file", "smtp"] = "file"
    host: str = "127.0.0.1"
    port: int = Field(default=25, ge=1, le=65535)
    timeout_seconds: float = Field(default=10.0, gt=0)
    starttls: bool = False
    username_env: str | None = None
    password_env: str | None = None
    from_address: str = Field(default="billing@example.com", alias="from")
    connections: int = Field(default=4, ge=1, le=32)
    outbox_dir: str | None = None

    @property
    def message_domain(self) -> str:
        """The right-hand side of our Message-IDs: the sender's domain."""
        return self.from_address.rpartition("@")[2] or "dunning.invalid"


class Alerts(_Strict):
    """Where alerts go besides the `alerts` table and the log: a JSON webhook and/or PagerDuty."""

    webhook_url: str | None = None
    pagerduty_routing_key_env: str | None = None
    pagerduty_url: str = "https://events.pagerduty.com/v2/enqueue"
    timeout_seconds: float = Field(default=5.0, gt=0)


class Retry(_Strict):
    """Backoff for `failed` sends: a later cycle may retry them, never an `unknown`."""

    max_attempts: int = Field(default=5, ge=1)
    backoff_minutes: float = Field(default=30.0, ge=0)


class DunningConfig(_Strict):
    stages: tuple[Stage, ...] = DEFAULT_STAGES
    group_by: Literal["customer", "invoice"] = "customer"
    timezone: str = "UTC"
    on_invalid_rows: Literal["proceed", "halt"] = "proceed"
    breaker: Breaker = Breaker()
    provider: Provider = Provider()
    alerts: Alerts = Alerts()
    retry: Retry = Retry()
    locale: str = "en_US"
    claim_chunk_size: int = Field(default=2000, ge=1)

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown timezone {value!r}") from exc
        return value

    @field_validator("locale")
    @classmethod
    def _known_locale(cls, value: str) -> str:
        try:
            babel.Locale.parse(value)
        except (ValueError, babel.UnknownLocaleError) as exc:
            raise ValueError(f"unknown locale {value!r}") from exc
        return value

    @model_validator(mode="after")
    def _stages_well_formed(self) -> "DunningConfig":
        if not self.stages:
            raise ValueError("stages: at least one stage is required")
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stages: duplicate stage names {names}")
        days = [s.days_overdue for s in self.stages]
        if days != sorted(days) or len(set(days)) != len(days):
            raise ValueError(f"stages: days_overdue must be strictly increasing, got {days}")
        return self

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def policy_id(self) -> str:
        """A short stable id of everything that decides what is sent, to label simulations."""
        import hashlib

        decisive = self.model_dump(include={"stages", "group_by", "timezone", "breaker", "retry"}, mode="json")
        return hashlib.sha256(repr(sorted(decisive.items())).encode()).hexdigest()[:12]


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"]) or "(top level)"
        if item["type"] == "extra_forbidden":
            parts.append(f"unknown key '{key}'")
        else:
            parts.append(f"'{key}': {item['msg']}")
    return "; ".join(parts)


def parse_config(data: object, source: str = "config") -> DunningConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys at the top level")
    try:
        return DunningConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from None


def load_config(path: str | Path | None) -> DunningConfig:
    """The configuration in `path`, or the embedded defaults when `path` is None."""
    if path is None:
        return DunningConfig()
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    return parse_config(data, source=str(path))

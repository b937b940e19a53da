"""The collections schedule's part of the configuration: `schedule:` (when the hourly schedule starts a cycle), send
windows and holidays, escalation, and what a policy matches (`policies[].match`). Each model refuses what a
collections team would get wrong, in one line naming the key; `DunningConfig.resolved_policies` fills a policy's
unset keys from the top level."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from dunning.config.base import Count, EnvName, Flag, Number, Strict
from dunning.urls import http_url

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_FULL_NAMES = {
    d: i for i, d in enumerate(("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"))
}
_CLOCK = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")
DEFAULT_POLICY = "default"


def _minutes(value: str, key: str) -> int:
    match = _CLOCK.fullmatch(value)
    if match is None:
        raise ValueError(f'send_window.{key} must be a time of day as HH:MM (00:00 to 23:59), e.g. "09:00"')
    return int(match.group(1)) * 60 + int(match.group(2))


class Holidays(Strict):
    """Days the send window stays shut, in the window's time zone."""

    country: str | None = Field(default=None, min_length=2, max_length=3)
    """An ISO 3166 country code whose public holidays (the `holidays` package's calendar) shut the window, e.g. `US`,
    `DE`; none by default."""
    subdivision: str | None = Field(default=None, min_length=1, max_length=10)
    """A subdivision of `country` with its own holidays (a state, province or region: `CA`, `BY`); none by default."""
    dates: tuple[dt.date, ...] = ()
    """More days the window stays shut (`YYYY-MM-DD`): company closures, a local holiday."""

    @model_validator(mode="after")
    def _known_to_the_calendar(self) -> Holidays:
        if self.subdivision is not None and self.country is None:
            raise ValueError("send_window.holidays.subdivision needs a country")
        if self.country is None:
            return self
        import holidays  # here: only a deployment with holidays configured pays for the calendars

        supported = holidays.list_supported_countries()
        if self.country not in supported:
            raise ValueError(
                f"send_window.holidays.country: {self.country!r} is not a country the holidays package knows "
                "(an ISO 3166 alpha-2 code in capitals, e.g. US, DE, GB)"
            )
        subdivisions = supported[self.country]
        if self.subdivision is not None and self.subdivision not in subdivisions:
            shown = ", ".join(subdivisions[:12]) + (", …" if len(subdivisions) > 12 else "")
            raise ValueError(
                f"send_window.holidays.subdivision: {self.subdivision!r} is not a subdivision of {self.country} "
                f"the holidays package knows ({shown or 'it has none'})"
            )
        return self


class SendWindow(Strict):
    """When emails may go: weekdays and hours, in the business time zone or the customer's, outside holidays."""

    days: tuple[str, ...] = ("mon", "tue", "wed", "thu", "fri")
    """The weekdays the window opens on: `mon` … `sun` (or full names)."""
    start: str = "09:00"
    """When the window opens on those days, `HH:MM`, local time."""
    end: str = "17:00"
    """When it closes, `HH:MM`, local time (not included); after `start`: a window does not span midnight."""
    timezone: Literal["business", "customer"] = "business"
    """`business`: the top-level `timezone`; `customer`: each row's `customer_timezone` (an IANA name), the
    business zone when it is missing or unknown."""
    holidays: Holidays = Holidays()
    """Holidays that shut the window all day."""

    @field_validator("days", mode="before")
    @classmethod
    def _weekdays(cls, value: object) -> object:
        if not isinstance(value, list | tuple) or not value:
            raise ValueError("send_window.days must be a list of weekdays such as [mon, tue, wed, thu, fri]")
        names = []
        for day in value:
            text = str(day).strip().lower() if isinstance(day, str) else None
            if text in _FULL_NAMES:
                text = WEEKDAYS[_FULL_NAMES[text]]
            if text not in WEEKDAYS:
                raise ValueError(f"send_window.days: {day!r} is not a weekday (use mon, tue, wed, thu, fri, sat, sun)")
            names.append(text)
        if len(set(names)) != len(names):
            raise ValueError("send_window.days lists a weekday twice")
        return tuple(names)

    @field_validator("start", "end")
    @classmethod
    def _clock(cls, value: str, info: ValidationInfo) -> str:
        _minutes(value, str(info.field_name))
        return value

    @model_validator(mode="after")
    def _start_before_end(self) -> SendWindow:
        if _minutes(self.start, "start") >= _minutes(self.end, "end"):
            raise ValueError(f"send_window.start ({self.start}) must be before send_window.end ({self.end})")
        return self

    @property
    def start_minute(self) -> int:
        return _minutes(self.start, "start")

    @property
    def end_minute(self) -> int:
        return _minutes(self.end, "end")

    @property
    def weekday_numbers(self) -> frozenset[int]:
        """Python's weekday numbers (Monday 0) the window opens on."""
        return frozenset(WEEKDAYS.index(d) for d in self.days)


class Escalation(Strict):
    """After the last reminder: once per invoice and cycle, a signed webhook to a collections system."""

    after_days: Count = Field(ge=0, le=3650)
    """Days past the due date (business `timezone`) at which a still-owed invoice is handed over."""
    webhook_url: str
    """Where the hand-over is POSTed as JSON: https, or http to this machine only."""
    secret_env: EnvName
    """The name of the environment variable holding the signing secret (`Dunning-Signature`: HMAC-SHA256)."""
    timeout_seconds: Number = Field(default=10.0, gt=0, le=600)
    """Seconds to wait for the receiver; a timeout after the request left is `unknown`, resubmitted under the same
    `Idempotency-Key` by a later run."""
    stop_reminders: Flag = True
    """From the escalation's claim, no more reminders for that invoice in the cycle."""
    after_broken_promises: Count | None = Field(default=None, ge=1, le=100)
    """Escalate an invoice at its Nth broken promise to pay in a cycle (`dunning promise`), without waiting for
    `after_days`; none: broken promises do not escalate by themselves."""

    @field_validator("webhook_url")
    @classmethod
    def _https(cls, value: str) -> str:
        return http_url(value, "escalation.webhook_url") or value


class PolicyMatch(Strict):
    """Which invoices a policy governs: every key given must hold (none given: every invoice)."""

    segment: tuple[str, ...] | None = None
    """Any of these values of the snapshot's optional `segment` column (Stripe: customer metadata
    `dunning_segment`)."""
    currency: tuple[str, ...] | None = None
    """Any of these currencies (ISO 4217, any case)."""
    min_amount_minor: Annotated[int, Field(strict=True, ge=0, le=10**15)] | None = None
    """The invoice's `amount_due` is at least this (minor units)."""
    max_amount_minor: Annotated[int, Field(strict=True, ge=0, le=10**15)] | None = None
    """The invoice's `amount_due` is at most this (minor units)."""

    @field_validator("currency")
    @classmethod
    def _upper(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if value is None else tuple(c.strip().upper() for c in value)

    @model_validator(mode="after")
    def _range(self) -> PolicyMatch:
        low, high = self.min_amount_minor, self.max_amount_minor
        if low is not None and high is not None and low > high:
            raise ValueError("policies[].match: min_amount_minor is above max_amount_minor")
        return self


class Schedule(Strict):
    """When the hourly schedule starts a cycle."""

    cron: str = Field(
        default="0 * * * *",
        description="A five-field cron expression in the business `timezone`: the ticks at which the schedule "
        "starts a cycle (`0 * * * *`: every hour on the hour; `0 8-18 * * 1-5`: business hours on weekdays).",
    )

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        from croniter import croniter  # here, not at import: only the schedule needs it

        if len(value.split()) != 5 or not croniter.is_valid(value):
            raise ValueError("schedule.cron must be a cron expression of five fields, e.g. '0 * * * *'")
        return value

"""The guard rails of the send: `breaker:` (at most so many emails to one customer in a window), `retry:` (the
backoff of a `failed` send) and `invoice_emails:` (the invoice email itself, off by default)."""

from __future__ import annotations

from pydantic import Field

from dunning.config.base import Count, Flag, Number, Strict


class Breaker(Strict):
    max_emails: Count = Field(default=2, ge=1, le=1000)
    """The circuit breaker: at most this many emails to one customer within `window_hours`. A batch that would exceed
    it halts before sending anything and pages."""
    window_hours: Count = Field(default=24, ge=1, le=24 * 366)
    """The breaker's sliding window, in hours, over everything on record as sent or possibly sent."""


class Retry(Strict):
    """Backoff for `failed` sends: a later cycle may retry them, never an `unknown`."""

    max_attempts: Count = Field(default=5, ge=1, le=100)
    """Attempts for a `failed` send (the provider refused it) before it stays failed."""
    backoff_minutes: Number = Field(default=30.0, ge=0, le=60 * 24 * 366)
    """Minutes a `failed` send waits before a later cycle retries it (doubling with each attempt)."""


class InvoiceEmails(Strict):
    """The invoice email itself, once per invoice and billing period (`dunning.plan.invoice_emails`). Off by default:
    many billing systems send the invoice themselves."""

    enabled: Flag = False
    """Send the invoice email itself, once per invoice and billing period (many billing systems send it themselves)."""

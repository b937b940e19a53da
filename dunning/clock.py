"""The cycle's clock: one timezone-aware instant per run, UTC unless an offset is given."""

from __future__ import annotations

import datetime as dt

from dunning.errors import UserInputError


def parse_as_of(text: str | None) -> dt.datetime:
    """ISO 8601 date or date-time; a naive value is UTC. None means now."""
    if text is None:
        return dt.datetime.now(dt.timezone.utc)
    try:
        value = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UserInputError(f"--as-of {text!r} is not an ISO 8601 timestamp (e.g. 2026-11-03T15:30:00Z)") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value.astimezone(dt.timezone.utc)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)

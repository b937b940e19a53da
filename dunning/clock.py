"""The cycle's clock: one timezone-aware instant per run, UTC unless an offset is given."""

from __future__ import annotations

import datetime as dt

from dunning.errors import UserInputError

# The clocks a cycle accepts: wide enough for any real billing history, narrow enough that every date
# arithmetic built on it (windows, backoff, partitions) stays in range
EARLIEST = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)
LATEST = dt.datetime(2100, 1, 1, tzinfo=dt.timezone.utc)


def parse_as_of(text: str | None, flag: str = "--as-of") -> dt.datetime:
    """ISO 8601 date or date-time; a naive value is UTC. None means now."""
    if text is None:
        return dt.datetime.now(dt.timezone.utc)
    try:
        value = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UserInputError(f"{flag} {text!r} is not an ISO 8601 timestamp (e.g. 2026-11-03T15:30:00Z)") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    try:
        value = value.astimezone(dt.timezone.utc)
    except OverflowError:
        value = EARLIEST - dt.timedelta(days=1)
    if not EARLIEST <= value < LATEST:
        raise UserInputError(f"{flag} {text!r} is outside the supported range "
                             f"{EARLIEST:%Y-%m-%d} to {LATEST:%Y-%m-%d} (UTC)")
    return value


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)

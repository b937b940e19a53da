"""The cycle's clock: one timezone-aware instant per run, UTC unless an offset is given."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum
from zoneinfo import ZoneInfo

from dunning.errors import SnapshotError, UserInputError

# The clocks a cycle accepts: wide enough for any real billing history, narrow enough that every date
# arithmetic built on it (windows, backoff, partitions) stays in range
EARLIEST = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(2100, 1, 1, tzinfo=dt.UTC)


def parse_as_of(text: str | None, flag: str = "--as-of") -> dt.datetime:
    """ISO 8601 date or date-time; a naive value is UTC. None means now."""
    if text is None:
        return dt.datetime.now(dt.UTC)
    try:
        value = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UserInputError(f"{flag} {text!r} is not an ISO 8601 timestamp (e.g. 2026-11-03T15:30:00Z)") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    try:
        value = value.astimezone(dt.UTC)
    except OverflowError:
        value = EARLIEST - dt.timedelta(days=1)
    if not EARLIEST <= value < LATEST:
        raise UserInputError(
            f"{flag} {text!r} is outside the supported range {EARLIEST:%Y-%m-%d} to {LATEST:%Y-%m-%d} (UTC)"
        )
    return value


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# how far ahead of the wall clock a live run's --as-of may be without --allow-future-as-of: room for a clock that
# is a little ahead or a cron line written for the hour about to start, not for a day typed wrong
FUTURE_TOLERANCE = dt.timedelta(minutes=15)
ALLOW_FUTURE_FLAG = "--allow-future-as-of"


def ahead_of_wall(as_of: dt.datetime, wall: dt.datetime) -> dt.timedelta | None:
    """How far `as_of` is ahead of the wall clock `wall`, when by more than `FUTURE_TOLERANCE`; else None."""
    ahead = as_of - wall
    return ahead if ahead > FUTURE_TOLERANCE else None


def refuse_future(as_of: dt.datetime, wall: dt.datetime, allowed: bool) -> None:
    """A live run whose clock is more than `FUTURE_TOLERANCE` ahead of the wall clock is refused (UserInputError)
    unless `allowed`: it would send now what is due only then, outside the send window it believes it is in, and
    date its snapshot so that every ordinary run after it looks stale. A dry run and `preview` may look ahead."""
    ahead = ahead_of_wall(as_of, wall)
    if ahead is not None and not allowed:
        now = wall.isoformat(timespec="seconds")
        raise UserInputError(
            f"--as-of {as_of.isoformat()} is {span(ahead)} ahead of the wall clock ({now}): "
            "a live run at that clock sends now what is due only then and dates its snapshot so that later runs "
            f"look stale; pass {ALLOW_FUTURE_FLAG} if you mean it, or look ahead with --dry-run or `dunning preview`"
        )


def span(delta: dt.timedelta) -> str:
    """A duration as an operator reads it: `2 h 30 min`, `3 d 1 h`, `12 min`."""
    minutes = int(delta.total_seconds() // 60)
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    parts = [
        f"{days} d" if days else "",
        f"{hours} h" if hours else "",
        f"{minutes} min" if minutes or not (days or hours) else "",
    ]
    return " ".join(p for p in parts if p)


class RunMode(StrEnum):
    """What a run may touch, decided once per run (`cycle_clock`)."""

    LIVE = "live"  # claims, sends, opens and closes cycles
    DRY_RUN = "dry_run"  # computes and audits today's cycle; claims and sends nothing
    BACKFILL = "backfill"  # re-evaluates a past day; sends nothing, changes no live state


@dataclass(frozen=True)
class CycleClock:
    """When a run evaluates, and in which mode."""

    as_of: dt.datetime
    mode: RunMode
    partition_date: dt.date

    @property
    def live(self) -> bool:
        return self.mode is RunMode.LIVE

    @property
    def reads_live_state(self) -> bool:
        """Live and dry runs look at the ledger as it is now; a backfill at how it stood that day."""
        return self.mode is not RunMode.BACKFILL


def cycle_clock(
    run_clock: dt.datetime, partition: dt.date | None, zone: ZoneInfo, *, dry_run: bool, as_of_given: bool
) -> CycleClock:
    """The run's clock and mode. A run for a past day's partition (a backfill) is evaluated at the end of
    that business day (unless a clock was given) and is never live; a future partition is refused."""
    today = run_clock.astimezone(zone).date()
    if partition is None or partition == today:
        return CycleClock(run_clock, RunMode.DRY_RUN if dry_run else RunMode.LIVE, partition or today)
    if partition > today:
        raise SnapshotError(f"partition {partition} is in the future of the cycle's clock ({run_clock.isoformat()})")
    end_of_day = dt.datetime.combine(partition, dt.time(23, 59, 59), tzinfo=zone).astimezone(dt.UTC)
    return CycleClock(run_clock if as_of_given else end_of_day, RunMode.BACKFILL, partition)

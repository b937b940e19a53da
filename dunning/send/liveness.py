"""The dead man's switch: is the pipeline still running, and is anyone answering the `unknown` keys?

Two conditions, both measured on the wall clock against an injected `now` (never the cycle's `--as-of`):

- `stale_runs`: no live run (not dry, not a backfill, not halted by the breaker) has completed for
  `alerts.stale_after_hours`. A deployment that never recorded a live run is not stale ("never"), and
  a paused one is not paged: the schedule skips while paused, so silence is expected.
- `stale_unknown`: `unknown` keys whose outcome was recorded (`outcome_wall_at`, else `claimed_at`)
  more than `alerts.unknown_after_hours` ago.

`assess` only reads. `watch` raises at most one alert per condition per episode (none while an
unresolved alert of the same kind exists) and resolves the open alert when the condition clears, so
the next episode pages again. No Dagster here: the sensor in pipelines/sensors.py calls `watch`.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from dunning.config import Alerts
from dunning.ledger.base import Ledger
from dunning.send.alerts import Alert, raise_alert

STALE_RUNS = "stale_runs"
STALE_UNKNOWN = "stale_unknown"
KINDS = (STALE_RUNS, STALE_UNKNOWN)


@dataclass(frozen=True)
class Liveness:
    now: dt.datetime
    stale_after_hours: float
    unknown_after_hours: float
    last_live_run: dict[str, Any] | None  # the last completed live run: run_id, as_of, finished_wall_at, ...
    hours_since_last_live_run: float | None  # None: no live run ever completed
    stale_runs: bool
    paused: bool
    unknown_overdue: int
    oldest_unknown_since: dt.datetime | None
    oldest_unknown_key: str | None

    @property
    def pages_stale_runs(self) -> bool:
        return self.stale_runs and not self.paused

    @property
    def stale_unknown(self) -> bool:
        return self.unknown_overdue > 0


def hours_between(earlier: dt.datetime, later: dt.datetime) -> float:
    return max(0.0, (later - earlier).total_seconds() / 3600)


def wall(ts: dt.datetime | None) -> str:
    return "never" if ts is None else f"{ts.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC"


def assess(ledger: Ledger, settings: Alerts, now: dt.datetime) -> Liveness:
    last = ledger.last_live_run(completed_only=True)
    hours = hours_between(last["finished_wall_at"], now) if last else None
    count, oldest, key = ledger.unknown_waiting_since(now - dt.timedelta(hours=settings.unknown_after_hours))
    return Liveness(
        now=now,
        stale_after_hours=settings.stale_after_hours,
        unknown_after_hours=settings.unknown_after_hours,
        last_live_run=last,
        hours_since_last_live_run=hours,
        stale_runs=hours is not None and hours > settings.stale_after_hours,
        paused=ledger.is_paused(),
        unknown_overdue=count,
        oldest_unknown_since=oldest,
        oldest_unknown_key=key,
    )


def _hours(value: float) -> str:
    return f"{value:g}" if float(value).is_integer() else f"{value:.1f}"


def stale_runs_message(state: Liveness) -> str:
    last, hours = state.last_live_run, state.hours_since_last_live_run
    if last is None or hours is None:
        return "no live run recorded yet"
    return (
        f"no live run has completed for {hours:.1f} h "
        f"(alerts.stale_after_hours: {_hours(state.stale_after_hours)}); last: {last['run_id'][:8]} "
        f"finished {wall(last['finished_wall_at'])}"
    )


def stale_unknown_message(state: Liveness) -> str:
    return (
        f"{state.unknown_overdue} unknown key(s) waiting over {_hours(state.unknown_after_hours)} h for a human "
        f"(oldest {state.oldest_unknown_key} since {wall(state.oldest_unknown_since)}); "
        f"check with the provider, then `dunning resolve KEY --sent|--not-sent`"
    )


def _alert(state: Liveness, kind: str) -> Alert:
    if kind == STALE_RUNS:
        last = state.last_live_run or {}
        return Alert(
            kind=kind,
            message=stale_runs_message(state),
            created_at=state.now,
            severity="critical",
            details={
                "last_live_run": last.get("run_id"),
                "finished_wall_at": last.get("finished_wall_at"),
                "hours": round(state.hours_since_last_live_run or 0.0, 2),
                "stale_after_hours": state.stale_after_hours,
            },
            dedup_key=f"dunning-{kind}-{last.get('run_id')}",
        )
    return Alert(
        kind=kind,
        message=stale_unknown_message(state),
        created_at=state.now,
        severity="critical",
        details={
            "count": state.unknown_overdue,
            "oldest_key": state.oldest_unknown_key,
            "oldest_since": state.oldest_unknown_since,
            "unknown_after_hours": state.unknown_after_hours,
        },
        dedup_key=f"dunning-{kind}-{state.oldest_unknown_key}",
    )


def watch(
    ledger: Ledger, settings: Alerts, now: dt.datetime, logger: logging.Logger | None = None
) -> tuple[Liveness, dict[str, str]]:
    """Assess, then page or resolve: returns the state and, per kind, `raised`, `still open`, `resolved` or `clear`."""
    state = assess(ledger, settings, now)
    actions: dict[str, str] = {}
    for kind, firing in ((STALE_RUNS, state.pages_stale_runs), (STALE_UNKNOWN, state.stale_unknown)):
        if firing:
            if ledger.open_alert(kind) is None:
                raise_alert(ledger, settings, _alert(state, kind), logger)
                actions[kind] = "raised"
            else:
                actions[kind] = "still open"
        else:
            actions[kind] = "resolved" if ledger.resolve_alerts(kind, now) else "clear"
    return state, actions


def describe(state: Liveness, actions: dict[str, str] | None = None) -> str:
    """One line for a sensor tick: both conditions and what was done about them."""
    actions = actions or {}
    last, hours = state.last_live_run, state.hours_since_last_live_run
    if last is None or hours is None:
        runs = "no live run recorded yet"
    else:
        runs = f"last live run {last['run_id'][:8]} {hours:.1f} h ago" + (
            " (stale" + (", paused: not paged" if state.paused else "") + ")" if state.stale_runs else ""
        )
    unknown = f"{state.unknown_overdue} unknown key(s) over {_hours(state.unknown_after_hours)} h"
    done = "; ".join(f"{kind}: {action}" for kind, action in actions.items())
    return f"{runs}; {unknown}" + (f" [{done}]" if done else "")

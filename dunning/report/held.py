"""Why keys wait, counted per reason, and when the send window opens: what `preview`, the run summary and
`status` say about held keys.

A key can wait for several reasons at once (outside the send window *and* without a usable address). The audit
keeps one reason per key (`dunning_audit.reason`, the first in `dunning.plan.schedule.REASON_ORDER`) and the others
in `also_held`; the counts here take every reason a key has, so a data problem someone must fix is never hidden
behind the clock. The invoices held for a data problem (`DATA_PROBLEMS`) are named, so the fix can start now rather
than at the window's opening.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import polars as pl

from dunning.config import DunningConfig
from dunning.plan.policy import address_problem_expr
from dunning.plan.schedule import ALSO_HELD
from dunning.vocabulary import DATA_PROBLEMS, HoldReason


def key_reasons(rows: pl.DataFrame, *, reason: str = "reason") -> pl.DataFrame:
    """One row per (key, reason) of the held `rows`: its `reason` column and each of its `also_held`."""
    also = pl.col(ALSO_HELD) if ALSO_HELD in rows.columns else pl.lit(None, dtype=pl.String)
    listed = pl.concat_list(pl.col(reason).cast(pl.String), also.fill_null("").str.split(",")).list.drop_nulls()
    columns = [c for c in ("idempotency_key", "invoice_id", "customer_id") if c in rows.columns]
    return (
        rows.select(*columns, listed.alias("_reasons"))
        .explode("_reasons")
        .filter(pl.col("_reasons").is_not_null() & (pl.col("_reasons") != ""))
        .rename({"_reasons": "reason"})
        .unique(maintain_order=True)
    )


def counts(exploded: pl.DataFrame) -> dict[str, int]:
    """Keys per reason (a key counted once under each reason it has), by reason name."""
    if exploded.is_empty():
        return {}
    return {str(r): int(n) for r, n in exploded.group_by("reason").len().sort("reason").iter_rows()}


def data_problems(exploded: pl.DataFrame) -> list[dict[str, str]]:
    """The invoices held for a data problem: invoice, customer and the problem, one entry per invoice."""
    rows = exploded.filter(pl.col("reason").is_in(DATA_PROBLEMS))
    if rows.is_empty() or "invoice_id" not in rows.columns:
        return []
    return (
        rows.group_by("invoice_id", maintain_order=True)
        .agg(pl.col("customer_id").first(), pl.col("reason").first())
        .sort("invoice_id")
        .to_dicts()
    )


def plan_reasons(due: pl.DataFrame) -> pl.DataFrame:
    """`key_reasons` of the plan's due rows before the send: their `hold`, else why they have no usable address,
    and the rest (`also_held`)."""
    problem = address_problem_expr() if "customer_email" in due.columns else pl.lit(str(HoldReason.NO_EMAIL_ADDRESS))
    first = pl.coalesce(pl.col("hold"), pl.when(~pl.col("sendable").fill_null(False)).then(problem))
    rows = due.with_columns(first.alias("_first"))
    return key_reasons(rows.filter(pl.col("_first").is_not_null()), reason="_first")


@dataclass(frozen=True)
class WindowOpening:
    """When a policy's send window next opens for the keys it holds."""

    policy: str
    opens_at: dt.datetime | None  # UTC; None: not within a year
    timezone: str  # the zone the window is read in (the business zone, or "customer" zones)
    keys: int
    start: str = ""  # the window's local opening time, "09:00"

    def minutes_from(self, as_of: dt.datetime) -> int | None:
        if self.opens_at is None:
            return None
        return max(0, int((self.opens_at - as_of).total_seconds() // 60))

    def describe(self, as_of: dt.datetime, zone: ZoneInfo) -> str:
        """`09:00 Europe/Berlin (in 1 h 29 m)`; another day's opening names the day."""
        if self.opens_at is None:
            return "not within the next year (check send_window.days and holidays)"
        local = self.opens_at.astimezone(zone)
        day = "" if local.date() == as_of.astimezone(zone).date() else local.strftime("%a %Y-%m-%d ")
        when = f"{day}{local:%H:%M} {zone.key} (in {span(self.minutes_from(as_of) or 0)})"
        if self.timezone == "customer":
            return f"{self.start} in each customer's time zone, first at {when}"
        return when

    def as_json(self, as_of: dt.datetime) -> dict[str, object]:
        return {
            "policy": self.policy,
            "opens_at": self.opens_at.isoformat() if self.opens_at else None,
            "timezone": self.timezone,
            "in_minutes": self.minutes_from(as_of),
            "keys": self.keys,
        }


def span(minutes: int) -> str:
    """`1 h 29 m`, `2 d 3 h`, `45 m`."""
    days, rest = divmod(minutes, 1440)
    hours, mins = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    return f"{hours} h {mins} m" if hours else f"{mins} m"


def window_openings(due: pl.DataFrame, config: DunningConfig) -> list[WindowOpening]:
    """Per policy holding keys outside its send window: when the window next opens (the earliest `waits_until`)."""
    if "waits_until" not in due.columns or "hold" not in due.columns:
        return []
    waiting = due.filter(pl.col("hold") == HoldReason.OUTSIDE_SEND_WINDOW)
    if waiting.is_empty():
        return []
    windows = {p.name: p.send_window for p in config.resolved_policies()}
    grouped = waiting.group_by("policy").agg(pl.col("waits_until").min(), pl.len().alias("keys")).sort("policy")
    openings = []
    for policy, opens_at, keys in grouped.iter_rows():
        window = windows.get(str(policy))
        zone = "customer" if window is not None and window.timezone == "customer" else config.timezone
        start = "" if window is None else "{:02d}:{:02d}".format(*divmod(window.start_minute, 60))
        openings.append(WindowOpening(str(policy), opens_at, zone, int(keys), start))
    return openings

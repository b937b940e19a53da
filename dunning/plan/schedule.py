"""When a due key may go: send windows and holidays, spacing between reminders, and what the templates learn of a
reminder's place in its cycle.

Scheduling only decides *when* a key is claimed, never *whether*: a key that waits (audit reason
`outside_send_window` or `spacing`, with `waits_until`) is not claimed, so nothing of it is on record, and it stays
newly due for the first run the schedule allows. A stage is skipped only because a higher stage was reached while
it waited, as for any catch-up.

Windows are evaluated once per (policy, time zone) pair in Python (a few dozen pairs at most: the zones a snapshot
names) and joined onto the plan's rows; spacing is one join of the plan with each customer's last reminder. No loop
runs per row.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import polars as pl

from dunning.config import DunningConfig, Holidays, ResolvedPolicy, SendWindow
from dunning.ledger.stores.schedule_store import REMINDERS_SENT_SCHEMA
from dunning.plan.policy import address_problem_expr
from dunning.vocabulary import EmailKind, HoldReason

UTC_TYPE = pl.Datetime("us", "UTC")
ZONE = "send_zone"  # the plan's working column: the time zone a row's window is read in
SEARCH_DAYS = 400  # how far ahead the next opening is looked for (a window shut for longer opens "never")


@functools.lru_cache(maxsize=4096)
def _zone(name: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def known_zones(names: pl.Series) -> set[str]:
    """Which of the distinct `names` are IANA time zones this machine knows."""
    return {n for n in names.drop_nulls().unique().to_list() if n and _zone(n) is not None}


def unknown_timezones(snapshot: pl.DataFrame) -> int:
    """Rows whose `customer_timezone` is given but unknown: their window is read in the business zone."""
    if "customer_timezone" not in snapshot.columns:
        return 0
    given = snapshot.get_column("customer_timezone").drop_nulls()
    known = known_zones(given)
    return int((~given.is_in(sorted(known))).sum())


@functools.lru_cache(maxsize=256)
def _holidays(calendar: Holidays, year: int) -> frozenset[dt.date]:
    days = set(calendar.dates)
    if calendar.country is not None:
        import holidays  # only a window with a country calendar pays for it

        days |= set(holidays.country_holidays(calendar.country, subdiv=calendar.subdivision, years=[year, year + 1]))
    return frozenset(days)


def is_business_day(day: dt.date, config: DunningConfig) -> bool:
    """Monday to Friday, and not a holiday of the top-level send window's calendar where one is configured."""
    if day.weekday() >= 5:
        return False
    window = config.send_window
    return window is None or day not in _holidays(window.holidays, day.year)


@dataclass(frozen=True)
class Opening:
    open_now: bool
    opens_at: dt.datetime | None  # when it next opens (UTC); `as_of` when open now; None: not within SEARCH_DAYS


def opening(window: SendWindow, zone: ZoneInfo, as_of: dt.datetime) -> Opening:
    """Whether `window` is open at `as_of` in `zone`, and when it next opens (its start on the next weekday it opens
    that is no holiday, in local time, so a daylight-saving change moves it with the clock)."""
    local = as_of.astimezone(zone)
    start, end = dt.time(*divmod(window.start_minute, 60)), dt.time(*divmod(window.end_minute, 60))
    for offset in range(SEARCH_DAYS):
        day = local.date() + dt.timedelta(days=offset)
        if day.weekday() not in window.weekday_numbers or day in _holidays(window.holidays, day.year):
            continue
        opens = dt.datetime.combine(day, start, tzinfo=zone)
        closes = dt.datetime.combine(day, end, tzinfo=zone)
        if offset == 0 and opens <= as_of < closes:
            return Opening(True, as_of)
        if as_of < opens:
            return Opening(False, opens.astimezone(dt.UTC))
    return Opening(False, None)


def _zone_column(policy: ResolvedPolicy, business: str, known: set[str], columns: set[str]) -> pl.Expr:
    window = policy.send_window
    if window is None or window.timezone == "business" or "customer_timezone" not in columns:
        return pl.lit(business, dtype=pl.String)
    customer = pl.col("customer_timezone")
    return pl.when(customer.is_in(sorted(known))).then(customer).otherwise(pl.lit(business, dtype=pl.String))


def window_holds(plan: pl.DataFrame, config: DunningConfig, as_of: dt.datetime) -> pl.DataFrame:
    """`plan` with `window_hold` (`outside_send_window` or null) and `window_opens_at` for every row, from its
    policy's window in its time zone."""
    policies = {p.name: p for p in config.resolved_policies()}
    if all(p.send_window is None for p in policies.values()):
        return plan.with_columns(
            pl.lit(None, dtype=pl.String).alias("window_hold"), pl.lit(None, dtype=UTC_TYPE).alias("window_opens_at")
        )
    columns = set(plan.columns)
    known = known_zones(plan.get_column("customer_timezone")) if "customer_timezone" in columns else set()
    zone_of = pl.lit(config.timezone, dtype=pl.String)
    for name, policy in policies.items():
        zone_expr = _zone_column(policy, config.timezone, known, columns)
        zone_of = pl.when(pl.col("policy") == name).then(zone_expr).otherwise(zone_of)
    zoned = plan.with_columns(zone_of.alias(ZONE))
    pairs = zoned.select("policy", ZONE).unique()
    rows = []
    for name, zone_name in pairs.iter_rows():
        window = policies[name].send_window if name in policies else None
        state = Opening(True, as_of) if window is None else opening(window, _zone(zone_name) or config.zone, as_of)
        rows.append((name, zone_name, None if state.open_now else str(HoldReason.OUTSIDE_SEND_WINDOW), state.opens_at))
    states = pl.DataFrame(
        rows,
        schema={"policy": pl.String, ZONE: pl.String, "window_hold": pl.String, "window_opens_at": UTC_TYPE},
        orient="row",
    )
    return zoned.join(states, on=["policy", ZONE], how="left", maintain_order="left").drop(ZONE)


def spacing_hours(cycled: pl.DataFrame, config: DunningConfig) -> pl.DataFrame:
    """Per customer with an invoice in an open cycle: the largest `min_hours_between_reminders` among the policies
    of their invoices (`spacing_hours`); only customers with some spacing."""
    hours = {p.name: p.min_hours_between_reminders for p in config.resolved_policies()}
    if not any(hours.values()):
        return pl.DataFrame(schema={"customer_id": pl.String, "spacing_hours": pl.Float64})
    return (
        cycled.filter(pl.col("in_cycle") & pl.col("owed"))
        .select("customer_id", pl.col("policy").replace_strict(hours, default=0.0, return_dtype=pl.Float64))
        .group_by("customer_id")
        .agg(pl.col("policy").max().alias("spacing_hours"))
        .filter(pl.col("spacing_hours") > 0)
    )


def spacing_holds(plan: pl.DataFrame, spacing: pl.DataFrame, last: pl.DataFrame, as_of: dt.datetime) -> pl.DataFrame:
    """`plan` with `spacing_hold` (`spacing` or null) and `spacing_ends_at`: a reminder to a customer whose last
    reminder (`last`: customer_id, last_reminder_at) is less than their `spacing` hours before `as_of` waits until
    that many hours after it."""
    if not spacing.height or not last.height:  # no one waits: two joins of every plan row (0.04 s at 1.2M) skipped
        return plan.with_columns(
            pl.lit(None, dtype=pl.String).alias("spacing_hold"), pl.lit(None, dtype=UTC_TYPE).alias("spacing_ends_at")
        )
    joined = plan.join(spacing, on="customer_id", how="left").join(last, on="customer_id", how="left")
    hours = (pl.col("spacing_hours") * 3_600_000_000).cast(pl.Int64)
    ends = pl.col("last_reminder_at") + pl.duration(microseconds=hours)
    waits = (pl.col("kind") == EmailKind.REMINDER) & (ends > pl.lit(as_of, dtype=UTC_TYPE)).fill_null(False)
    return joined.with_columns(
        pl.when(waits).then(pl.lit(str(HoldReason.SPACING))).otherwise(None).alias("spacing_hold"),
        pl.when(waits).then(ends).otherwise(None).cast(UTC_TYPE).alias("spacing_ends_at"),
    ).drop("spacing_hours", "last_reminder_at")


def max_spacing(config: DunningConfig) -> dt.timedelta:
    return dt.timedelta(hours=max(p.min_hours_between_reminders for p in config.resolved_policies()))


SEND_ROLES = ("due", "retry")
# the plan's (and the audit's) column of the reasons a key waits for beyond its one `hold` (comma-separated, in
# `REASON_ORDER`; null when it has only one): `preview` and `status` count every reason a key has, so a data problem
# (no usable address) never hides behind the clock
ALSO_HELD = "also_held"
# the order in which a key's reasons are tried for its one audit reason: the plan's own hold (exclusions, a
# dispute, a suppressed address, a payment in flight, the minimum balance), then an escalation, the send window,
# spacing, and last no usable address (the audit's `no_email_address`, `invalid_address`)
REASON_ORDER = ("plan", HoldReason.ESCALATED, HoldReason.OUTSIDE_SEND_WINDOW, HoldReason.SPACING,
                HoldReason.NO_EMAIL_ADDRESS)  # fmt: skip


def _address_problem(columns: list[str]) -> pl.Expr:
    if "customer_email" in columns:
        return address_problem_expr()
    return pl.lit(str(HoldReason.NO_EMAIL_ADDRESS))


def _also_held(*reasons: pl.Expr) -> pl.Expr:
    """The reasons after the first of `reasons` (in order, without repeats), comma-joined; null for one or none.

    In string operations, not lists: a reason equal to an earlier one is dropped, the others joined, and what
    follows the first comma kept (reasons are names without commas). Building a list per row and making it unique
    cost 1.2 s of a new 1M deployment's plan (1.2M rows), this 0.1 s."""
    texts = [r.cast(pl.String) for r in reasons]
    distinct = [texts[0]]
    for i, text in enumerate(texts[1:], start=1):
        repeated = pl.any_horizontal([text == earlier for earlier in texts[:i]]).fill_null(False)
        distinct.append(pl.when(repeated).then(None).otherwise(text))
    joined = pl.concat_str(distinct, separator=",", ignore_nulls=True)
    return joined.str.splitn(",", 2).struct.field("field_1").cast(pl.String)


def _also_held_of_some(plan: pl.DataFrame, sends: pl.Expr, reasons: tuple[pl.Expr, ...]) -> pl.Series:
    """`ALSO_HELD` of `plan`'s rows (`_also_held` of `reasons` where `sends`, else null), joined as text only for
    the rows with two reasons or more: the others have no second reason to name, and joining text for every row
    of a new 1M deployment's plan (1.2M rows, nearly all with one reason or none) was 0.37 s of its 0.5."""
    several = (sends & (pl.sum_horizontal([r.is_not_null() for r in reasons]) >= 2)).fill_null(False)
    rows = plan.select(several).to_series()
    column = pl.repeat(None, plan.height, dtype=pl.String, eager=True).alias(ALSO_HELD)
    if rows.any():
        column = column.scatter(rows.arg_true(), plan.filter(rows).select(_also_held(*reasons)).to_series())
    return column


EMPTY_LAST = pl.Schema({"customer_id": pl.String(), "last_reminder_at": UTC_TYPE})


def scheduled(
    plan: pl.DataFrame,
    cycled: pl.DataFrame,
    config: DunningConfig,
    as_of: dt.datetime,
    *,
    counts: pl.DataFrame | None = None,
    spacing: pl.DataFrame | None = None,
    last: pl.DataFrame | None = None,
    stopped: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """The plan with the schedule applied to its due and retry keys: `hold` gains `escalated` (reminders of an
    invoice handed over, `stopped`: invoice_id, cycle, and `reason` when it is another, `escalation_refused`),
    `outside_send_window` (email kinds) and `spacing`
    (reminders), in that order after the plan's own holds; `waits_until` says when a waiting key may go; and
    `reminders_sent_before` (`counts`, per invoice and cycle; 0 without one) is what the templates' first contact
    is judged on. A row without a policy (a notice, an invoice email) takes its invoice's."""
    if "policy" not in plan.columns:
        plan = plan.with_columns(pl.lit(None, dtype=pl.String).alias("policy"))
    unassigned = plan.filter(pl.col("policy").is_null()).select("invoice_id").unique()
    if unassigned.height:  # only those rows look their invoice up: the snapshot may be a million rows
        by_invoice = cycled.select("invoice_id", pl.col("policy").alias("invoice_policy")).join(
            unassigned, on="invoice_id", how="semi"
        )
        plan = (
            plan.join(by_invoice, on="invoice_id", how="left", maintain_order="left")
            .with_columns(pl.coalesce("policy", "invoice_policy", pl.lit("default")).alias("policy"))
            .drop("invoice_policy")
        )
    if counts is not None and counts.height:
        plan = plan.join(
            counts.cast(REMINDERS_SENT_SCHEMA), on=["invoice_id", "cycle"], how="left", maintain_order="left"
        )
        plan = plan.with_columns(pl.col("reminders_sent_before").fill_null(0))
    else:  # nothing sent before (a new deployment): a join of every plan row (0.1 s at 1.2M) for zeros
        plan = plan.with_columns(
            pl.lit(0, dtype=REMINDERS_SENT_SCHEMA["reminders_sent_before"]).alias("reminders_sent_before")
        )
    plan = window_holds(plan, config, as_of)
    last = last if last is not None else pl.DataFrame(schema=EMPTY_LAST)
    if spacing is None:
        spacing = pl.DataFrame(schema={"customer_id": pl.String, "spacing_hours": pl.Float64})
    plan = spacing_holds(plan, spacing, last.cast(EMPTY_LAST), as_of)
    if stopped is not None and stopped.height:
        why = pl.col("reason") if "reason" in stopped.columns else pl.lit(str(HoldReason.ESCALATED))
        stop = stopped.select("invoice_id", "cycle", why.alias("escalated_hold"))
        plan = plan.join(stop, on=["invoice_id", "cycle"], how="left", maintain_order="left")
    else:
        plan = plan.with_columns(pl.lit(None, dtype=pl.String).alias("escalated_hold"))
    is_email = pl.col("kind") != EmailKind.ESCALATION
    is_reminder = pl.col("kind") == EmailKind.REMINDER
    sends = pl.col("role").is_in(SEND_ROLES)
    holds = (
        pl.col("hold"),
        pl.when(is_reminder).then(pl.col("escalated_hold")),
        pl.when(is_email).then(pl.col("window_hold")),
        pl.when(is_reminder).then(pl.col("spacing_hold")),
    )
    hold = pl.coalesce(*holds)  # the first reason holds the key; the others, and an address problem, are named after
    reasons = (*holds, pl.when(is_email & ~pl.col("sendable").fill_null(False)).then(_address_problem(plan.columns)))
    plan = plan.with_columns(
        pl.when(sends).then(hold).otherwise(pl.col("hold")).alias("hold"), _also_held_of_some(plan, sends, reasons)
    )
    waits = (
        pl.when(pl.col("hold") == HoldReason.OUTSIDE_SEND_WINDOW)
        .then(pl.col("window_opens_at"))
        .when(pl.col("hold") == HoldReason.SPACING)
        .then(pl.col("spacing_ends_at"))
        .cast(UTC_TYPE)
    )
    return plan.with_columns(waits.alias("waits_until")).drop(
        "window_hold", "window_opens_at", "spacing_hold", "spacing_ends_at", "escalated_hold"
    )

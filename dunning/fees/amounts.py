"""What may be charged on one invoice, by the law its policy's preset names: the compensation and the interest.

Money is `Decimal` throughout, never float: interest is simple, on the remaining balance, for each day from the day
after the due date to the run's day (both in the business timezone), at the reference rate of each half-year plus
the points, 1/365 of the annual rate per day, rounded half-up to the minor unit once, at the end.

A consumer is charged only when `customer_types` lists `consumer`, and then never what the law reserves for
businesses: no compensation under any preset, and interest only under `de` (5 points) or by your own `interest`
under preset `none`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from dunning.config import Compensation, Fees, Interest
from dunning.currencies import in_major_units
from dunning.fees.rates import Reference, half_year_end

COMPENSATION = "compensation"
INTEREST = "interest"
KINDS = (COMPENSATION, INTEREST)
RATE_UNKNOWN = "rate_unknown"  # the audit's reason when interest waits for the rate table
DAYS_PER_YEAR = Decimal(365)
LABELS = {  # what an email calls each kind, by language
    "en": {COMPENSATION: "Late payment compensation", INTEREST: "Statutory interest"},
    "de": {COMPENSATION: "Verzugspauschale", INTEREST: "Verzugszinsen"},
}

# the preset's interest per customer type (None: no statutory interest for that type)
_PRESET_INTEREST: dict[str, dict[str, Interest | None]] = {
    "eu_b2b": {"business": Interest(reference="ecb_mro", points=8.0), "consumer": None},
    "de": {"business": Interest(reference="de_basiszins", points=9.0),
           "consumer": Interest(reference="de_basiszins", points=5.0)},
    "uk": {"business": Interest(reference="boe_base", points=8.0), "consumer": None},
}  # fmt: skip
_PRESET_LAW = {
    "eu_b2b": "Directive 2011/7/EU on combating late payment in commercial transactions",
    "de": "§ 288 BGB",
    "uk": "the Late Payment of Commercial Debts (Interest) Act 1998",
}
UK_BANDS = ((100_000, 4_000), (1_000_000, 7_000))  # below GBP 1,000: 40; below 10,000: 70; from 10,000: 100
UK_TOP = 10_000


@dataclass(frozen=True)
class Charge:
    kind: str
    amount_minor: int
    currency: str
    basis: str  # the rule, the rate and the days, in words


@dataclass(frozen=True)
class Waiting:
    kind: str
    reason: str
    reference: str


def law_of(fees: Fees) -> str | None:
    """The law a preset claims under, in words (none for preset `none`)."""
    return _PRESET_LAW.get(fees.preset)


def chargeable(fees: Fees, customer_type: str) -> bool:
    return customer_type in fees.customer_types


def compensation_for(fees: Fees, customer_type: str, currency: str, remaining_minor: int) -> Charge | None:
    """The fixed compensation for one late invoice, or None (a consumer under a preset, another currency, none)."""
    if not chargeable(fees, customer_type) or remaining_minor <= 0:
        return None
    if fees.preset != "none" and customer_type == "consumer":
        return None  # every preset's compensation is for businesses only (2011/7/EU art. 6, § 288 (5) BGB, 1998 Act)
    own: Compensation | None = fees.compensation
    if own is not None:
        if own.currency != currency:
            return None
        return Charge(COMPENSATION, own.amount_minor, currency, f"fixed compensation per late invoice{_under(fees)}")
    if fees.preset in ("eu_b2b", "de") and currency == "EUR":
        rule = "EUR 40 per late invoice" + (" (§ 288 (5) BGB)" if fees.preset == "de" else " (2011/7/EU art. 6)")
        return Charge(COMPENSATION, 4_000, currency, f"fixed compensation: {rule}")
    if fees.preset == "uk" and currency == "GBP":
        amount = next((fee for below, fee in UK_BANDS if remaining_minor < below), UK_TOP)
        debt = in_major_units(remaining_minor, "GBP")
        return Charge(COMPENSATION, amount, currency,
                      f"fixed sum under section 5A of the 1998 Act for a debt of {debt} GBP: "
                      f"GBP {amount // 100}")  # fmt: skip
    return None


def interest_of(fees: Fees, customer_type: str) -> Interest | None:
    """The interest rule for this customer type: your own `interest`, else the preset's."""
    if not chargeable(fees, customer_type):
        return None
    if fees.preset != "none":
        statutory = _PRESET_INTEREST[fees.preset][customer_type]
        if statutory is None:
            return None  # the preset's law gives no interest against a consumer
        return statutory if customer_type == "consumer" else (fees.interest or statutory)
    return fees.interest


@dataclass(frozen=True)
class Schedule:
    """The rate-days of one interest rule from one due date to one day: `rate_days` is the sum over its periods of
    the annual rate (percent) times the days, so the interest on a balance is `balance * rate_days / 36500`."""

    rate_days: Decimal
    periods: tuple[str, ...]


def interest_schedule(
    rule: Interest, table: dict[str, Reference], *, due_date: dt.date, today: dt.date
) -> Schedule | Waiting | None:
    """The periods from the day after `due_date` to `today` with their rates, or Waiting when a day's rate is not
    known, or None when no day has passed."""
    first = due_date + dt.timedelta(days=1)
    if today < first:
        return None
    points = Decimal(str(rule.points))
    rate_days = Decimal(0)
    periods: list[str] = []
    start = first
    while start <= today:
        end = min(half_year_end(start), today)
        if rule.reference == "fixed":
            reference_rate = Decimal(str(rule.rate_percent))
        else:
            known = table[rule.reference].rate_on(start)
            if known is None or table[rule.reference].rate_on(end) is None:
                return Waiting(INTEREST, RATE_UNKNOWN, rule.reference)
            reference_rate = known
        days = (end - start).days + 1
        annual = reference_rate + points
        rate_days += annual * days
        periods.append(f"{start.isoformat()} to {end.isoformat()}: {days} day(s) at {annual:.2f} %")
        start = end + dt.timedelta(days=1)
    return Schedule(rate_days, tuple(periods))


def interest_for(
    rule: Interest, table: dict[str, Reference], fees: Fees, *, remaining_minor: int, currency: str,
    due_date: dt.date, today: dt.date, schedule: Schedule | Waiting | None = None,
) -> Charge | Waiting | None:  # fmt: skip
    """Simple interest from the day after `due_date` to `today`, or Waiting when a day's rate is not known.
    `schedule`: `interest_schedule` of the same rule and days, when the caller computed it already (one per due
    date serves every invoice due that day)."""
    if remaining_minor <= 0:
        return None
    found = schedule if schedule is not None else interest_schedule(rule, table, due_date=due_date, today=today)
    if not isinstance(found, Schedule):
        return found
    # sum over the periods of balance * annual rate / 100 * days / 365, divided once, rounded half-up once
    amount = int((Decimal(remaining_minor) * found.rate_days / (100 * DAYS_PER_YEAR)).quantize(
        Decimal(1), rounding=ROUND_HALF_UP))  # fmt: skip
    if amount <= 0:
        return None
    over = "a fixed rate" if rule.reference == "fixed" else rule.reference
    basis = (
        f"simple interest at {Decimal(str(rule.points)):.2f} points over {over}{_under(fees)} on "
        f"{in_major_units(remaining_minor, currency)} {currency}, 1/365 per day: " + "; ".join(found.periods)
    )
    return Charge(INTEREST, amount, currency, basis)


def _under(fees: Fees) -> str:
    law = law_of(fees)
    return f" under {law}" if law else ""

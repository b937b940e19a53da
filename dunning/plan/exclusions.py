"""Holding keys out of dunning before any send: excluded customers and invoices, and balances too small to dun.

An operator excludes a customer or one invoice (`dunning exclude`, kept in the
ledger's `exclusions` table) while a dispute or a payment plan is settled; with
`source.exclude_auto_advance_false`, an invoice whose snapshot row says
`auto_advance` is `false` is excluded too; and `min_remaining_minor` keeps
invoices whose remaining balance is below a per-currency minimum out of it.

The plan marks such due keys with a `hold` (`excluded`, `below_minimum`)
instead of dropping them: they are never claimed, so nothing is on record for
them, while the invoice's cycle and history keep moving. When the hold lifts,
the catch-up rule of `policy.plan_reminders` sends only the stage the invoice
has reached by then, never the ones it passed while held. The audit lists each
held key with its reason.

The rules for what an operator may type (`clean_target`, `clean_reason`,
`parse_until`) live here too, so the CLI and any other caller refuse the same
input with the same words.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence

import polars as pl

from dunning.config import DunningConfig
from dunning.errors import UserInputError
from dunning.ingest.snapshot_rules import MAX_LENGTH
from dunning.plan.clock import EARLIEST, LATEST
from dunning.safe_text import has_control
from dunning.vocabulary import EmailKind, ExclusionScope, HoldReason

# the columns of the exclusions that can hold a key (`Ledger.open_exclusions` gives these and more)
IN_FORCE_SCHEMA = pl.Schema({"scope": pl.String, "target_id": pl.String, "until_date": pl.Date})
MAX_REASON = 500
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
# the plan's `hold` column: why a due key is kept from the send, decided before anything is claimed
HOLDS = (
    HoldReason.EXCLUDED, HoldReason.BELOW_MINIMUM, HoldReason.EVENT_ADDRESS_NOT_TRUSTED, HoldReason.ESCALATED,
    HoldReason.OUTSIDE_SEND_WINDOW, HoldReason.SPACING, HoldReason.SUPPRESSED, HoldReason.PAYMENT_IN_FLIGHT,
    HoldReason.ESCALATION_REFUSED, HoldReason.PROMISED, HoldReason.REPLIED,
)  # fmt: skip
# holds that only move a send (`dunning.plan.schedule`): the key stays newly due and goes at the first run allowed;
# a run that left one is no reference for an unchanged hour (`dunning.plan.unchanged`)
WAITING_HOLDS = (HoldReason.OUTSIDE_SEND_WINDOW, HoldReason.SPACING)


def _text_problem(value: str, what: str, limit: int) -> str | None:
    if has_control(value):
        return f"{what} contains a line break or control character"
    if len(value) > limit:
        return f"{what} is longer than {limit} characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return f"{what} is not valid UTF-8 text"
    return None


def clean_target(value: str, scope: ExclusionScope) -> str:
    """A customer or invoice id as the snapshot would hold it (surrounding blanks removed; the snapshot's rules for
    its id: not empty, no control character, at most `snapshot_rules.MAX_LENGTH`); UserInputError otherwise."""
    what = f"--{scope} id"
    value = value.strip()
    if not value:
        raise UserInputError(f"{what} is empty")
    problem = _text_problem(value, what, MAX_LENGTH[f"{scope}_id"])
    if problem:
        raise UserInputError(problem)
    return value


def clean_reason(value: str | None, flag: str = "--reason") -> str | None:
    """The reason as given (blank: none), or UserInputError when it holds a control character (a bidirectional
    control included) or is too long: the one rule for every free text an operator types."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    problem = _text_problem(value, flag, MAX_REASON)
    if problem:
        raise UserInputError(problem)
    return value


def parse_until(text: str | None) -> dt.date | None:
    """`--until YYYY-MM-DD`: the last business day the exclusion holds (inclusive)."""
    if text is None:
        return None
    day = None
    if _DATE.fullmatch(text.strip()):
        try:
            day = dt.date.fromisoformat(text.strip())
        except ValueError:
            day = None
    if day is None:
        raise UserInputError(f"--until {text!r} is not a date (YYYY-MM-DD)")
    if not EARLIEST.date() <= day < LATEST.date():
        raise UserInputError(f"--until {text!r} is outside {EARLIEST:%Y-%m-%d} to {LATEST:%Y-%m-%d}")
    return day


def in_force(exclusions: pl.DataFrame, day: dt.date) -> pl.DataFrame:
    """The exclusions that hold on business day `day`: not ended by `include`, and `until_date` not before `day`."""
    return (
        exclusions.select(*IN_FORCE_SCHEMA)
        .cast(IN_FORCE_SCHEMA)
        .filter(pl.col("until_date").is_null() | (pl.col("until_date") >= day))
    )


# suppressed addresses (`ledger.stores.suppressions`) travel with the exclusions in force under this scope, so every
# caller of `hold_expr` (the plan, the resubmission of unknown sends) holds them; the exclusions table never has it
SUPPRESSED_ADDRESS = "address"
IN_FLIGHT = "in_flight"  # likewise the invoices with a payment processing (`dunning.plan.payment_signals`)
# and the collections desk's (`dunning.desk`): invoices an active promise covers, customers waiting for an answer
PROMISED = "promised"
REPLIED = "replied"


def with_held(exclusions: pl.DataFrame, scope: str, targets: Sequence[str]) -> pl.DataFrame:
    """The exclusions in force plus one row of `scope` per target, in force with no end: suppressed addresses
    (`SUPPRESSED_ADDRESS`, lower-case), invoices with a payment processing (`IN_FLIGHT`), invoices a dispute holds
    this run (`invoice`)."""
    if not targets:
        return exclusions
    rows = pl.DataFrame({"scope": scope, "target_id": list(targets), "until_date": None}, schema=IN_FORCE_SCHEMA)
    return pl.concat([exclusions.cast(IN_FORCE_SCHEMA), rows])


def _targets(exclusions: pl.DataFrame, scope: str) -> pl.Series:
    return exclusions.filter(pl.col("scope") == scope).get_column("target_id")


def hold_expr(cycled: pl.DataFrame, exclusions: pl.DataFrame | None, config: DunningConfig) -> pl.Expr:
    """Why a due key is held before sending (`excluded`, `below_minimum`, `payment_in_flight`, `suppressed`, then
    the desk's `promised` and `replied`), or null.

    `cycled` is the snapshot as the cycle saw it (its `auto_advance` column, when
    present, marks invoices to exclude under `source.exclude_auto_advance_false`);
    `exclusions` are those in force (`in_force`). The expression reads a plan
    row's `customer_id`, `invoice_id`, `currency` and `remaining_minor`, and with
    suppressed addresses among them (`with_held`) its `kind` and `customer_email`.
    """
    exclusions = exclusions if exclusions is not None else pl.DataFrame(schema=IN_FORCE_SCHEMA)
    customers = _targets(exclusions, ExclusionScope.CUSTOMER)
    invoices = _targets(exclusions, ExclusionScope.INVOICE)
    if config.source.exclude_auto_advance_false and "auto_advance" in cycled.columns:
        manual = cycled.filter(pl.col("auto_advance").str.strip_chars().str.to_lowercase() == "false")
        invoices = pl.concat([invoices, manual.get_column("invoice_id")])
    excluded = pl.col("customer_id").is_in(customers.implode()) | pl.col("invoice_id").is_in(invoices.implode())
    below = pl.lit(False)
    if config.min_remaining_minor:
        minimum = pl.col("currency").replace_strict(config.min_remaining_minor, default=0, return_dtype=pl.Int64)
        below = pl.col("remaining_minor") < minimum
    addresses = _targets(exclusions, SUPPRESSED_ADDRESS)
    suppressed = pl.lit(False)
    if addresses.len():  # an escalation is not an email: no address holds it
        email = pl.col("customer_email").str.to_lowercase()
        suppressed = (pl.col("kind") != EmailKind.ESCALATION) & email.is_in(addresses.implode()).fill_null(False)
    flight = _targets(exclusions, IN_FLIGHT)
    paying = pl.col("invoice_id").is_in(flight.implode()) if flight.len() else pl.lit(False)
    # the desk moves only the chasing: reminders and escalations wait; invoice emails and notices go
    chasing = pl.col("kind").is_in([str(EmailKind.REMINDER), str(EmailKind.ESCALATION)])
    promised_ids, replied_ids = _targets(exclusions, PROMISED), _targets(exclusions, REPLIED)
    promised = chasing & pl.col("invoice_id").is_in(promised_ids.implode()) if promised_ids.len() else pl.lit(False)
    replied = chasing & pl.col("customer_id").is_in(replied_ids.implode()) if replied_ids.len() else pl.lit(False)
    return (
        pl.when(excluded)
        .then(pl.lit(str(HoldReason.EXCLUDED)))
        .when(below)
        .then(pl.lit(str(HoldReason.BELOW_MINIMUM)))
        .when(paying)
        .then(pl.lit(str(HoldReason.PAYMENT_IN_FLIGHT)))
        .when(suppressed)
        .then(pl.lit(str(HoldReason.SUPPRESSED)))
        .when(promised.fill_null(False))
        .then(pl.lit(str(HoldReason.PROMISED)))
        .when(replied.fill_null(False))
        .then(pl.lit(str(HoldReason.REPLIED)))
        .otherwise(pl.lit(None, dtype=pl.String))
    )

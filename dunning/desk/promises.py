"""Promises to pay: what a collector may record (`dunning promise`, `--import FILE.csv`), the keys an active
promise holds, and how the first run after its date plus the grace judges it.

- **Recorded** against what the last snapshot said (the day-by-day history): an invoice must be open and owed,
  a customer must owe something; `--customer` covers the invoices the customer owes at that moment (kept in
  `promise_invoices`, with what each owed then). A date before the day of the clock, an amount above what is
  owed, an unknown or paid invoice or customer: UserInputError (exit 2), nothing recorded.
- **Holding**: while the run's business day is on or before `until` plus `promises.grace_days`, and the run's
  clock is at or after the promise was made, the reminders and escalations of the covered invoices wait (audit
  reason `promised`).
- **Judged** by the first live run whose business day is after that: `kept` when the covered invoices owe
  nothing now or their balance went down by at least `amount_minor` since the promise; `broken` otherwise, with
  one `promise_broken` alert. A broken promise's invoices take up dunning at the stage reached, and their next
  reminder's template sees `broken_promise` (`until`, `amount_minor`). A promise whose customer this run's
  snapshot (a shard's part) does not show waits for a run that does.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

import polars as pl

from dunning.config import DunningConfig
from dunning.errors import UserInputError
from dunning.ledger.base import Ledger
from dunning.plan.exclusions import clean_reason
from dunning.plan.policy import business_date
from dunning.safe_text import for_terminal
from dunning.send.alerts import Alert, raise_alert
from dunning.vocabulary import ExclusionScope, PromiseStatus

PROMISE_BROKEN = "promise_broken"  # the alert kind, one per broken promise
MAX_ID = 200
BROKEN_SHOWN_DAYS = 30  # `dunning promises` lists the promises broken in the last this many days


@dataclass(frozen=True)
class Target:
    """What a promise names: one invoice, or a customer (all its invoices owed when the promise is made)."""

    scope: ExclusionScope
    target_id: str


def parse_amount(text: str | None, flag: str = "--amount") -> int | None:
    """`--amount MINOR`: a positive whole number of minor units (blank: none)."""
    if text is None or not str(text).strip():
        return None
    value = str(text).strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 16 or int(value) <= 0:  # not '²', '１２', '٣'
        raise UserInputError(f"{flag} {for_terminal(value)[:40]!r} is not a positive whole number of minor units")
    return int(value)


def parse_promise_id(text: str | None) -> str | None:
    """A promise id from a CRM: the rules for an id (no control character, at most MAX_ID characters)."""
    if text is None or not text.strip():
        return None
    value = clean_reason(text, "promise_id")
    if value is None or len(value) > MAX_ID or "," in value:
        raise UserInputError(f"promise_id {for_terminal(text)[:40]!r} is not a usable id (at most {MAX_ID} characters, "
                             "no comma)")  # fmt: skip
    return value


def covered_invoices(ledger: Ledger, target: Target) -> pl.DataFrame:
    """The invoices a promise of `target` covers as the last snapshot showed them; UserInputError when the target
    is unknown or owes nothing."""
    if target.scope is ExclusionScope.INVOICE:
        rows = ledger.latest_invoices(invoice_id=target.target_id)
    else:
        rows = ledger.latest_invoices(customer_id=target.target_id)
    what = f"{target.scope} {for_terminal(target.target_id)}"
    if rows.is_empty():
        raise UserInputError(f"{what} is unknown: no snapshot has shown it (a typo?); nothing recorded")
    owed = rows.filter((pl.col("status") == "open") & (pl.col("remaining_minor") > 0))
    if owed.is_empty():
        raise UserInputError(f"{what} owes nothing (paid, void or settled in the last snapshot); nothing recorded")
    return owed


def build_promise(
    ledger: Ledger, target: Target, until: dt.date, amount: int | None, note: str | None, *,
    as_of: dt.datetime, by: str, config: DunningConfig, source: str, promise_id: str | None = None,
) -> tuple[dict[str, Any], list[tuple[str, int | None, int]]]:  # fmt: skip
    """The promise row and the invoices it covers, checked (UserInputError naming what is wrong otherwise)."""
    today = business_date(as_of, config)
    if until < today:
        raise UserInputError(f"--until {until} is before the day of the clock ({today}, {config.timezone}); "
                             "nothing recorded")  # fmt: skip
    owed = covered_invoices(ledger, target)
    total = int(owed.get_column("remaining_minor").sum())
    currencies = sorted(set(owed.get_column("currency").to_list()))
    if amount is not None:
        if len(currencies) > 1:
            raise UserInputError(
                f"{target.scope} {for_terminal(target.target_id)} owes in {', '.join(currencies)}: an amount needs "
                "one currency (promise per invoice instead); nothing recorded"
            )
        if amount > total:
            raise UserInputError(f"--amount {amount} is above what {target.scope} {for_terminal(target.target_id)} "
                                 f"owes ({total} {currencies[0]}); nothing recorded")  # fmt: skip
    customer_id = str(owed.get_column("customer_id")[0])
    promise = {
        "promise_id": promise_id or f"pr_{uuid.uuid4().hex[:16]}",
        "customer_id": customer_id,
        "invoice_id": target.target_id if target.scope is ExclusionScope.INVOICE else None,
        "until": until,
        "amount_minor": amount,
        "currency": currencies[0] if len(currencies) == 1 else None,
        "created_at": as_of,
        "created_by": by,
        "note": note,
        "owed_minor": total,
        "source": source,
    }
    covered = [(str(i), None if c is None else int(c), int(r))
               for i, c, r in owed.select("invoice_id", "cycle", "remaining_minor").iter_rows()]  # fmt: skip
    return promise, covered


# --- in the plan step ------------------------------------------------------------------------------------------


def holds_until(coverage: pl.DataFrame, config: DunningConfig) -> pl.Expr:
    """The last business day an active promise holds: `until` plus the grace."""
    return pl.col("until") + pl.duration(days=config.promises.grace_days)


def promised_invoices(coverage: pl.DataFrame, as_of: dt.datetime, config: DunningConfig) -> list[str]:
    """The invoices whose keys an active promise holds at `as_of` (`coverage`: `Ledger.promise_coverage()`)."""
    if coverage.is_empty():
        return []
    day = business_date(as_of, config)
    holding = coverage.filter(
        (pl.col("status") == PromiseStatus.ACTIVE) & (holds_until(coverage, config) >= day)
        & (pl.col("created_at") <= as_of)
    )  # fmt: skip
    return sorted(set(holding.get_column("invoice_id").to_list()))


def judge(coverage: pl.DataFrame, cycled: pl.DataFrame, as_of: dt.datetime, config: DunningConfig) -> pl.DataFrame:
    """The active promises whose grace is over at `as_of`, each `kept` or `broken` on this snapshot (`promise_id`,
    `status`, with the promise's `customer_id`, `until`, `amount_minor`, `currency`, `owed_minor` and `owed_now`).
    Only promises of customers the snapshot shows are judged; a covered invoice it does not show is taken as
    owing what it owed when the promise was made."""
    schema = {"promise_id": pl.String, "status": pl.String}
    if coverage.is_empty():
        return pl.DataFrame(schema=schema)
    day = business_date(as_of, config)
    over = coverage.filter(
        (pl.col("status") == PromiseStatus.ACTIVE) & (holds_until(coverage, config) < day)
        & pl.col("customer_id").is_in(cycled.get_column("customer_id").unique().implode())
    )  # fmt: skip
    if over.is_empty():
        return pl.DataFrame(schema=schema)
    now = cycled.select(
        "invoice_id",
        pl.when(pl.col("status") == "open").then(pl.col("remaining_minor").clip(0)).otherwise(0).alias("now_minor"),
    )
    per_invoice = over.join(now, on="invoice_id", how="left").with_columns(
        pl.coalesce("now_minor", "remaining_minor").alias("now_minor")
    )
    verdicts = per_invoice.group_by("promise_id", maintain_order=True).agg(
        pl.col("customer_id", "until", "amount_minor", "currency", "owed_minor").first(),
        pl.col("now_minor").sum().alias("owed_now"),
    )
    kept = (pl.col("owed_now") == 0) | (
        pl.col("amount_minor").is_not_null() & ((pl.col("owed_minor") - pl.col("owed_now")) >= pl.col("amount_minor"))
    )
    return verdicts.with_columns(
        pl.when(kept).then(pl.lit(str(PromiseStatus.KEPT))).otherwise(pl.lit(str(PromiseStatus.BROKEN))).alias("status")
    )


def record_verdicts(
    ledger: Ledger, verdicts: pl.DataFrame, config: DunningConfig, *, as_of: dt.datetime, run_id: str | None
) -> int:
    """Resolve each judged promise (a live run), and raise one `promise_broken` alert per promise this run broke
    (another run that judged it first raised its own). Returns the alerts raised."""
    raised = 0
    for row in verdicts.iter_rows(named=True):
        if not ledger.resolve_promise(row["promise_id"], row["status"], as_of):
            continue
        if row["status"] != PromiseStatus.BROKEN:
            continue
        promised = f"{row['amount_minor']} {row['currency']} (minor units)" if row["amount_minor"] else "payment"
        message = (
            f"promise {for_terminal(row['promise_id'])} of customer {for_terminal(row['customer_id'])} is broken: "
            f"{promised} by {row['until']} (grace {config.promises.grace_days} days); still owed "
            f"{row['owed_now']} minor units. Dunning resumes at the stage reached now"
        )
        details = {k: row[k] for k in ("promise_id", "customer_id", "until", "amount_minor", "owed_now")}
        alert_id = raise_alert(ledger, config.alerts, Alert(PROMISE_BROKEN, message, as_of, run_id, details, "warning"))
        ledger.note_promise_alert(row["promise_id"], alert_id)
        raised += 1
    return raised


BROKEN_SCHEMA = pl.Schema(
    {"invoice_id": pl.String, "broken_promise_until": pl.Date, "broken_promise_amount_minor": pl.Int64}
)


def broken_for_templates(ledger: Ledger, verdicts: pl.DataFrame, coverage: pl.DataFrame) -> pl.DataFrame:
    """Per invoice, the latest promise broken in its current cycle that no reminder has followed yet (`until`,
    `amount_minor`): what its next reminder's template sees as `broken_promise`. `verdicts` are this run's (a dry
    run judges without recording)."""
    broken = ledger.broken_promises_unanswered()
    if verdicts.height:
        fresh = coverage.join(verdicts.filter(pl.col("status") == PromiseStatus.BROKEN).select("promise_id"),
                              on="promise_id", how="semi")  # fmt: skip
        broken = pl.concat([broken, fresh.select(broken.columns).cast(broken.schema)])
    if broken.is_empty():
        return pl.DataFrame(schema=BROKEN_SCHEMA)
    return (
        broken.sort("until", "promise_id")
        .group_by("invoice_id", maintain_order=True)
        .last()
        .select(
            "invoice_id",
            pl.col("until").alias("broken_promise_until"),
            pl.col("amount_minor").alias("broken_promise_amount_minor"),
        )  # fmt: skip
        .cast(BROKEN_SCHEMA)
    )


def last_day(until: dt.date, config: DunningConfig) -> dt.date:
    """The last business day a promise due `until` holds its keys."""
    return until + dt.timedelta(days=config.promises.grace_days)


def listed(row: dict[str, Any], config: DunningConfig) -> dict[str, Any]:
    """One promise as `dunning promises --json` gives it."""
    keys = ("promise_id", "customer_id", "invoice_id", "until", "amount_minor", "currency", "status", "created_at",
            "created_by", "note", "resolved_at")  # fmt: skip
    out = {k: row.get(k) for k in keys}
    out["invoices"] = (row.get("invoices") or "").split(",") if row.get("invoices") else []
    out["holds_through"] = last_day(row["until"], config)
    return out

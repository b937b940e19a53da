"""Going live after another system: the stages it already sent are on record before our first run.

A billing team replacing a cron script or another dunning tool has customers
who already got the day-3 and day-7 emails. The first live run would see
those invoices for the first time and send the highest stage reached: a
customer's next email would repeat what the old system said. `dunning adopt
--snapshot S --as-of T` records, for each open invoice that nothing is on
record for, every stage it has reached at T as `skipped` with reason
`adopted`; the first live run then sends only the stages reached later.

An invoice with any row on record (earlier cycles included) is left alone and
listed; running adopt twice changes nothing. Adopted rows count as reminders
already sent for a template's `first_contact` and `reminders_sent_before`: the
old system wrote to the customer.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import polars as pl

from dunning.config import DunningConfig
from dunning.keys import reminder_key_expr
from dunning.ledger.base import Ledger
from dunning.plan.policies import stages_frame
from dunning.plan.policy import assign_cycles
from dunning.run import cycle
from dunning.vocabulary import EmailKind

ADOPT_RUN = "adopt"


@dataclass(frozen=True)
class Adopted:
    invoices: int  # open invoices that got their reached stages recorded
    keys: int  # skipped keys recorded
    left_alone: list[str]  # open invoices with rows already on record
    not_yet_due: int  # open invoices that have reached no stage: the first live run sends their first one


def adopt(ledger: Ledger, snapshot: str, config: DunningConfig, as_of: dt.datetime) -> Adopted:
    """Record the stages each open invoice with nothing on record has reached at `as_of` (module docstring)."""
    loaded = cycle.load_snapshot(snapshot, config)
    cycled = assign_cycles(
        loaded.valid, ledger.invoice_state(), as_of, config, cycle.snapshot_taken_at(loaded.valid, as_of)
    )
    open_invoices = cycled.filter(pl.col("in_cycle") & pl.col("owed"))
    on_record = ledger.invoices_on_record(open_invoices.get_column("invoice_id"))
    fresh = open_invoices.filter(~pl.col("invoice_id").is_in(sorted(on_record)))
    stages = stages_frame(config).select("policy", "stage", "stage_days")
    reached = (
        fresh.join(stages, on="policy", how="inner")
        .filter(pl.col("days_overdue") >= pl.col("stage_days"))
        .with_columns(
            reminder_key_expr().alias("idempotency_key"),
            pl.lit(str(EmailKind.REMINDER)).alias("kind"),
            pl.col("remaining_minor").alias("amount_minor"),
            pl.lit(None, dtype=pl.String).alias("email_id"),
            pl.lit(None, dtype=pl.String).alias("message_id"),
            pl.lit(f"{ADOPT_RUN}:{as_of.isoformat()}").alias("run_id"),
            pl.lit(as_of).alias("claimed_at"),
        )
    )
    adopted = reached.select("invoice_id").unique()
    opened = fresh.join(adopted, on="invoice_id", how="semi").select("invoice_id", "cycle")
    keys = ledger.record_adopted(reached, opened, as_of) if reached.height else 0
    return Adopted(
        invoices=adopted.height,
        keys=keys,
        left_alone=sorted(on_record),
        not_yet_due=fresh.height - adopted.height,
    )

"""What is newly due: the snapshot diffed against the ledger's per-invoice state.

Pure polars, no I/O, no per-invoice Python: the caller brings the accepted
snapshot and one state row per invoice the ledger knows (`invoice_id, cycle,
cycle_open, last_stage_days`); these functions return which cycle each invoice
is in and which reminder keys are due or skipped. The ledger state holds the
highest stage already on record in the invoice's current cycle (claimed, sent,
failed, unknown or skipped), so the diff costs one join with one row per
invoice, however long the history.
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from dunning.config import DunningConfig
from dunning.keys import reminder_key_expr

EMAIL_PATTERN = r"^[^@\s,;<>]+@[^@\s,;<>]+\.[^@\s,;<>]+$"
STATE_SCHEMA = {"invoice_id": pl.String, "cycle": pl.Int32, "cycle_open": pl.Boolean, "last_stage_days": pl.Int32}


def business_date(as_of: dt.datetime, config: DunningConfig) -> dt.date:
    """The calendar day `as_of` falls on in the business timezone."""
    return as_of.astimezone(config.zone).date()


def stages_frame(config: DunningConfig) -> pl.DataFrame:
    last = len(config.stages) - 1
    return pl.DataFrame(
        {
            "stage": [s.name for s in config.stages],
            "stage_rank": list(range(1, len(config.stages) + 1)),
            "stage_days": [s.days_overdue for s in config.stages],
            "min_remaining_ratio": [s.min_remaining_ratio for s in config.stages],
            "tone": ["final" if i == last and last > 0 else "gentle" if i == 0 else "firm" for i in range(last + 1)],
        },
        schema_overrides={"stage_rank": pl.Int32, "stage_days": pl.Int32},
    )


def with_balances(snapshot: pl.DataFrame) -> pl.DataFrame:
    """`remaining_minor`, `owed` (open with something left to pay) and `sendable` (a usable address)."""
    remaining = pl.col("amount_due") - pl.col("amount_paid")
    return snapshot.with_columns(
        remaining.alias("remaining_minor"),
        ((pl.col("status") == "open") & (remaining > 0)).alias("owed"),
        pl.col("customer_email").str.contains(EMAIL_PATTERN).fill_null(False).alias("sendable"),
    )


def assign_cycles(snapshot: pl.DataFrame, state: pl.DataFrame, as_of: dt.datetime, config: DunningConfig) -> pl.DataFrame:
    """The snapshot with `remaining_minor`, `days_overdue`, `owed`, `sendable`, and the dunning `cycle`.

    A cycle opens when an invoice is first seen open, unpaid and past due; it
    closes when the invoice is seen paid, void, or with nothing remaining. An
    invoice seen past due again after its cycle closed starts the next cycle.
    `cycle_action` says what the ledger must record: open, close, or nothing.
    """
    today = business_date(as_of, config)
    first_stage_days = min(s.days_overdue for s in config.stages)
    frame = with_balances(snapshot).with_columns(
        (pl.lit(today) - pl.col("due_date")).dt.total_days().cast(pl.Int32).alias("days_overdue"),
    ).join(state.cast(STATE_SCHEMA), on="invoice_id", how="left")
    past_due = pl.col("owed") & (pl.col("days_overdue") >= min(1, first_stage_days))
    settled = pl.col("status").is_in(["paid", "void"]) | ((pl.col("status") == "open") & (pl.col("remaining_minor") <= 0))
    was_open = pl.col("cycle_open").fill_null(False)
    opens = past_due & ~was_open
    return frame.with_columns(
        pl.when(opens).then(pl.col("cycle").fill_null(0) + 1).otherwise(pl.col("cycle")).cast(pl.Int32).alias("cycle"),
        pl.when(opens).then(pl.lit("open")).when(settled & was_open).then(pl.lit("close")).otherwise(None).alias("cycle_action"),
        pl.when(opens).then(None).otherwise(pl.col("last_stage_days")).cast(pl.Int32).alias("last_stage_days"),
        (past_due | (was_open & ~settled)).alias("in_cycle"),
    ).drop("cycle_open")


def plan_reminders(cycled: pl.DataFrame, config: DunningConfig) -> pl.DataFrame:
    """One row per reminder key this cycle must record: `role` is `due` (send) or `skipped`.

    For each invoice in an open cycle, the target is the highest stage it has
    reached (`days_overdue >= stage_days`) whose balance rule it meets
    (`remaining / amount_due >= min_remaining_ratio`). It is due when it is
    above everything on record in the cycle; stages between what is on record
    and the target are recorded as skipped, never sent later.
    """
    in_cycle = cycled.filter(pl.col("in_cycle") & pl.col("owed"))
    # the stage arithmetic runs on five narrow columns; the invoice's other columns join back only onto the
    # keys that result (at 10M invoices a cross join of every column with the stages took over 4 GB)
    keys = (
        in_cycle.select("invoice_id", "days_overdue", "last_stage_days", "remaining_minor", "amount_due")
        .join(stages_frame(config), how="cross")
        .filter(
            (pl.col("stage_days") <= pl.col("days_overdue"))
            & (pl.col("stage_days") > pl.col("last_stage_days").fill_null(-1))
        )
        .with_columns(
            (pl.col("remaining_minor") >= pl.col("min_remaining_ratio") * pl.col("amount_due")).alias("eligible")
        )
        .with_columns(pl.col("stage_days").filter(pl.col("eligible")).max().over("invoice_id").alias("target_days"))
        .filter(pl.col("target_days").is_not_null() & (pl.col("stage_days") <= pl.col("target_days")))
        .select(
            "invoice_id", "stage", "stage_rank", "stage_days", "tone",
            pl.when(pl.col("stage_days") == pl.col("target_days")).then(pl.lit("due")).otherwise(pl.lit("skipped")).alias("role"),
        )
    )
    return (
        keys.join(in_cycle, on="invoice_id", how="inner")
        .with_columns(
            reminder_key_expr().alias("idempotency_key"),
            pl.lit("reminder").alias("kind"),
            pl.col("remaining_minor").alias("amount_minor"),
        )
        .select(*in_cycle.columns, "stage", "stage_rank", "stage_days", "tone", "role", "idempotency_key", "kind", "amount_minor")
        .sort("customer_id", "invoice_id", "stage_rank")
    )


def plan_retries(cycled: pl.DataFrame, failed: pl.DataFrame, due: pl.DataFrame, config: DunningConfig) -> pl.DataFrame:
    """`failed` reminder keys to send again: still the invoice's current stage, in its current cycle, still owed.

    `failed` holds the ledger's retryable rows (`idempotency_key, invoice_id,
    cycle, stage, email_id, message_id`). A retry keeps its key and its
    Message-ID; an invoice that has a newer stage due this cycle gets that one
    instead.
    """
    current = cycled.filter(pl.col("in_cycle") & pl.col("owed")).join(
        due.select("invoice_id"), on="invoice_id", how="anti")
    return (
        failed.select("idempotency_key", "invoice_id", "cycle", "stage", "email_id", "message_id")
        .join(stages_frame(config).drop("min_remaining_ratio"), on="stage", how="inner")
        .join(current, on=["invoice_id", "cycle"], how="inner")
        .filter(pl.col("stage_days") == pl.col("last_stage_days"))
        .with_columns(
            pl.lit("retry").alias("role"), pl.lit("reminder").alias("kind"),
            pl.col("remaining_minor").alias("amount_minor"), pl.col("email_id").alias("email_group"),
        )
    )


def email_groups(due: pl.DataFrame, config: DunningConfig) -> pl.Expr:
    """The expression naming the email each due reminder belongs to."""
    if config.group_by == "invoice":
        return pl.col("idempotency_key")
    return pl.concat_str([pl.col("customer_id"), pl.col("customer_email").str.to_lowercase()], separator="|")

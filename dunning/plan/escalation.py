"""Which invoices are handed to a collections system this cycle, and whose reminders stop because one was.

An escalation is a send like any other (guarantee 16): key `escalation:{invoice_id}:{cycle}`, claimed in the
ledger before the webhook is called, once per invoice and cycle, with the three outcomes
(`dunning.send.escalation`). It becomes due when an invoice in an open cycle is still owed `after_days` past its
due date under a policy with an `escalation`; exclusions and the minimum balance hold it like a reminder, the pause
stops it, and the breaker does not count it: it is not an email. With `stop_reminders`, from its claim no reminder
of that invoice is claimed again in the cycle (audit reason `escalated`).

An escalation refused for good (`dunning.send.escalation_refusals`) is not in the collections system's hands, and
not back in ours either until a human says so: its invoice's reminders wait with reason `escalation_refused`. A
human who gives it back to the reminders (`dunning resolve --not-sent`) records the key `skipped`: the reminders
go on, and the invoice is not escalated again in the cycle.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from dunning.config import DunningConfig
from dunning.vocabulary import PLAN_ROLE_DTYPE, EmailKind, HoldReason, LedgerStatus, PlanRole

KEY_PREFIX = "escalation"


def escalation_key_expr() -> pl.Expr:
    return pl.format("escalation:{}:{}", pl.col("invoice_id"), pl.col("cycle"))


def candidates(cycled: pl.DataFrame, config: DunningConfig, broken: pl.DataFrame | None = None) -> pl.DataFrame:
    """Invoices whose policy escalates, still owed in an open cycle and at least `after_days` past due, or with
    `after_broken_promises` broken promises in this cycle (`broken`: `invoice_id`, `cycle`, `broken`, from
    `Ledger.broken_promise_counts`): their escalation is due unless on record. Columns of `cycled`, plus
    `idempotency_key` and `stop_reminders`."""
    rules = {p.name: p.escalation for p in config.resolved_policies() if p.escalation is not None}
    if not rules:
        return cycled.clear().with_columns(
            pl.lit(None, dtype=pl.String).alias("idempotency_key"),
            pl.lit(None, dtype=pl.Boolean).alias("stop_reminders"),
        )
    after = {name: rule.after_days for name, rule in rules.items()}
    stops = {name: rule.stop_reminders for name, rule in rules.items()}
    threshold = pl.col("policy").replace_strict(after, default=None, return_dtype=pl.Int32)
    reached = (pl.col("days_overdue") >= threshold).fill_null(False)
    promises = {name: rule.after_broken_promises for name, rule in rules.items() if rule.after_broken_promises}
    if promises and broken is not None and broken.height:
        counts = broken.select("invoice_id", pl.col("cycle").cast(pl.Int32), pl.col("broken").alias("_broken"))
        cycled = cycled.join(counts, on=["invoice_id", "cycle"], how="left", maintain_order="left")
        limit = pl.col("policy").replace_strict(promises, default=None, return_dtype=pl.Int32)
        reached = reached | (pl.col("_broken") >= limit).fill_null(False)
    else:
        cycled = cycled.with_columns(pl.lit(None, dtype=pl.UInt32).alias("_broken"))
    return (
        cycled.filter(pl.col("in_cycle") & pl.col("owed") & reached)
        .drop("_broken")
        .with_columns(
            escalation_key_expr().alias("idempotency_key"),
            pl.col("policy").replace_strict(stops, default=True, return_dtype=pl.Boolean).alias("stop_reminders"),
        )
    )


def plan_escalations(
    due: pl.DataFrame, states: Callable[[list[str]], pl.DataFrame]
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """From `candidates`: the escalations to send (plan rows, role `due`, kind `escalation`), and the invoices
    (`invoice_id`, `cycle`, `reason`) whose reminders stop: escalated before (the key on record) or now, with
    `stop_reminders` (reason `escalated`), or refused for good (`escalation_refused`); a key a human gave back to the
    reminders (`skipped`) stops nothing. `states` gives the ledger's `idempotency_key`, `status` and `refused` of
    the keys on record (`Ledger.escalation_states`)."""
    on_record = states(due.get_column("idempotency_key").to_list()) if due.height else None
    if on_record is None or on_record.is_empty():
        on_record = pl.DataFrame(schema={"idempotency_key": pl.String, "status": pl.String, "refused": pl.Boolean})
    rows = due.join(on_record.select("idempotency_key"), on="idempotency_key", how="anti").with_columns(
        pl.lit(PlanRole.DUE, dtype=PLAN_ROLE_DTYPE).alias("role"),
        pl.lit(str(EmailKind.ESCALATION)).alias("kind"),
        pl.col("remaining_minor").alias("amount_minor"),
        pl.lit(True).alias("sendable"),  # to a webhook: the customer's address plays no part
        pl.lit(None, dtype=pl.String).alias("stage"),
        pl.col("idempotency_key").alias("email_group"),
        pl.col("idempotency_key").alias("email_id"),
        pl.format("<{}>", pl.col("idempotency_key")).alias("message_id"),
    )
    reason = (
        pl.when(pl.col("refused").fill_null(False))
        .then(pl.lit(str(HoldReason.ESCALATION_REFUSED)))
        .otherwise(pl.lit(str(HoldReason.ESCALATED)))
    )
    recorded = on_record.select("idempotency_key", pl.col("status").alias("key_status"), "refused")
    stopped = (
        due.filter(pl.col("stop_reminders"))
        .select("idempotency_key", "invoice_id", "cycle")  # `cycled` has a `status` of its own: the invoice's
        .join(recorded, on="idempotency_key", how="left")
        .filter(pl.col("key_status").is_null() | (pl.col("key_status") != LedgerStatus.SKIPPED))
        .select("invoice_id", "cycle", reason.alias("reason"))
        .unique(["invoice_id", "cycle"])
    )
    return rows, stopped


def plan_escalation_retries(failed: pl.DataFrame, cycled: pl.DataFrame) -> pl.DataFrame:
    """`failed` escalation keys whose backoff is over (`Ledger.retryable_failures`), for invoices still owed in the
    same open cycle: role `retry`, the same key."""
    current = cycled.filter(pl.col("in_cycle") & pl.col("owed"))
    return (
        failed.select("idempotency_key", "invoice_id", "cycle")
        .join(current, on=["invoice_id", "cycle"], how="inner")
        .with_columns(
            pl.lit(PlanRole.RETRY, dtype=PLAN_ROLE_DTYPE).alias("role"),
            pl.lit(str(EmailKind.ESCALATION)).alias("kind"),
            pl.col("remaining_minor").alias("amount_minor"),
            pl.lit(True).alias("sendable"),
            pl.lit(None, dtype=pl.String).alias("stage"),
            pl.col("idempotency_key").alias("email_group"),
            pl.col("idempotency_key").alias("email_id"),
            pl.format("<{}>", pl.col("idempotency_key")).alias("message_id"),
        )
    )

"""Which invoices are handed to a collections system this cycle, and whose reminders stop because one was.

An escalation is a send like any other (guarantee 16): key `escalation:{invoice_id}:{cycle}`, claimed in the
ledger before the webhook is called, once per invoice and cycle, with the three outcomes
(`dunning.send.escalation`). It becomes due when an invoice in an open cycle is still owed `after_days` past its
due date under a policy with an `escalation`; exclusions and the minimum balance hold it like a reminder, the pause
stops it, and the breaker does not count it: it is not an email. With `stop_reminders`, from its claim no reminder
of that invoice is claimed again in the cycle (audit reason `escalated`).
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from dunning.config import DunningConfig
from dunning.vocabulary import PLAN_ROLE_DTYPE, EmailKind, PlanRole

KEY_PREFIX = "escalation"


def escalation_key_expr() -> pl.Expr:
    return pl.format("escalation:{}:{}", pl.col("invoice_id"), pl.col("cycle"))


def candidates(cycled: pl.DataFrame, config: DunningConfig) -> pl.DataFrame:
    """Invoices whose policy escalates, still owed in an open cycle and at least `after_days` past due: their
    escalation is due unless on record. Columns of `cycled`, plus `idempotency_key` and `stop_reminders`."""
    rules = {p.name: p.escalation for p in config.resolved_policies() if p.escalation is not None}
    if not rules:
        return cycled.clear().with_columns(
            pl.lit(None, dtype=pl.String).alias("idempotency_key"),
            pl.lit(None, dtype=pl.Boolean).alias("stop_reminders"),
        )
    after = {name: rule.after_days for name, rule in rules.items()}
    stops = {name: rule.stop_reminders for name, rule in rules.items()}
    threshold = pl.col("policy").replace_strict(after, default=None, return_dtype=pl.Int32)
    return cycled.filter(
        pl.col("in_cycle") & pl.col("owed") & (pl.col("days_overdue") >= threshold).fill_null(False)
    ).with_columns(
        escalation_key_expr().alias("idempotency_key"),
        pl.col("policy").replace_strict(stops, default=True, return_dtype=pl.Boolean).alias("stop_reminders"),
    )


def plan_escalations(due: pl.DataFrame, recorded: Callable[[list[str]], set[str]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """From `candidates`: the escalations to send (plan rows, role `due`, kind `escalation`), and the invoices
    (`invoice_id`, `cycle`) whose reminders stop: escalated before (the key on record) or now, with
    `stop_reminders`. `recorded` says which keys the ledger holds."""
    on_record = recorded(due.get_column("idempotency_key").to_list()) if due.height else set()
    is_recorded = pl.col("idempotency_key").is_in(sorted(on_record))
    rows = due.filter(~is_recorded).with_columns(
        pl.lit(PlanRole.DUE, dtype=PLAN_ROLE_DTYPE).alias("role"),
        pl.lit(str(EmailKind.ESCALATION)).alias("kind"),
        pl.col("remaining_minor").alias("amount_minor"),
        pl.lit(True).alias("sendable"),  # to a webhook: the customer's address plays no part
        pl.lit(None, dtype=pl.String).alias("stage"),
        pl.col("idempotency_key").alias("email_group"),
        pl.col("idempotency_key").alias("email_id"),
        pl.format("<{}>", pl.col("idempotency_key")).alias("message_id"),
    )
    stopped = due.filter(pl.col("stop_reminders")).select("invoice_id", "cycle").unique()
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

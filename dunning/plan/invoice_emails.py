"""The invoice email itself: once per invoice and billing period, when the invoice is first seen open.

The classic double send is the monthly invoice email, sent twice minutes apart
because a retry wrapper took a slow acknowledgement for a failure. Here it is
one more kind of key, `invoice:{invoice_id}:{billing_period}` (`none` when the
snapshot has no period), claimed in the ledger like any other before the
provider is called, so the same invoice and period never get a second one: not
when the invoice is reopened, not from another run, shard or day.

Which open invoices get one (pure polars, no I/O; the caller brings what the
ledger knows):

- an invoice whose key is already on record (claimed, sent, failed, unknown or
  skipped) gets nothing new; a `failed` one is retried after the backoff like a
  reminder while the invoice is still not overdue;
- an invoice first seen already overdue gets only its reminder: its invoice key
  is recorded `skipped`;
- turning the feature on never emails what was already open: the first live run
  with the feature on records the day (`feature_state`), and every invoice seen
  by a live run on or before that day (the daily history holds every invoice of
  every live run, feature on or off) has its key recorded `skipped`. Invoices
  that first appear on a later day get their email. Turning it off forgets the
  day, so turning it on again starts from a new one.

Grouping follows `group_by` like reminders, in emails of their own: a customer
issued three invoices in a day gets one invoice email listing them, beside any
reminder, and it counts toward the breaker like any email.
"""

from __future__ import annotations

import re
from typing import Any

import polars as pl

from dunning.config import DunningConfig
from dunning.keys import invoice_key_expr
from dunning.plan.policy import sendable_expr
from dunning.safe_text import parse_json
from dunning.vocabulary import PLAN_ROLE_DTYPE, EmailKind, PlanRole

FEATURE = "invoice_emails"
MAX_LINES = 100
MAX_DESCRIPTION = 200
MAX_LINES_TEXT = 100_000
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def candidates(cycled: pl.DataFrame) -> pl.DataFrame:
    """Open invoices with something to pay, each with its invoice key."""
    return cycled.filter(pl.col("owed")).with_columns(invoice_key_expr().alias("idempotency_key"))


def plan_invoice_emails(
    open_invoices: pl.DataFrame,
    recorded_keys: pl.DataFrame,
    baseline_ids: pl.DataFrame | None,
    config: DunningConfig,
) -> pl.DataFrame:
    """One row per invoice key to record now: `due` (send) or `skipped` (never send).

    `open_invoices` is `candidates(...)`; `recorded_keys` (`idempotency_key`) the keys already on record;
    `baseline_ids` (`invoice_id`) the invoices seen on or before the day the feature was turned on, or None when
    it is being turned on now (then every invoice not on record is baseline).
    """
    fresh = open_invoices.join(recorded_keys, on="idempotency_key", how="anti")
    in_baseline = (
        pl.lit(True)
        if baseline_ids is None
        else pl.col("invoice_id").is_in(baseline_ids.get_column("invoice_id").implode())
    )
    skipped = in_baseline | (pl.col("days_overdue") > 0)
    group = (
        pl.col("idempotency_key")
        if config.group_by == "invoice"
        else pl.concat_str([pl.lit("invoice"), pl.col("customer_id"), pl.col("customer_email").str.to_lowercase()],
                           separator="|")
    )  # fmt: skip
    return fresh.with_columns(
        pl.when(skipped).then(pl.lit(PlanRole.SKIPPED)).otherwise(pl.lit(PlanRole.DUE)).cast(PLAN_ROLE_DTYPE)
        .alias("role"),
        pl.lit(EmailKind.INVOICE).alias("kind"),
        pl.lit(None, dtype=pl.Int32).alias("cycle"),
        pl.col("remaining_minor").alias("amount_minor"),
        sendable_expr().alias("sendable"),
        group.alias("email_group"),
        pl.lit(None, dtype=pl.String).alias("email_id"),
        pl.lit(None, dtype=pl.String).alias("message_id"),
    )  # fmt: skip


def plan_invoice_retries(open_invoices: pl.DataFrame, failed: pl.DataFrame) -> pl.DataFrame:
    """`failed` invoice keys (`idempotency_key, email_id, message_id`) to send again: the invoice is still open,
    owed and not overdue (once overdue, its reminder speaks for it). A retry keeps its key and Message-ID."""
    return (
        open_invoices.filter(pl.col("days_overdue") <= 0)
        .join(failed.select("idempotency_key", "email_id", "message_id"), on="idempotency_key", how="inner")
        .with_columns(
            pl.lit(PlanRole.RETRY, dtype=PLAN_ROLE_DTYPE).alias("role"),
            pl.lit(EmailKind.INVOICE).alias("kind"),
            pl.lit(None, dtype=pl.Int32).alias("cycle"),
            pl.col("remaining_minor").alias("amount_minor"),
            sendable_expr().alias("sendable"),
            pl.col("email_id").alias("email_group"),
        )
    )


def invoice_lines(value: object) -> list[dict[str, Any]] | None:
    """The optional snapshot column `invoice_lines` (JSON: a list of `{description, amount, quantity}`; Stripe:
    the invoice's `lines.data`) as lines a template can show, or None when absent or unusable.

    It is data, so it is checked, not trusted: at most 100 lines, amounts integers (minor units), quantities
    integers or absent, descriptions text of at most 200 characters with control characters and line breaks
    turned into spaces (the HTML part escapes the rest). Anything else drops all lines, never the email.
    """
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_LINES_TEXT:
        return None
    try:
        lines = parse_json(value)
    except (ValueError, RecursionError):
        return None
    if not isinstance(lines, list) or not 0 < len(lines) <= MAX_LINES:
        return None
    parsed = []
    for line in lines:
        if not isinstance(line, dict):
            return None
        amount, quantity, description = line.get("amount"), line.get("quantity"), line.get("description")
        if type(amount) is not int or (quantity is not None and type(quantity) is not int):
            return None
        if description is not None and not isinstance(description, str):
            return None
        text = _CONTROLS.sub(" ", description or "").strip()[:MAX_DESCRIPTION]
        parsed.append({"description": text, "amount_minor": amount, "quantity": quantity})
    return parsed

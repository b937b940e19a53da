"""Idempotency keys from business identity, never from a request id.

The same invoice, cycle and stage always give the same key, in any process, on
any day; the ledger's primary key on it is what stops a second send. Message-IDs
derive from the keys an email covers, so a receiving system can dedupe too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import polars as pl


def reminder_key(invoice_id: str, cycle: int, stage: str) -> str:
    return f"dunning:{invoice_id}:{cycle}:{stage}"


def apology_key(incident_id: str, customer_id: str) -> str:
    return f"apology:{incident_id}:{customer_id}"


def event_key(event_id: str) -> str:
    return f"event:{event_id}"


def invoice_key(invoice_id: str, billing_period: str | None) -> str:
    """The invoice email's key: one per invoice and billing period, forever (`none` when the period is unknown)."""
    return f"invoice:{invoice_id}:{billing_period or 'none'}"


def invoice_key_expr() -> pl.Expr:
    """`invoice_key` over columns `invoice_id`, `billing_period`."""
    return pl.concat_str(
        [pl.lit("invoice:"), pl.col("invoice_id"), pl.lit(":"), pl.col("billing_period").fill_null("none")]
    )


def reminder_key_expr() -> pl.Expr:
    """`reminder_key` over columns `invoice_id`, `cycle`, `stage`."""
    return pl.concat_str(
        [
            pl.lit("dunning:"),
            pl.col("invoice_id"),
            pl.lit(":"),
            pl.col("cycle").cast(pl.String),
            pl.lit(":"),
            pl.col("stage"),
        ]
    )


def email_id(keys: Iterable[str]) -> str:
    """A stable id for the email that covers exactly `keys` (order does not matter)."""
    return email_id_of_joined(",".join(sorted(keys)))


def email_id_of_joined(joined_keys: str) -> str:
    """`email_id` of keys already sorted and comma-joined."""
    return hashlib.sha256(joined_keys.encode()).hexdigest()[:32]


def message_id(keys: Iterable[str], domain: str) -> str:
    return f"<{email_id(keys)}@{domain}>"

"""Idempotency keys from business identity, never from a request id; and the key a provider dedupes an email on.

The same invoice, cycle and stage always give the same key, in any process, on
any day; the ledger's primary key on it is what stops a second send. Message-IDs
derive from the keys an email covers, so a receiving system can dedupe too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from email.message import Message

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


def idempotency_key_for(keys: Sequence[str], email_id: str) -> str:
    """The key a provider dedupes an email on: its one ledger key when that is a short printable-ASCII header
    value, else its email id (a hash of every key it covers, the left part of its Message-ID)."""
    if len(keys) == 1 and len(keys[0]) <= 256 and keys[0].isascii() and keys[0].isprintable():
        return keys[0]
    return email_id


def idempotency_key_of(message: Message) -> str:
    """`idempotency_key_for` the keys and Message-ID that `message` carries in its headers."""
    return idempotency_key_in(str(message["X-Dunning-Keys"] or ""), str(message["Message-ID"]))


def idempotency_key_in(keys_header: str, message_id: str) -> str:
    """`idempotency_key_for` the keys of an `X-Dunning-Keys` header's value and a Message-ID, as read back."""
    keys = [k.strip() for k in keys_header.split(",") if k.strip()]
    return idempotency_key_for(keys, message_id.strip().strip("<>").partition("@")[0])

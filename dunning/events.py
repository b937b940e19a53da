"""Stripe webhook events in, payment-failed notices out, deduplicated on the event id.

Stripe retries a webhook until it is acknowledged, so the same event can
arrive many times, in one file or across runs. Each `invoice.payment_failed`
event id becomes at most one notice, keyed `event:{event_id}`; the ledger's
primary key makes that hold across runs, and the plan drops ids already on
record so a redelivery is not even attempted. Other event types are counted
and ignored.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import polars as pl

from dunning.keys import email_id, event_key, message_id
from dunning.policy import sendable_expr
from dunning.stripe import read_events

PAYMENT_FAILED = "invoice.payment_failed"
EVENTS_SCHEMA = {
    "event_id": pl.String, "type": pl.String, "created_at": pl.Datetime("us", "UTC"), "invoice_id": pl.String,
    "customer_id": pl.String, "customer_email": pl.String, "currency": pl.String, "amount_remaining": pl.Int64,
    "payload": pl.String,
}


def _invoice(event: dict) -> dict:
    obj = (event.get("data") or {}).get("object") or {}
    return obj if obj.get("object", "invoice") == "invoice" else {}


def _customer(value) -> str | None:
    return value.get("id") if isinstance(value, dict) else value


def events_frame(path: str | Path) -> pl.DataFrame:
    """One row per distinct event id in the file (a redelivery inside the file counts once)."""
    rows = []
    for event in read_events(Path(path)):
        invoice = _invoice(event) if event["type"].startswith("invoice.") else {}
        due, paid = invoice.get("amount_due"), invoice.get("amount_paid")
        remaining = invoice.get("amount_remaining", (due - paid) if isinstance(due, int) and isinstance(paid, int) else None)
        currency = invoice.get("currency")
        rows.append({
            "event_id": event["id"], "type": event["type"],
            "created_at": dt.datetime.fromtimestamp(int(event.get("created") or 0), dt.timezone.utc),
            "invoice_id": invoice.get("id"), "customer_id": _customer(invoice.get("customer")),
            "customer_email": invoice.get("customer_email"), "currency": currency.upper() if isinstance(currency, str) else None,
            "amount_remaining": remaining, "payload": json.dumps(event, sort_keys=True),
        })
    return pl.DataFrame(rows, schema=EVENTS_SCHEMA).unique("event_id", keep="first", maintain_order=True)


def notice_rows(events: pl.DataFrame, snapshot: pl.DataFrame, already_recorded: set[str], domain: str) -> pl.DataFrame:
    """The payment-failed notices to send: new event ids only, addressed from the event or the snapshot."""
    events = events.filter(pl.col("type") == PAYMENT_FAILED)
    if events.is_empty():  # the usual hourly run: no need to index the whole snapshot by customer
        return pl.DataFrame()
    directory = snapshot.filter(pl.col("customer_email").is_not_null()).group_by("customer_id").agg(
        pl.col("customer_email").first().alias("snapshot_email"), pl.col("customer_name").drop_nulls().first())
    notices = (
        events.filter(pl.col("type") == PAYMENT_FAILED)
        .with_columns(pl.concat_str([pl.lit("event:"), pl.col("event_id")]).alias("idempotency_key"))
        .filter(~pl.col("idempotency_key").is_in(sorted(already_recorded)))
        .join(directory, on="customer_id", how="left")
        .with_columns(pl.coalesce("customer_email", "snapshot_email").alias("customer_email"))
    )
    keys = notices.get_column("idempotency_key").to_list()
    ids = [email_id([k]) for k in keys]
    return notices.with_columns(
        pl.lit("payment_failed").alias("kind"), pl.lit("due").alias("role"),
        pl.col("amount_remaining").alias("amount_minor"), pl.col("amount_remaining").alias("remaining_minor"),
        (pl.col("amount_remaining").fill_null(0) > 0).alias("owed"),
        sendable_expr().alias("sendable"),
        pl.col("idempotency_key").alias("email_group"),
        pl.Series("email_id", ids, dtype=pl.String),
        pl.Series("message_id", [message_id([k], domain) for k in keys], dtype=pl.String),
    ).drop("snapshot_email", "amount_remaining", "payload", "type", "created_at")


def event_keys(events: pl.DataFrame) -> list[str]:
    return [event_key(e) for e in events.filter(pl.col("type") == PAYMENT_FAILED).get_column("event_id")]

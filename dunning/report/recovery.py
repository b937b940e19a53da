"""Recovering from a flood: find who was flooded, send each exactly one apology with what they owe now.

Sends come from the ledger and, for floods that happened before the ledger
existed, from a provider's send log (CSV: `to`, `sent_at`; optional
`customer_id`, `invoice_id`, `subject`, `message_id`). A customer is flooded
when some rolling window held more emails than the breaker allows. Each gets
one apology keyed `apology:{incident}:{customer}`, so running recovery again
for the same incident sends nothing more.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from email.message import Message
from pathlib import Path

import polars as pl

from dunning.config import DunningConfig
from dunning.email.render import apology_email
from dunning.errors import SnapshotError
from dunning.keys import apology_key
from dunning.ledger.base import Ledger
from dunning.plan.policy import sendable_expr
from dunning.send.providers.base import EmailProvider
from dunning.send.sending import Record, SendReport, send_due, sender_of
from dunning.vocabulary import EmailKind

SENDS_SCHEMA = pl.Schema(
    {"customer_id": pl.String(), "address": pl.String(), "sent_at": pl.Datetime("us", "UTC"), "message_id": pl.String()}
)


@dataclass
class RecoveryReport:
    flooded: pl.DataFrame
    unmapped_addresses: list[str]
    unreachable: list[str]
    send: SendReport


def ledger_sends(ledger: Ledger, since: dt.datetime, until: dt.datetime) -> pl.DataFrame:
    """One row per email the ledger says may have reached a customer (apologies excluded)."""
    return ledger.frame(
        """
        SELECT customer_id, min(customer_email) AS address, min(coalesce(sent_at, claimed_at)) AS sent_at,
               min(message_id) AS message_id
        FROM reminder_ledger
        WHERE kind <> 'apology' AND status IN ('sent', 'unknown', 'claimed')
          AND coalesce(sent_at, claimed_at) > ? AND coalesce(sent_at, claimed_at) <= ?
        GROUP BY customer_id, email_id
        """,
        [since, until],
    ).cast(SENDS_SCHEMA)


def read_sent_log(path: str | Path, snapshot: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """The provider's send log as sends, each mapped to a customer by `customer_id` or by address."""
    path = Path(path)
    if not path.is_file():
        raise SnapshotError(f"sent log not found: {path}")
    try:
        log = pl.read_csv(path, infer_schema=False)
    except pl.exceptions.PolarsError as exc:
        raise SnapshotError(f"cannot read sent log {path}: {str(exc).splitlines()[0]}") from None
    missing = [c for c in ("to", "sent_at") if c not in log.columns]
    if missing:
        raise SnapshotError(f"sent log {path} lacks required column(s): {', '.join(missing)}")
    log = log.with_columns(
        pl.col("to").str.strip_chars().str.to_lowercase().alias("address"),
        pl.col("sent_at").str.to_datetime(strict=False, time_zone="UTC").alias("sent_at"),
        (pl.col("customer_id") if "customer_id" in log.columns else pl.lit(None, dtype=pl.String)).alias(
            "given_customer"
        ),
        (pl.col("message_id") if "message_id" in log.columns else pl.lit(None, dtype=pl.String)).alias("message_id"),
    )
    unparsable = log.filter(pl.col("sent_at").is_null())
    if unparsable.height:
        raise SnapshotError(
            f"sent log {path}: {unparsable.height} row(s) with an unparsable sent_at, "
            f"e.g. {unparsable['sent_at'].head(1).to_list()}"
        )
    directory = (
        snapshot.filter(pl.col("customer_email").is_not_null())
        .select(pl.col("customer_email").str.to_lowercase().alias("address"), "customer_id")
        .unique("address", keep="first")
    )
    mapped = log.join(directory, on="address", how="left").with_columns(
        pl.coalesce("given_customer", "customer_id").alias("customer_id")
    )
    unmapped = sorted(set(mapped.filter(pl.col("customer_id").is_null()).get_column("address").to_list()))
    return mapped.filter(pl.col("customer_id").is_not_null()).select(SENDS_SCHEMA.keys()).cast(SENDS_SCHEMA), unmapped


def flooded_customers(sends: pl.DataFrame, config: DunningConfig) -> pl.DataFrame:
    """Customers whose emails in some rolling `window_hours` exceeded `max_emails`, with the flood's extent."""
    if sends.is_empty():
        return pl.DataFrame(
            schema={
                "customer_id": pl.String,
                "emails": pl.UInt32,
                "max_in_window": pl.UInt32,
                "first_at": SENDS_SCHEMA["sent_at"],
                "last_at": SENDS_SCHEMA["sent_at"],
            }
        )
    deduped = pl.concat(
        [
            sends.filter(pl.col("message_id").is_null()),
            sends.filter(pl.col("message_id").is_not_null()).unique(["customer_id", "message_id"]),
        ]
    )
    windows = (
        deduped.sort("customer_id", "sent_at")
        .rolling(index_column="sent_at", period=f"{config.breaker.window_hours}h", group_by="customer_id")
        .agg(pl.len().alias("in_window"))
    )
    over = (
        windows.group_by("customer_id")
        .agg(pl.col("in_window").max().alias("max_in_window"))
        .filter(pl.col("max_in_window") > config.breaker.max_emails)
    )
    extent = deduped.group_by("customer_id").agg(
        pl.len().alias("emails"),
        pl.col("sent_at").min().alias("first_at"),
        pl.col("sent_at").max().alias("last_at"),
        pl.col("address").drop_nulls().first(),
    )
    return extent.join(over, on="customer_id", how="inner").sort("customer_id")


def apology_rows(flooded: pl.DataFrame, snapshot: pl.DataFrame, incident_id: str) -> pl.DataFrame:
    """One ledger row per flooded customer we can reach, addressed to their current email."""
    current = (
        snapshot.filter(sendable_expr())
        .group_by("customer_id")
        .agg(
            pl.col("customer_email").first().alias("snapshot_email"),
            pl.col("customer_name").drop_nulls().first(),
            # the customer's language: of their invoice with the smallest id that has one (`locales.email_locale`)
            pl.col("customer_locale").sort_by("invoice_id").drop_nulls().first(),
        )
    )
    rows = flooded.join(current, on="customer_id", how="left").with_columns(
        pl.coalesce("snapshot_email", "address").alias("customer_email")
    )
    keys = [apology_key(incident_id, c) for c in rows.get_column("customer_id")]
    return rows.with_columns(
        pl.Series("idempotency_key", keys, dtype=pl.String),
        pl.lit(EmailKind.APOLOGY).alias("kind"),
        pl.lit(None, dtype=pl.String).alias("invoice_id"),
        pl.lit(None, dtype=pl.Int32).alias("cycle"),
        pl.lit(None, dtype=pl.String).alias("stage"),
        pl.lit(None, dtype=pl.Int32).alias("stage_days"),
        pl.lit(None, dtype=pl.Int64).alias("amount_minor"),
        pl.lit(None, dtype=pl.String).alias("currency"),
        pl.Series("email_group", keys, dtype=pl.String),
        # minted when claimed (`sending.with_email_ids`), under the deployment's secret
        pl.lit(None, dtype=pl.String).alias("email_id"),
        pl.lit(None, dtype=pl.String).alias("message_id"),
    )


def recover(
    ledger: Ledger,
    provider: EmailProvider,
    snapshot: pl.DataFrame,
    config: DunningConfig,
    *,
    incident_id: str,
    run_id: str,
    as_of: dt.datetime,
    since: dt.datetime,
    sent_log: str | Path | None,
    now: Callable[[], dt.datetime],
) -> RecoveryReport:
    sends = ledger_sends(ledger, since, as_of)
    unmapped: list[str] = []
    if sent_log:
        logged, unmapped = read_sent_log(sent_log, snapshot)
        sends = pl.concat([sends, logged.filter((pl.col("sent_at") > since) & (pl.col("sent_at") <= as_of))])
    flooded = flooded_customers(sends, config)
    rows = apology_rows(flooded, snapshot, incident_id)
    reachable = rows.filter(sendable_expr())  # the one address rule of every email; the rest is unreachable
    owed = snapshot.filter(pl.col("owed")).sort("due_date", "invoice_id")

    def render(records: list[Record]) -> Message:
        record = records[0]
        statement = owed.filter(pl.col("customer_id") == record["customer_id"]).to_dicts()
        return apology_email(
            record,
            statement,
            to=record["customer_email"],
            sender=sender_of(config),
            key=record["idempotency_key"],
            message_id=record["message_id"],
            as_of=as_of,
            locale=config.locale,
            templates_dir=config.templates_dir,
        )

    report, _ = send_due(
        ledger,
        provider,
        reachable,
        reachable.head(0),
        config=config,
        run_id=run_id,
        as_of=as_of,
        now=now,
        cap=None,
        render=render,
    )
    ledger.record_incident(
        incident_id, now(), since, "ledger+sent-log" if sent_log else "ledger", flooded.height, report.sent
    )
    unreachable = sorted(set(rows.get_column("customer_id")) - set(reachable.get_column("customer_id")))
    return RecoveryReport(flooded, unmapped, unreachable, report)

"""Payment-failed notices: which billing events become emails, and to whom.

An `invoice.payment_failed` event (`ingest.events`, validated there) becomes a notice of kind `payment_failed`,
keyed `event:{event_id}`, planned and gated like a reminder. Its recipient comes from the snapshot, never from the
event: see `notice_rows`.
"""

from __future__ import annotations

import polars as pl

from dunning.ingest.events import PAYMENT_FAILED, REJECTED_SCHEMA
from dunning.plan.policy import sendable_expr
from dunning.vocabulary import PLAN_ROLE_DTYPE, EmailKind, HoldReason, PlanRole

UNTRUSTED_ADDRESS = str(HoldReason.EVENT_ADDRESS_NOT_TRUSTED)  # a notice's hold: an invoice the snapshot lacks
OTHER_OWNER = "the event names customer {event} but the snapshot's invoice belongs to another customer"


def notice_rows(
    events: pl.DataFrame,
    snapshot: pl.DataFrame,
    already_recorded: set[str],
    trust_event_email: bool = False,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The payment-failed notices to send (new event ids only), and the events refused (`event_id`, `type`,
    `reason`, `payload`, for `event_quarantine`).

    A billing event never chooses the recipient. A notice for an invoice the snapshot knows goes to that invoice's
    row: its customer's address, name, language and pay link; an event whose customer is not the invoice's owner
    in the snapshot is refused. A notice for an invoice the snapshot does not know goes to the address in the event
    only with `events.trust_event_email`; otherwise it waits (hold `event_address_not_trusted`) for a snapshot
    that shows the invoice."""
    events = events.filter(pl.col("type") == PAYMENT_FAILED)
    refused = pl.DataFrame(schema=REJECTED_SCHEMA)
    if events.is_empty():  # the usual hourly run: no need to index the whole snapshot
        return pl.DataFrame(), refused
    extra = [c for c in ("customer_locale", "payment_url", "payment_url_dropped") if c in snapshot.columns]
    owners = snapshot.select(
        "invoice_id",
        pl.col("customer_id").alias("owner_id"),
        pl.col("customer_email").alias("owner_email"),
        pl.col("customer_name").alias("owner_name"),
        *extra,
    ).unique("invoice_id", keep="first")
    notices = (
        events.with_columns(pl.concat_str([pl.lit("event:"), pl.col("event_id")]).alias("idempotency_key"))
        .filter(~pl.col("idempotency_key").is_in(sorted(already_recorded)))
        .join(owners, on="invoice_id", how="left")
    )
    known = pl.col("owner_id").is_not_null()
    other_owner = known & (pl.col("owner_id") != pl.col("customer_id")).fill_null(True)
    refused = notices.filter(other_owner).select(
        "event_id",
        "type",
        pl.format(OTHER_OWNER.replace("{event}", "{}"), pl.col("customer_id").fill_null("(none)")).alias("reason"),
        "payload",
    )
    notices = notices.filter(~other_owner)
    trusted = pl.lit(trust_event_email)
    notices = notices.with_columns(
        pl.when(known).then(pl.col("owner_email")).when(trusted).then(pl.col("customer_email")).alias("customer_email"),
        pl.col("owner_name").alias("customer_name"),
        pl.when(~known & ~trusted).then(pl.lit(UNTRUSTED_ADDRESS)).alias("hold"),
    )
    rows = notices.with_columns(
        pl.lit(EmailKind.PAYMENT_FAILED).alias("kind"),
        pl.lit(PlanRole.DUE, dtype=PLAN_ROLE_DTYPE).alias("role"),
        pl.col("amount_remaining").alias("amount_minor"),
        pl.col("amount_remaining").alias("remaining_minor"),
        (pl.col("amount_remaining").fill_null(0) > 0).alias("owed"),
        sendable_expr().alias("sendable"),
        pl.col("idempotency_key").alias("email_group"),
        # minted when claimed (`sending.with_email_ids`), under the deployment's secret, which a plan never reads
        pl.lit(None, dtype=pl.String).alias("email_id"),
        pl.lit(None, dtype=pl.String).alias("message_id"),
    ).drop("owner_id", "owner_email", "owner_name", "amount_remaining", "payload", "type", "created_at")
    return rows, refused.cast(REJECTED_SCHEMA)

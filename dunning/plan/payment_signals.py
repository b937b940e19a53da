"""Payment signals: what billing events say about an invoice between two snapshots, so no one is reminded of what
they already paid, are paying, or dispute.

From the stored billing events (`billing_events`: polled from Stripe, given with `--events`, or received by
`dunning serve-webhooks`), per invoice, the latest event of each family decides:

- **paid**: the latest of `invoice.paid` / `invoice.payment_succeeded` / `invoice.payment_failed` is a payment,
  created after the snapshot was taken: the snapshot predates the payment, so the invoice is read as paid and its
  cycle closes at once. A snapshot taken after it decides by itself (a reopened invoice is dunned again).
- **in flight**: the latest of `payment_intent.processing` / `invoice.payment_action_required` and the events that
  end a payment attempt is one that starts it: the invoice's keys wait (reason `payment_in_flight`).
- **disputed**: the latest of `charge.dispute.created` / `charge.dispute.closed` is `created`: the invoice is
  excluded (reason `disputed`, by `stripe`) until the dispute closes (`dunning.run.steps` keeps the `exclusions`
  table in step).

An event names its invoice by the object's `invoice`, or by `metadata.invoice_id`: free text that the merchant's
integration (and so sometimes a customer) writes. So a signal applies only when the event's customer is the
invoice's customer in the snapshot (`owned`: Stripe ids compared; a dispute's customer is its charge's); another
customer's, or one naming no customer, is set aside in `event_quarantine` (reason `payment signal of another
customer`), counted in the run summary, and changes nothing.

Everything here is a polars frame operation over the events; nothing loops per invoice.
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from dunning.ingest.events import REJECTED_SCHEMA
from dunning.ingest.snapshot_rules import MAX_LENGTH
from dunning.safe_text import has_control
from dunning.vocabulary import SetAside

DISPUTE_OPENED, DISPUTE_CLOSED = "charge.dispute.created", "charge.dispute.closed"
DISPUTES = (DISPUTE_OPENED, DISPUTE_CLOSED)
STARTS = ("payment_intent.processing", "invoice.payment_action_required")
ENDS = (
    "invoice.payment_failed", "invoice.paid", "invoice.payment_succeeded", "payment_intent.succeeded",
    "payment_intent.payment_failed", "payment_intent.canceled", "invoice.voided",
)  # fmt: skip
PAID = ("invoice.paid", "invoice.payment_succeeded")
PAYMENTS = (*PAID, "invoice.payment_failed")
SIGNAL_TYPES = tuple(sorted({*DISPUTES, *STARTS, *ENDS}))
SIGNALS_SCHEMA = pl.Schema(
    {"invoice_id": pl.String(), "type": pl.String(), "created_at": pl.Datetime("us", "UTC"), "event_id": pl.String()}
)
WITH_PAYLOAD = pl.Schema({**SIGNALS_SCHEMA, "payload": pl.String()})
LOOKBACK = dt.timedelta(days=400)  # an open dispute or a payment older than this is the snapshot's to say


# within one second (Stripe's `created` resolution) an event that ends something is taken as the later one: a
# payment that started and succeeded in the same second is not left "in flight", a dispute opened and closed is closed
_ENDS_LAST = pl.col("type").is_in([*ENDS, DISPUTE_CLOSED, *PAID]).cast(pl.Int8)


def _latest(events: pl.DataFrame, types: tuple[str, ...]) -> pl.DataFrame:
    """Per invoice, its latest event among `types` (by creation, an ending event last within a second, then id)."""
    return (
        events.filter(pl.col("type").is_in(types))
        .with_columns(_ENDS_LAST.alias("_ends"))
        .sort("created_at", "_ends", "event_id")
        .drop("_ends")
        .group_by("invoice_id", maintain_order=True)
        .last()
    )


def _valid_ids(ids: pl.Series) -> list[str]:
    """Invoice ids an event named that may stand for an invoice (the snapshot's rules for an id)."""
    return [i for i in ids.to_list() if i and len(i) <= MAX_LENGTH["invoice_id"] and not has_control(i)]


# where an event says whose it is: the object's customer (an id, or the expanded customer), else, for a dispute,
# its charge's (Stripe's dispute object has no customer of its own: only an expanded charge tells)
_CUSTOMER_PATHS = (
    "$.data.object.customer.id", "$.data.object.customer", "$.data.object.charge.customer.id",
    "$.data.object.charge.customer",
)  # fmt: skip


def event_customer() -> pl.Expr:
    """The customer a stored event's payload names (null when it names none)."""
    return pl.coalesce(*(pl.col("payload").str.json_path_match(path) for path in _CUSTOMER_PATHS))


def owned(signals: pl.DataFrame, snapshot: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(the signals about the snapshot's invoices whose event's customer is the invoice's, the others about them as
    `event_quarantine` rows: REJECTED_SCHEMA). A signal about an invoice the snapshot lacks is in neither: it is
    judged again when a snapshot shows the invoice."""
    if "payload" not in signals.columns:
        signals = signals.with_columns(pl.lit(None, dtype=pl.String).alias("payload"))
    if signals.is_empty():  # the usual hour: no need to index the whole snapshot
        return signals, pl.DataFrame(schema=REJECTED_SCHEMA)
    owners = snapshot.select("invoice_id", pl.col("customer_id").cast(pl.String).alias("_owner")).filter(
        pl.col("invoice_id").is_in(signals.get_column("invoice_id").unique().implode())
    )
    rows = signals.join(owners.unique("invoice_id", keep="first"), on="invoice_id", how="inner").with_columns(
        event_customer().alias("_customer")
    )
    same = (pl.col("_customer") == pl.col("_owner")).fill_null(False)
    foreign = rows.filter(~same).select(
        "event_id",
        "type",
        pl.format(
            f"{SetAside.OTHER_CUSTOMER}: the event names customer {{}}, the snapshot's invoice {{}} is another's; "
            "ignored",
            pl.col("_customer").fill_null("(none)").str.slice(0, 200),
            pl.col("invoice_id"),
        ).alias("reason"),
        "payload",
    )
    return rows.filter(same).drop("_owner", "_customer"), foreign.cast(REJECTED_SCHEMA)


def disputes_naming_no_customer(foreign: pl.DataFrame) -> pl.DataFrame:
    """Of `owned`'s set-aside rows, the disputes (opened or closed) whose event names no customer (REJECTED_SCHEMA
    and the `invoice_id` it names): Stripe sends a dispute's `charge` unexpanded, so a real dispute lands here; only
    a human can tell it is the invoice's."""
    named = pl.coalesce(
        *(pl.col("payload").str.json_path_match(path) for path in ("$.data.object.invoice.id", "$.data.object.invoice",
                                                                   "$.data.object.metadata.invoice_id"))
    )  # fmt: skip
    return foreign.filter(pl.col("type").is_in(DISPUTES) & event_customer().is_null()).select(
        "event_id", "type", "reason", "payload", named.alias("invoice_id")
    )


def paid_since(events: pl.DataFrame, taken_at: dt.datetime) -> pl.DataFrame:
    """The invoices whose latest payment event is a payment created after the snapshot was taken (`invoice_id`)."""
    latest = _latest(events.cast(SIGNALS_SCHEMA), PAYMENTS)
    return latest.filter(pl.col("type").is_in(PAID) & (pl.col("created_at") > taken_at)).select("invoice_id")


def with_payments(valid: pl.DataFrame, events: pl.DataFrame, taken_at: dt.datetime) -> pl.DataFrame:
    """The snapshot with each invoice paid since it was taken read as paid (status `paid`, nothing remaining)."""
    paid = paid_since(events, taken_at)
    if paid.is_empty():
        return valid
    is_paid = pl.col("invoice_id").is_in(paid.get_column("invoice_id").implode())
    return valid.with_columns(
        pl.when(is_paid).then(pl.lit("paid")).otherwise(pl.col("status")).alias("status"),
        pl.when(is_paid).then(pl.col("amount_due")).otherwise(pl.col("amount_paid")).alias("amount_paid"),
    )


def in_flight(events: pl.DataFrame) -> list[str]:
    """The invoices with a payment attempt started and not yet ended."""
    latest = _latest(events.cast(SIGNALS_SCHEMA), STARTS + ENDS)
    return _valid_ids(latest.filter(pl.col("type").is_in(STARTS)).get_column("invoice_id"))


def disputes(events: pl.DataFrame) -> tuple[list[str], list[str]]:
    """(invoices with a dispute open, invoices all of whose disputes closed): each dispute (its object id, from
    the event's payload) by its own latest event, so a second dispute stays open when the first closes."""
    rows = events.filter(pl.col("type").is_in(DISPUTES))
    if "payload" not in rows.columns:
        rows = rows.with_columns(pl.lit(None, dtype=pl.String).alias("payload"))
    rows = rows.cast(WITH_PAYLOAD).with_columns(
        pl.coalesce(pl.col("payload").str.json_path_match("$.data.object.id"), pl.lit("")).alias("_dispute")
    )
    latest = (
        rows.with_columns(_ENDS_LAST.alias("_ends"))
        .sort("created_at", "_ends", "event_id")
        .group_by("invoice_id", "_dispute", maintain_order=True)
        .last()
    )
    by_invoice = latest.group_by("invoice_id").agg((pl.col("type") == DISPUTE_OPENED).any().alias("open"))
    opened = _valid_ids(by_invoice.filter(pl.col("open")).get_column("invoice_id").sort())
    closed = _valid_ids(by_invoice.filter(~pl.col("open")).get_column("invoice_id").sort())
    return opened, closed

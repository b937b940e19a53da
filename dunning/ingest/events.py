"""Stripe webhook events in, payment-failed notices out, deduplicated on the event id.

Stripe retries a webhook until it is acknowledged, so the same event can
arrive many times, in one file or across runs. Each `invoice.payment_failed`
event id becomes at most one notice, keyed `event:{event_id}`; the ledger's
primary key makes that hold across runs, and the plan drops ids already on
record so a redelivery is not even attempted. Other event types are counted
and ignored.

Events are data from outside, so each `invoice.payment_failed` event is
validated before it can become a notice (`rejection_reasons`): one with no
invoice, nothing owed, an id a header could be split on, or an unusable
timestamp is rejected with the rules it broke and goes to `event_quarantine`,
and the others proceed. A bad event never reaches the batch's gate, where it
would halt the cycle for every customer. Other types are never rejected; what
cannot be read from them is left null.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import polars as pl

from dunning.ingest.sources.stripe import read_events
from dunning.keys import event_key
from dunning.safe_text import collection_paused, has_control
from dunning.vocabulary import SetAside

PAYMENT_FAILED = "invoice.payment_failed"
EVENTS_SCHEMA = pl.Schema(
    {
        "event_id": pl.String(),
        "type": pl.String(),
        "created_at": pl.Datetime("us", "UTC"),
        "invoice_id": pl.String(),
        "customer_id": pl.String(),
        "customer_email": pl.String(),
        "currency": pl.String(),
        "amount_remaining": pl.Int64(),
        "payload": pl.String(),
    }
)
REJECTED_SCHEMA = pl.Schema({"event_id": pl.String, "type": pl.String, "reason": pl.String, "payload": pl.String})

MAX_ID = 200  # as for snapshot ids: keys stay short enough for the ledger and SMTP lines
# Unicode category Cc (C0, DEL, C1 including U+0085 NEL) and the line and paragraph separators: what a mail parser or
# a terminal may take as a line break or an escape sequence
CURRENCY = re.compile("[A-Za-z]{3}")
CREATED_RANGE = (946684800, 4102444800)  # 2000-01-01 and 2100-01-01, UTC
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class LoadedEvents:
    """The events of one file: `accepted` (EVENTS_SCHEMA, one row per event id) and `rejected` (REJECTED_SCHEMA)."""

    accepted: pl.DataFrame
    rejected: pl.DataFrame

    def summary(self) -> str:
        """One line for the operator: how many were rejected, by rule (rules are fixed text, never data)."""
        if self.rejected.is_empty():
            return "no billing events rejected"
        by_rule = (
            self.rejected.select(pl.col("reason").str.split("; "))
            .explode("reason")
            .group_by("reason")
            .len()
            .sort(["len", "reason"], descending=[True, False])
        )
        rules = ", ".join(f"{r} ({n})" for r, n in by_rule.rows())
        return f"{self.rejected.height} billing event(s) rejected into event_quarantine: {rules}"


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _storable(value: Any) -> str | None:
    """`value` if it is text a database can hold; lone surrogates (valid in JSON, not in UTF-8) escaped; else None."""
    if not isinstance(value, str):
        return None
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _identifier_problem(name: str, value: Any) -> str | None:
    if value is None:
        return f"{name} is missing"
    if not isinstance(value, str):
        return f"{name} is not a string"
    if not value:
        return f"{name} is empty"
    if len(value) > MAX_ID:
        return f"{name} is longer than {MAX_ID} characters"
    if has_control(value):
        return f"{name} contains a control character"
    if _storable(value) != value:
        return f"{name} is not valid Unicode (a lone surrogate)"
    return None


def _timestamp(value: Any) -> dt.datetime | None:
    """A Unix timestamp in seconds between 2000 and 2100 as a UTC datetime, else None."""
    if _is_int(value) and CREATED_RANGE[0] <= value < CREATED_RANGE[1]:
        return dt.datetime.fromtimestamp(value, dt.UTC)
    return None


def _invoice(event: dict[str, Any]) -> dict[str, Any] | None:
    """The invoice in `data.object`, or None when the event carries none."""
    data = event.get("data")
    obj = data.get("object") if isinstance(data, dict) else None
    return obj if isinstance(obj, dict) and obj.get("object", "invoice") == "invoice" else None


def _customer(value: Any) -> Any:
    return value.get("id") if isinstance(value, dict) else value


def _remaining(invoice: dict[str, Any]) -> Any:
    """`amount_remaining`, else `amount_due - amount_paid` when both are integers, else None."""
    remaining = invoice.get("amount_remaining")
    if remaining is not None:
        return remaining
    due, paid = invoice.get("amount_due"), invoice.get("amount_paid")
    return due - paid if _is_int(due) and _is_int(paid) else None


def rejection_reasons(event: Any) -> list[str]:
    """Every rule the event breaks, as the operator reads it; empty when it is fine.

    Only `invoice.payment_failed` events are held to the notice rules; any other
    type is only required to be an event at all (`read_events` already refuses a
    file holding anything else, so from a file that rule never fires).
    """
    if not (isinstance(event, dict) and _storable(event.get("type")) and _storable(event.get("id"))):
        return ["not a Stripe event (an object with a string id and type)"]
    if event["type"] != PAYMENT_FAILED:
        return []
    reasons = [_identifier_problem("event id", event.get("id"))]
    created = event.get("created")
    if not _is_int(created):
        reasons.append("created is not a Unix timestamp")
    elif _timestamp(created) is None:
        reasons.append("created is not between 2000-01-01 and 2100-01-01")
    data = event.get("data")
    invoice = _invoice(event)
    if not isinstance(data, dict):
        reasons.append("data is not an object")
    elif invoice is None:
        reasons.append("data.object is not an invoice")
    else:
        reasons += [
            _identifier_problem("invoice id", invoice.get("id")),
            _identifier_problem("customer", _customer(invoice.get("customer"))),
        ]
        currency = invoice.get("currency")
        if not isinstance(currency, str):
            reasons.append("currency is not a string" if currency is not None else "currency is missing")
        elif not CURRENCY.fullmatch(currency):
            reasons.append("currency is not a three-letter code")
        remaining = _remaining(invoice)
        if remaining is None:
            reasons.append("amount_remaining is missing (and amount_due - amount_paid is not computable)")
        elif not _is_int(remaining):
            reasons.append("amount_remaining is not an integer")
        elif remaining <= 0:
            reasons.append("amount_remaining is not positive")
        elif remaining > INT64_MAX:
            reasons.append("amount_remaining is too large")
    return [r for r in reasons if r]


def _payload(event: Any) -> str | None:
    try:
        with collection_paused():
            return json.dumps(event, sort_keys=True, default=str)
    except (RecursionError, TypeError, ValueError):  # nested deeper than the encoder goes, or keys of mixed types
        return None


# payment signals (`dunning.plan.payment_signals`): events about an invoice whose object is not the invoice; whose
# they are is judged there (`owned`): the event's customer against the invoice's in the snapshot
LINKED_TYPES = ("charge.dispute.", "payment_intent.")


def _linked_invoice(event: dict[str, Any]) -> Any:
    """The invoice a dispute or a PaymentIntent is about: its `invoice` (an id, or the expanded invoice), else its
    `metadata.invoice_id`; None when it names none."""
    data = event.get("data")
    obj = data.get("object") if isinstance(data, dict) else None
    if not isinstance(obj, dict):
        return None
    linked = obj.get("invoice")
    if isinstance(linked, dict):
        linked = linked.get("id")
    if linked is None and isinstance(obj.get("metadata"), dict):
        linked = obj["metadata"].get("invoice_id")
    return linked


def event_row(event: dict[str, Any]) -> dict[str, Any]:
    """One EVENTS_SCHEMA row; fields that are missing or of the wrong kind are null (validation decides what that
    means)."""
    invoice = (_invoice(event) if event["type"].startswith("invoice.") else None) or {}
    remaining = _remaining(invoice)
    currency = _storable(invoice.get("currency"))
    invoice_id = invoice.get("id")
    if invoice_id is None and event["type"].startswith(LINKED_TYPES):
        invoice_id = _linked_invoice(event)
    return {
        "event_id": _storable(event["id"]),
        "type": _storable(event["type"]),
        "created_at": _timestamp(event.get("created")),
        "invoice_id": _storable(invoice_id),
        "customer_id": _storable(_customer(invoice.get("customer"))),
        "customer_email": _storable(invoice.get("customer_email")),
        "currency": currency.upper() if currency is not None else None,
        "amount_remaining": remaining if _is_int(remaining) and -INT64_MAX <= remaining <= INT64_MAX else None,
        "payload": _payload(event),
    }


def split_events(events: Iterable[Any]) -> LoadedEvents:
    """Accepted and rejected events, one row per distinct event id (the first delivery of an id decides)."""
    accepted, rejected, seen = [], [], set()
    for event in events:
        event_id = _storable(event.get("id")) if isinstance(event, dict) else None
        if event_id is not None:
            if event_id in seen:
                continue
            seen.add(event_id)
        reasons = rejection_reasons(event)
        row = None if reasons else event_row(event)
        if row is not None and row["payload"] is None and row["type"] == PAYMENT_FAILED:
            reasons = ["event is nested too deeply to store"]  # the notice's event must be kept as received
        if reasons:
            kind = event.get("type") if isinstance(event, dict) else None
            rejected.append(
                {
                    "event_id": event_id,
                    "type": _storable(kind),
                    "reason": "; ".join(reasons),
                    "payload": _payload(event),
                }
            )
        else:
            accepted.append(row)
    return LoadedEvents(pl.DataFrame(accepted, schema=EVENTS_SCHEMA), pl.DataFrame(rejected, schema=REJECTED_SCHEMA))


def load_events(path: str | Path) -> LoadedEvents:
    """The events of the file at `path`, validated; SnapshotError for a file that is not events at all."""
    return split_events(read_events(Path(path)))


def events_frame(path: str | Path) -> pl.DataFrame:
    """The accepted events of the file: one row per distinct event id (a redelivery inside the file counts once)."""
    return load_events(path).accepted


def event_keys(events: pl.DataFrame) -> list[str]:
    return [event_key(e) for e in events.filter(pl.col("type") == PAYMENT_FAILED).get_column("event_id")]


def with_pending(events: pl.DataFrame, pending: pl.DataFrame) -> pl.DataFrame:
    """This run's events and the stored payment-failed events still without a notice, one row per event id."""
    if pending.is_empty():
        return events
    pending = pending.select(EVENTS_SCHEMA.names()).cast(EVENTS_SCHEMA)
    return pl.concat([events, pending]).unique("event_id", keep="first", maintain_order=True)


def expired_rows(expired: pl.DataFrame, lookback_days: int, as_of: dt.datetime) -> pl.DataFrame:
    """Stored payment-failed events past the lookback without their notice (`event_id`, `type`, `created_at`,
    `payload`) as `event_quarantine` rows: they get no notice, and the run summary and `status` say so."""
    reason = (
        f"{SetAside.EXPIRED}: created {{}}, more than source.events_lookback_days ({lookback_days}) before the run's "
        f"clock {as_of.astimezone(dt.UTC).isoformat()}: no notice"
    )
    return expired.select(
        "event_id",
        "type",
        pl.format(reason, pl.col("created_at").dt.strftime("%Y-%m-%dT%H:%M:%SZ")).alias("reason"),
        "payload",
    )

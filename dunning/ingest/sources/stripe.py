"""Stripe objects in, snapshot rows and payment-failed events out.

Stripe invoices carry amounts in minor units (as we do), a lower-case currency,
Unix-second timestamps, and a `due_date` that is null for invoices collected
with `charge_automatically`. For those, the payment was due when Stripe tried
to charge the card, which is when the invoice was finalized
(`status_transitions.finalized_at`); drafts and old objects without it fall
back to `created`. Dates are taken in the business timezone so "days overdue"
means the same thing for every source.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from dunning.errors import SnapshotError
from dunning.safe_text import collection_paused, parse_json

SNAPSHOT_FIELDS = (
    "invoice_id",
    "customer_id",
    "customer_email",
    "customer_name",
    "currency",
    "amount_due",
    "amount_paid",
    "due_date",
    "status",
    "billing_period",
    "snapshot_at",
    "auto_advance",
    "payment_url",
    "customer_locale",
    "invoice_lines",
    "segment",
    "customer_timezone",
    "customer_type",
    "customer_cc",
)


def _date(ts: Any, zone: ZoneInfo) -> str | None:
    if ts is None:
        return None
    try:
        return dt.datetime.fromtimestamp(int(ts), tz=dt.UTC).astimezone(zone).date().isoformat()
    except (TypeError, ValueError, OverflowError):
        return str(ts)  # left for validation to reject as an unparsable date


def _customer_id(value: Any) -> object:
    if isinstance(value, dict):  # expanded customer object
        return value.get("id")
    return value


def _flag(value: Any) -> object:
    """A JSON boolean as the text "true"/"false"; anything else left for validation as given."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _preferred_locale(customer: Any) -> object:
    """The customer's first `preferred_locales` entry, when the invoice's customer is expanded (`de-DE`, `en`)."""
    locales = customer.get("preferred_locales") if isinstance(customer, dict) else None
    return locales[0] if isinstance(locales, list) and locales and isinstance(locales[0], str) else None


def _segment(customer: Any, key: str = "dunning_segment") -> object:
    """The customer's `metadata.dunning_segment` (it chooses the policy), or another metadata `key`
    (`dunning_cc`: the copy addresses, `dunning.desk.contacts`), when the invoice's customer is expanded."""
    metadata = customer.get("metadata") if isinstance(customer, dict) else None
    segment = metadata.get(key) if isinstance(metadata, dict) else None
    return segment if isinstance(segment, str) else None


def _customer_type(customer: Any) -> object:
    """`business` or `consumer` when the expanded customer says: its `metadata.dunning_customer_type` first, else
    `tax_exempt: reverse` (a reverse-charge customer is a business); else unknown (`fees.default_customer_type`)."""
    if not isinstance(customer, dict):
        return None
    metadata = customer.get("metadata")
    said = metadata.get("dunning_customer_type") if isinstance(metadata, dict) else None
    if isinstance(said, str) and said.strip().lower() in ("business", "consumer"):
        return said.strip().lower()
    return "business" if customer.get("tax_exempt") == "reverse" else None


def _lines(lines: Any) -> str | None:
    """The invoice's line items (`lines.data`: description, amount, quantity) as JSON text for the invoice email;
    checked when shown (`invoice_emails.invoice_lines`). A list Stripe truncated (`has_more`) is shown as far as
    it goes: the total is the invoice's own."""
    data = lines.get("data") if isinstance(lines, dict) else None
    if not isinstance(data, list) or not data:
        return None
    keep = ("description", "amount", "quantity")
    try:
        with collection_paused():
            return json.dumps([{k: item.get(k) for k in keep} for item in data if isinstance(item, dict)])
    except RecursionError:  # a value nested deeper than the encoder goes: the email shows no lines
        return None


def invoice_row(invoice: dict[str, Any], zone: ZoneInfo) -> dict[str, Any]:
    """One snapshot row (all values as text, like a CSV) from one Stripe invoice object."""
    due = invoice.get("due_date")
    if due is None:
        transitions = invoice.get("status_transitions") or {}
        due = transitions.get("finalized_at") or invoice.get("created")
    currency = invoice.get("currency")
    # the billing period (and so the invoice email's key, `invoice:{id}:{period}`): the UTC month of period_end, the
    # same in every business timezone, so a deployment that changes its timezone never re-keys an invoice
    period_end = _date(invoice.get("period_end"), ZoneInfo("UTC"))
    row = {
        "invoice_id": invoice.get("id"),
        "customer_id": _customer_id(invoice.get("customer")),
        "customer_email": invoice.get("customer_email"),
        "customer_name": invoice.get("customer_name"),
        "currency": currency.upper() if isinstance(currency, str) else currency,
        "amount_due": invoice.get("amount_due"),
        "amount_paid": invoice.get("amount_paid"),
        "due_date": _date(due, zone),
        "status": invoice.get("status"),
        "billing_period": period_end[:7] if period_end else None,
        "snapshot_at": None,
        "auto_advance": _flag(invoice.get("auto_advance")),
        "payment_url": invoice.get("hosted_invoice_url"),  # checked later (`pay_links`): only https is shown
        "customer_locale": _preferred_locale(invoice.get("customer")),
        "invoice_lines": _lines(invoice.get("lines")),
        "segment": _segment(invoice.get("customer")),
        "customer_timezone": None,  # Stripe keeps no time zone for a customer; a send window uses the business zone
        "customer_type": _customer_type(invoice.get("customer")),
        "customer_cc": _segment(invoice.get("customer"), "dunning_cc"),
    }
    return {k: (None if v is None else str(v)) for k, v in row.items()}


def invoices_from_json(payload: Any, source: str) -> list[dict[str, Any]]:
    """The invoice objects in a `GET /v1/invoices` body (or a bare array of invoices)."""
    if isinstance(payload, dict) and payload.get("object") == "list":
        items = payload.get("data")
    elif isinstance(payload, list):
        items = payload
    else:
        raise SnapshotError(f'{source}: JSON is not a Stripe invoice list (expected an object with "object": "list")')
    if not isinstance(items, list):
        raise SnapshotError(f'{source}: the list\'s "data" is not an array')
    bad = [
        i for i, item in enumerate(items) if not isinstance(item, dict) or item.get("object", "invoice") != "invoice"
    ]
    if bad:
        raise SnapshotError(f"{source}: entries {bad[:10]} are not Stripe invoice objects")
    return items


def load_stripe_invoices(path: Path, zone: ZoneInfo) -> list[dict[str, Any]]:
    try:
        payload = parse_json(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:
        raise SnapshotError(f"{path}: JSON nested too deeply to read") from None
    return [invoice_row(inv, zone) for inv in invoices_from_json(payload, str(path))]


def read_events(path: Path) -> list[dict[str, Any]]:
    """Stripe event objects from a JSON object, a JSON array, or JSON Lines.

    Only whole-file problems raise (SnapshotError, one line naming the file): a
    file that cannot be read, is not UTF-8, is not JSON, is nested too deeply
    for the parser, or holds an entry that is not an object with a string `id`
    and `type`. What is inside an event is for `dunning.ingest.events` to validate.
    """
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark from a Windows export is not an error
    except UnicodeDecodeError as exc:
        raise SnapshotError(
            f"{path}: not UTF-8 text (byte {exc.start} is invalid); Stripe sends JSON as UTF-8"
        ) from None
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    try:
        try:
            payload = parse_json(text)
            events: Iterable[Any] = payload if isinstance(payload, list) else [payload]
        except json.JSONDecodeError:
            try:
                events = [parse_json(line) for line in text.splitlines() if line.strip()]
            except json.JSONDecodeError as exc:
                raise SnapshotError(f"{path}: neither JSON nor JSON Lines ({exc})") from None
    except RecursionError:
        raise SnapshotError(f"{path}: JSON nested too deeply to read") from None
    except ValueError as exc:  # not a JSONDecodeError: e.g. an integer longer than Python's digit limit
        raise SnapshotError(
            f"{path}: not valid JSON ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        ) from None
    events = list(events)
    bad = [
        i
        for i, e in enumerate(events)
        if not (isinstance(e, dict) and all(isinstance(e.get(k), str) and e.get(k) for k in ("id", "type")))
    ]
    if bad:
        raise SnapshotError(
            f"{path}: entries {bad[:10]}{' and more' if len(bad) > 10 else ''} are not Stripe events "
            "(need an object with a string 'id' and 'type'; entries counted from 0)"
        )
    return events

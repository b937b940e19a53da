"""Chargebee as a `base.BillingSource`, through the official `chargebee` SDK (pinned in pyproject.toml).

- **Invoices**: `GET /invoices` (`limit=100`, `offset=<next_offset>` until there is none), every status, with
  `include_deleted=true`; incremental: `updated_at[after]=<cursor - OVERLAP>` and `sort_by[asc]=updated_at`. The
  cursor is the newest `updated_at` seen (Chargebee's clock). An invoice with `deleted: true` drops out.
- **Customers** (the email, the name, the language, the billing contacts): `GET /customers?id[in]=[...]`, up to 100
  ids a request, for the customers of the invoices pulled: never a request per invoice. Contacts with
  `send_billing_email` become `customer_cc`.
- **Amounts** are integers in minor units already; `amount_due` is what remains, so the snapshot's `amount_due` is
  `amount_paid + amount_due` and its `amount_paid` is `amount_paid` (remaining: Chargebee's `amount_due`).
- **Statuses** (`STATUSES`): `paid` paid; `posted`, `payment_due`, `not_paid` open (still owed: `not_paid` is
  Chargebee's retries exhausted, exactly what reminders are for); `voided` void; `pending` draft (not yet closed).
- **Signals**: `GET /events` (`occurred_at[after]`, `event_type[in]`): `payment_failed` is one notice per event
  (key `event:chargebee:{event id}`), `payment_initiated` a payment in flight until `payment_succeeded` or
  `payment_failed`; a succeeded payment that leaves the invoice `paid` closes it. Disputes: `GET /disputes`
  (created within `DISPUTE_DAYS`), each looked up to its invoice through its transaction (one request per dispute,
  a few a month); a lookup answered 404 or 501 is counted and changes nothing.
- **Webhooks** carry no signature (HTTP Basic only): a body is a trigger; `fetch_back` asks `GET /events/{id}`.

The SDK reaches a plain-http `api_base` (this machine only) through its class attribute `verify_ca_certs`, set off
only around our own requests to such a base and restored after.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

from dunning.config import Source
from dunning.errors import BillingSourceFailed, ConfigError
from dunning.ingest.sources.base import FetchedBack, Notification, Pull, Signals, api_failure
from dunning.ingest.sources.normalize import as_dict, as_list, currency_code, customer_name, text_row, unix_date
from dunning.secret_env import read_secret

VENDOR = "Chargebee"
OVERLAP = 120
PAGE = 100
DISPUTE_DAYS = 400
STATUSES = {"paid": "paid", "posted": "open", "payment_due": "open", "not_paid": "open", "voided": "void",
            "pending": "draft"}  # fmt: skip
SIGNAL_EVENTS = ("payment_failed", "payment_initiated", "payment_succeeded")
OPEN_DISPUTES = ("initiated", "funds_withdrawn", "in_review")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def invoice_row(invoice: Mapping[str, Any], customer: Mapping[str, Any] | None, zone: ZoneInfo) -> dict[str, Any]:
    """One snapshot row (text) from a Chargebee invoice and its customer (None when not known)."""
    customer = customer or {}
    paid, due = _int(invoice.get("amount_paid")), _int(invoice.get("amount_due"))
    currency = invoice.get("currency_code")
    date = _int(invoice.get("date"))
    contacts = as_list(customer.get("contacts"))
    cc = [c.get("email") for c in contacts if isinstance(c, dict) and c.get("send_billing_email") is True]
    address = as_dict(invoice.get("billing_address"))
    status = invoice.get("status")
    return text_row({
        "invoice_id": invoice.get("id"),
        "customer_id": invoice.get("customer_id"),
        "customer_email": customer.get("email") or address.get("email"),
        "customer_name": customer_name(customer),
        "currency": currency_code(currency),
        # remaining is Chargebee's amount_due: the snapshot's due is what was paid plus what remains
        "amount_due": (paid or 0) + due if due is not None else invoice.get("amount_due"),
        "amount_paid": paid if paid is not None else 0,
        "due_date": unix_date(invoice.get("due_date") or invoice.get("date"), zone),
        "status": STATUSES.get(status, status) if isinstance(status, str) else status,
        "billing_period": dt.datetime.fromtimestamp(date, dt.UTC).strftime("%Y-%m") if date else None,
        "customer_locale": customer.get("locale"),
        "customer_cc": ",".join(e for e in cc if isinstance(e, str)) or None,
    })  # fmt: skip


def _event_invoice(invoice: Mapping[str, Any], customer: Mapping[str, Any]) -> dict[str, Any]:
    """A Chargebee invoice as the Stripe-shaped invoice a billing event carries (`dunning.ingest.events`)."""
    currency = invoice.get("currency_code")
    return {
        "object": "invoice",
        "id": invoice.get("id"),
        "customer": invoice.get("customer_id"),
        "customer_email": customer.get("email"),
        "currency": currency.lower() if isinstance(currency, str) else currency,
        "amount_remaining": invoice.get("amount_due"),
        "status": STATUSES.get(str(invoice.get("status"))),
    }


def signal_events(event: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A Chargebee event as the billing events it means (base module docstring); [] for another type."""
    kind, content = event.get("event_type"), event.get("content")
    if kind not in SIGNAL_EVENTS or not isinstance(content, dict) or not isinstance(event.get("id"), str):
        return []
    invoice: dict[str, Any] | None = content.get("invoice") if isinstance(content.get("invoice"), dict) else None
    transaction = as_dict(content.get("transaction"))
    customer = as_dict(content.get("customer"))
    if invoice is None:  # a payment of several invoices names them in its transaction
        first = as_dict((as_list(transaction.get("linked_invoices")) or [None])[0])
        invoice = {"id": first.get("invoice_id"), "customer_id": transaction.get("customer_id"),
                   "currency_code": transaction.get("currency_code")}  # fmt: skip
    base = {"object": "event", "id": f"chargebee:{event['id']}", "created": event.get("occurred_at")}
    obj = _event_invoice(invoice, customer)
    if kind == "payment_failed":
        return [{**base, "type": "invoice.payment_failed", "data": {"object": obj}}]
    if kind == "payment_initiated":
        intent = {"object": "payment_intent", "id": transaction.get("id"), "invoice": obj["id"],
                  "customer": obj["customer"]}  # fmt: skip
        return [{**base, "type": "payment_intent.processing", "data": {"object": intent}}]
    if invoice.get("status") == "paid":
        return [{**base, "type": "invoice.paid", "data": {"object": obj}}]
    intent = {
        "object": "payment_intent",
        "id": transaction.get("id"),
        "invoice": obj["id"],
        "customer": obj["customer"],
    }
    return [{**base, "type": "payment_intent.succeeded", "data": {"object": intent}}]


class Unavailable(Exception):
    """An optional lookup the vendor does not offer here (404, 501): unknown, counted, never a failed pull."""


class ChargebeeSource:
    name = "chargebee"
    incremental = True

    def __init__(self, settings: Source, environ: Mapping[str, str] = os.environ) -> None:
        self.settings = settings
        self.key = read_secret(settings.api_key_env, "source.api_key_env", environ)
        parts = urlsplit(settings.api_base)
        host = parts.hostname or ""
        if "." not in host or parts.path.rstrip("/") != "/api/v2":
            raise ConfigError(
                "source.api_base for chargebee must be https://SITE.chargebee.com/api/v2 (a host with a dot, the path "
                "/api/v2): the SDK builds its URL from the site and domain"
            )
        self.plain_http = parts.scheme == "http"
        site, domain = host.split(".", 1)
        self.requests = 0
        self.unknown = 0  # optional lookups answered 404/501 (disputes): counted, never a failure
        import chargebee  # type: ignore[import-untyped]

        self.cb = chargebee.Chargebee(
            api_key=self.key, site=site, chargebee_domain=domain + (f":{parts.port}" if parts.port else ""),
            protocol=parts.scheme, connection_time_out=int(settings.timeout_seconds),
            read_time_out=int(settings.timeout_seconds),
        )  # fmt: skip

    @contextlib.contextmanager
    def _call(self, request: str, optional: bool = False) -> Iterator[None]:
        """One SDK request, counted; any failure as the one line of `base.api_failure`."""
        import chargebee
        import httpx
        from chargebee.main import Chargebee  # type: ignore[import-untyped]

        self.requests += 1
        verify = Chargebee.verify_ca_certs
        Chargebee.verify_ca_certs = not self.plain_http
        try:
            yield
        except chargebee.APIError as error:
            if optional and error.http_status_code in (404, 501):
                raise Unavailable(request) from None
            raise api_failure(VENDOR, self.settings.api_base, request, status=error.http_status_code,
                              code=error.api_error_code, headers=dict(error.http_headers or {}),
                              key_env=self.settings.api_key_env) from None  # fmt: skip
        except httpx.HTTPError as error:
            raise api_failure(
                VENDOR, self.settings.api_base, request, status=None, cause=type(error).__name__
            ) from None
        except BillingSourceFailed:
            raise
        except Exception:  # noqa: BLE001 - the SDK raises a bare Exception for a body that is not its JSON
            raise api_failure(VENDOR, self.settings.api_base, request, status=200) from None
        finally:
            Chargebee.verify_ca_certs = verify

    def _pages(
        self, request: str, lister: Any, params: dict[str, Any], key: str, optional: bool = False
    ) -> Iterator[dict[str, Any]]:
        offset = None
        while True:
            with self._call(request, optional):
                page = lister({**params, "limit": PAGE, **({"offset": offset} if offset else {})})
                items = [getattr(entry, key).raw_data for entry in page.list]
                offset = page.next_offset
            yield from items
            if not offset:
                return

    def _customers(self, ids: Sequence[Any]) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        unique = sorted({i for i in ids if isinstance(i, str)})
        for start in range(0, len(unique), PAGE):
            chunk = unique[start : start + PAGE]
            for customer in self._pages("GET /customers?id[in]", self.cb.Customer.list, {"id[in]": chunk}, "customer"):
                if isinstance(customer.get("id"), str):
                    found[customer["id"]] = customer
        return found

    def pull(self, cursor: str | None, zone: ZoneInfo) -> Pull:
        self.requests = 0
        params: dict[str, Any] = {"include_deleted": "true"}
        if cursor is not None:
            params.update({"updated_at[after]": max(0, int(cursor) - OVERLAP), "sort_by[asc]": "updated_at"})
        invoices = list(self._pages("GET /invoices", self.cb.Invoice.list, params, "invoice"))
        deleted = [i["id"] for i in invoices if i.get("deleted") is True and isinstance(i.get("id"), str)]
        live = [i for i in invoices if i.get("deleted") is not True]
        customers = self._customers([i.get("customer_id") for i in live])
        rows = [invoice_row(i, customers.get(str(i.get("customer_id"))), zone) for i in live]
        stamps = [u for i in invoices if (u := _int(i.get("updated_at"))) is not None]
        newest = max([*stamps, *([int(cursor)] if cursor is not None else [])], default=None)
        return Pull(rows, complete=cursor is None, cursor=None if newest is None else str(newest), deleted=deleted,
                    requests=self.requests)  # fmt: skip

    def signals(self, cursor: str | None, since: dt.datetime) -> Signals:
        self.requests = 0
        after = max(int(since.timestamp()), int(cursor) - OVERLAP if cursor else 0)
        params = {"occurred_at[after]": after, "event_type[in]": json.dumps(list(SIGNAL_EVENTS)),
                  "sort_by[asc]": "occurred_at"}  # fmt: skip
        events = list(self._pages("GET /events", self.cb.Event.list, params, "event"))
        out = [e for event in events for e in signal_events(event)]
        stamps = [t for e in events if (t := _int(e.get("occurred_at"))) is not None]
        out += self._disputes(since)
        newest = max([*stamps, *([int(cursor)] if cursor else [])], default=None)
        return Signals(out, None if newest is None else str(newest), requests=self.requests)

    def _disputes(self, now: dt.datetime) -> list[dict[str, Any]]:
        """Each dispute created within `DISPUTE_DAYS` as a `charge.dispute.created` (open) or `.closed` event on its
        invoice (through its transaction); a vendor without disputes (404, 501) has none."""
        since = int((now - dt.timedelta(days=DISPUTE_DAYS)).timestamp())
        params = {"created_at[after]": since}
        try:
            disputes = list(self._pages("GET /disputes", self.cb.Dispute.list, params, "dispute", optional=True))
        except Unavailable:
            self.unknown += 1
            return []
        out = []
        for dispute in disputes:
            transaction_id = dispute.get("transaction_id")
            if not isinstance(transaction_id, str) or not isinstance(dispute.get("id"), str):
                continue
            try:
                with self._call("GET /transactions/{id}", optional=True):
                    linked = self.cb.Transaction.retrieve(transaction_id).transaction.raw_data.get("linked_invoices")
            except Unavailable:
                self.unknown += 1
                continue
            first = linked[0] if isinstance(linked, list) and linked and isinstance(linked[0], dict) else {}
            opened = dispute.get("status") in OPEN_DISPUTES
            out.append({"object": "event", "id": f"chargebee:dispute:{dispute['id']}:{'open' if opened else 'closed'}",
                        "type": "charge.dispute.created" if opened else "charge.dispute.closed",
                        "created": dispute.get("updated_at") or dispute.get("created_at"),
                        "data": {"object": {"object": "dispute", "id": dispute["id"], "invoice": first.get(
                            "invoice_id"), "customer": dispute.get("customer_id")}}})  # fmt: skip
        return out

    def fetch_back(self, notifications: Sequence[Notification], zone: ZoneInfo) -> FetchedBack:
        """Each notification's event asked of the API by its id (a body is only a trigger: Chargebee signs none)."""
        self.requests = 0
        result = FetchedBack()
        for note in notifications:
            with self._call("GET /events/{id}"):
                event = self.cb.Event.retrieve(note.notification_id).event.raw_data
            content = as_dict(event.get("content"))
            events = signal_events(event)
            invoice = content.get("invoice")
            if isinstance(invoice, dict) and invoice.get("deleted") is not True:
                customer = content.get("customer") if isinstance(content.get("customer"), dict) else None
                result.rows.append(invoice_row(invoice, customer, zone))
            result.events += events
            result.ignored += not events and not isinstance(invoice, dict)
        result.requests = self.requests
        return result

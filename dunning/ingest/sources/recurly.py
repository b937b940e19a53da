"""Recurly as a `base.BillingSource`, through our own client (`recurly_api`: the official SDK has no base URL).

- **Invoices**: `GET /invoices?sort=updated_at&order=asc&limit=200`, incremental with `begin_time=<cursor -
  OVERLAP>` (ISO 8601); the cursor is the newest `updated_at` seen (Recurly's clock), kept as Unix seconds. Credit
  invoices (`type: credit`) are not receivables: left out. The invoice's `number` is its id in the snapshot (what the
  customer sees and what webhooks name), the account's `code` the customer's id.
- **Accounts** (`cc_emails`, `preferred_locale`): `GET /accounts?ids=...`, up to 200 a request, for the accounts of
  the invoices pulled; the email is the invoice's embedded `account.email` (no request per invoice).
- **Amounts**: decimals in major units, into minor units with `Decimal` and the currency's exponent
  (`normalize.minor_units`); the snapshot's `amount_due` is `paid + balance`, its `amount_paid` is `paid`.
- **States** (`STATES`): `pending`, `past_due`, `processing`, `open` are open (owed; `processing` is a payment in
  flight, which the signals make wait); `paid` paid; `voided` void; `failed` uncollectible: Recurly sets it when
  its own dunning campaign ended without payment and it closed the invoice (`closed_at`: "marked paid or failed"),
  so the merchant has stopped collecting it and a reminder from us would contradict them; a reopened invoice comes
  back `past_due` and is dunned again. `closed` is paid with nothing left, uncollectible otherwise.
- **Signals**: Recurly's v3 API lists no events; a payment is a transaction, so `GET /transactions` since the cursor
  (`sort=updated_at&order=asc&begin_time`): `declined`/`error` is a failed payment, one notice per transaction
  (key `event:recurly:{transaction id}`, the id a `payment.failed` webhook names too); `scheduled`, `processing`,
  `pending` a payment in flight; `success` paid when it left the invoice `paid`; `chargeback` a dispute (v3 has no
  dispute resource: a chargeback is final, so the invoice stays excluded until `dunning include`).
- **Webhooks** (`recurly-signature`, HMAC-SHA256, `webhooks.verify_recurly`): a notification is a trigger;
  `fetch_back` asks `GET /transactions/uuid-{uuid}` (payments) or `GET /invoices/number-{n}` (invoices).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping, Sequence
from typing import Any
from zoneinfo import ZoneInfo

from dunning.config import Source
from dunning.ingest.sources.base import FetchedBack, Notification, Pull, Signals
from dunning.ingest.sources.normalize import (
    as_dict,
    currency_code,
    customer_name,
    iso_date,
    iso_instant,
    minor_units,
    text_row,
)
from dunning.ingest.sources.recurly_api import RecurlyClient
from dunning.secret_env import read_secret

OVERLAP = 120
PAGE = 200
STATES = {"pending": "open", "past_due": "open", "processing": "open", "open": "open", "paid": "paid",
          "voided": "void", "failed": "uncollectible"}  # fmt: skip
FAILED, IN_FLIGHT = ("declined", "error"), ("scheduled", "processing", "pending")


def _iso(seconds: int) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(value: Any) -> int | None:
    at = iso_instant(value)
    return int(at.timestamp()) if at is not None else None


def _account(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    account = obj.get("account")
    return account if isinstance(account, dict) else {}


def invoice_row(invoice: Mapping[str, Any], account: Mapping[str, Any] | None, zone: ZoneInfo) -> dict[str, Any]:
    """One snapshot row (text) from a Recurly invoice and its full account (None: only the embedded one)."""
    mini, account = _account(invoice), account or {}
    currency = invoice.get("currency")
    paid, balance = minor_units(invoice.get("paid"), currency), minor_units(invoice.get("balance"), currency)
    state = invoice.get("state")
    status = STATES.get(state, state) if isinstance(state, str) else state
    if state == "closed":
        status = "paid" if balance == 0 else "uncollectible"
    created = iso_instant(invoice.get("created_at"))
    cc = account.get("cc_emails")
    return text_row({
        "invoice_id": invoice.get("number"),
        "customer_id": mini.get("code"),
        "customer_email": mini.get("email") or account.get("email"),
        "customer_name": customer_name(mini),
        "currency": currency_code(currency),
        "amount_due": paid + balance if paid is not None and balance is not None else None,
        "amount_paid": paid,
        "due_date": iso_date(invoice.get("due_at") or invoice.get("created_at"), zone),
        "status": status,
        "billing_period": created.astimezone(dt.UTC).strftime("%Y-%m") if created else None,
        "customer_locale": account.get("preferred_locale"),
        "customer_timezone": account.get("preferred_time_zone"),
        "customer_cc": ",".join(e.strip() for e in cc.split(",") if e.strip()) if isinstance(cc, str) else None,
    })  # fmt: skip


def transaction_events(transaction: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A Recurly transaction as the billing events it means (module docstring); [] for what means nothing."""
    status, txn_id = transaction.get("status"), transaction.get("id")
    invoice = as_dict(transaction.get("invoice"))
    if not isinstance(txn_id, str) or not invoice.get("number") or invoice.get("type") == "credit":
        return []
    account = _account(transaction)
    created = _seconds(transaction.get("updated_at") or transaction.get("created_at"))
    currency = transaction.get("currency")
    number, customer = str(invoice["number"]), account.get("code")
    base = {"object": "event", "created": created}
    about = {"invoice": number, "customer": customer}
    if status in FAILED and transaction.get("type") in ("purchase", "capture"):
        obj = {"object": "invoice", "id": number, "customer": customer, "customer_email": account.get("email"),
               "currency": currency.lower() if isinstance(currency, str) else currency,
               "amount_remaining": minor_units(transaction.get("amount"), currency)}  # fmt: skip
        return [{**base, "id": f"recurly:{txn_id}", "type": "invoice.payment_failed", "data": {"object": obj}}]
    if status in IN_FLIGHT:
        obj = {"object": "payment_intent", "id": txn_id, **about}
        return [{**base, "id": f"recurly:{txn_id}:in_flight", "type": "payment_intent.processing",
                 "data": {"object": obj}}]  # fmt: skip
    if status == "success":
        kind = "invoice.paid" if invoice.get("state") == "paid" else "payment_intent.succeeded"
        obj = {"object": "invoice", "id": number, "customer": customer} if kind == "invoice.paid" else {
            "object": "payment_intent", "id": txn_id, **about}  # fmt: skip
        return [{**base, "id": f"recurly:{txn_id}:success", "type": kind, "data": {"object": obj}}]
    if status == "chargeback":
        obj = {"object": "dispute", "id": txn_id, **about}
        return [{**base, "id": f"recurly:{txn_id}:chargeback", "type": "charge.dispute.created",
                 "data": {"object": obj}}]  # fmt: skip
    if status == "void":
        obj = {"object": "payment_intent", "id": txn_id, **about}
        return [{**base, "id": f"recurly:{txn_id}:void", "type": "payment_intent.canceled", "data": {"object": obj}}]
    return []


class RecurlySource:
    name = "recurly"
    incremental = True

    def __init__(self, settings: Source, environ: Mapping[str, str] = os.environ) -> None:
        self.settings = settings
        key = read_secret(settings.api_key_env, "source.api_key_env", environ)
        self.api = RecurlyClient(settings.api_base, key, settings.api_key_env, settings.timeout_seconds)
        self.unknown = 0

    def _accounts(self, ids: Sequence[Any]) -> dict[str, dict[str, Any]]:
        unique = sorted({i for i in ids if isinstance(i, str)})
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(unique), PAGE):
            params = {"ids": ",".join(unique[start : start + PAGE]), "limit": PAGE}
            for account in self.api.pages("/accounts", params, "GET /accounts?ids"):
                if isinstance(account.get("id"), str):
                    found[account["id"]] = account
        return found

    def _rows(self, invoices: list[dict[str, Any]], zone: ZoneInfo) -> list[dict[str, Any]]:
        charges = [i for i in invoices if i.get("type") != "credit"]
        accounts = self._accounts([_account(i).get("id") for i in charges])
        return [invoice_row(i, accounts.get(str(_account(i).get("id"))), zone) for i in charges]

    def pull(self, cursor: str | None, zone: ZoneInfo) -> Pull:
        self.api.requests = 0
        params: dict[str, Any] = {"sort": "updated_at", "order": "asc", "limit": PAGE}
        if cursor is not None:
            params["begin_time"] = _iso(max(0, int(cursor) - OVERLAP))
        invoices = list(self.api.pages("/invoices", params, "GET /invoices"))
        stamps = [s for i in invoices if (s := _seconds(i.get("updated_at"))) is not None]
        newest = max([*stamps, *([int(cursor)] if cursor is not None else [])], default=None)
        rows = self._rows(invoices, zone)
        return Pull(rows, complete=cursor is None, cursor=None if newest is None else str(newest),
                    requests=self.api.requests)  # fmt: skip

    def signals(self, cursor: str | None, since: dt.datetime) -> Signals:
        self.api.requests = 0
        begin = max(int(since.timestamp()), int(cursor) - OVERLAP if cursor else 0)
        params = {"sort": "updated_at", "order": "asc", "limit": PAGE, "begin_time": _iso(begin)}
        transactions = list(self.api.pages("/transactions", params, "GET /transactions"))
        events = [e for t in transactions for e in transaction_events(t)]
        stamps = [s for t in transactions if (s := _seconds(t.get("updated_at"))) is not None]
        newest = max([*stamps, *([int(cursor)] if cursor else [])], default=None)
        return Signals(events, None if newest is None else str(newest), requests=self.api.requests)

    def fetch_back(self, notifications: Sequence[Notification], zone: ZoneInfo) -> FetchedBack:
        """Each notification's object asked of the API (a body is only a trigger)."""
        self.api.requests = 0
        result = FetchedBack()
        invoices = []
        for note in notifications:
            uuid, number = note.body.get("uuid"), note.body.get("invoice_number")
            if isinstance(uuid, str) and uuid.isalnum() and note.body.get("object_type") == "payment":
                found = self.api.get(f"/transactions/uuid-{uuid}", None, "GET /transactions/uuid-{uuid}", True)
                result.events += transaction_events(found) if isinstance(found, dict) else []
                result.ignored += found is None
            elif isinstance(number, (int, str)) and str(number).isdigit():
                found = self.api.get(f"/invoices/number-{number}", None, "GET /invoices/number-{n}", True)
                invoices += [found] if isinstance(found, dict) else []
                result.ignored += found is None
            else:
                result.ignored += 1
        result.rows = self._rows(invoices, zone)
        result.requests = self.api.requests
        return result

"""Stripe as a `base.BillingSource`: a complete pull lists every invoice (`GET /v1/invoices`, the customer expanded);
an incremental one reads the `invoice.*` events since the cursor (`GET /v1/events?type=invoice.*`, which Stripe keeps
30 days: `source.full_sync_hours` is at most 28 days, so a cursor never outlives them) and takes each invoice as its
newest event carries it; `invoice.deleted` drops a draft. The cursor is the newest event's `created` (Stripe's
clock, not ours), asked again with `OVERLAP` seconds to spare: an event in the same second is never missed, and a
row seen twice merges once.

The payment-failed events and the other payment signals keep their own poll (`pulls.poll_events`, cursor in the
ledger), and a `charge.dispute.created`, which names a charge and not an invoice, is looked up to its invoice here
(`disputes_with_invoices`: one `GET /v1/charges/{id}` per dispute, a few a month).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping, Sequence
from typing import Any
from zoneinfo import ZoneInfo

from dunning.config import Source
from dunning.ingest.sources.base import FetchedBack, Notification, Pull, Signals
from dunning.ingest.sources.stripe import invoice_row

OVERLAP = 120  # seconds asked again before the cursor
DISPUTE_OPENED = "charge.dispute.created"


class StripeSource:
    name = "stripe"
    incremental = True

    def __init__(self, settings: Source, environ: Mapping[str, str] = os.environ) -> None:
        from dunning.ingest.sources import stripe_api

        self.settings = settings
        self._api = stripe_api
        self._key = stripe_api.api_key(settings, environ)

    def _client(self) -> Any:
        return self._api.client(self.settings, self._key)

    def pull(self, cursor: str | None, zone: ZoneInfo) -> Pull:
        started = int(dt.datetime.now(dt.UTC).timestamp())
        if cursor is None:
            with self._api.api_errors(self.settings, "pulling invoices (GET /v1/invoices)"):
                rows = [invoice_row(invoice, zone) for invoice in self._api.invoices(self._client())]
            return Pull(rows, complete=True, cursor=str(started - OVERLAP))
        since = max(0, int(cursor) - OVERLAP)
        with self._api.api_errors(self.settings, "pulling changed invoices (GET /v1/events?type=invoice.*)"):
            events = self._api.invoice_events(self._client(), since)
        newest: dict[str, dict[str, Any]] = {}
        deleted: list[str] = []
        for event in events:  # newest first: the first event of an invoice is its state now
            obj = (event.get("data") or {}).get("object")
            if not isinstance(obj, dict) or not isinstance(obj.get("id"), str) or obj["id"] in newest:
                continue
            newest[obj["id"]] = obj
            if event.get("type") == "invoice.deleted":
                deleted.append(obj["id"])
        created = [e["created"] for e in events if isinstance(e.get("created"), int)]
        rows = [invoice_row(obj, zone) for key, obj in newest.items() if key not in deleted]
        return Pull(rows, complete=False, cursor=str(max([int(cursor), *created])), deleted=deleted)

    def signals(self, cursor: str | None, since: dt.datetime) -> Signals:
        raise NotImplementedError("Stripe's events are polled by `pulls.poll_events`")

    def fetch_back(self, notifications: Sequence[Notification], zone: ZoneInfo) -> FetchedBack:
        return FetchedBack(ignored=len(notifications))  # Stripe's webhooks are signed events, stored as they are

    def disputes_with_invoices(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each `charge.dispute.created` naming no invoice, with the invoice (and customer) of its charge filled in
        from the API, so the dispute excludes its invoice; the other events as they are."""
        out = []
        with self._api.api_errors(self.settings, "looking up a disputed charge's invoice (GET /v1/charges/{id})"):
            for event in events:
                obj = (event.get("data") or {}).get("object")
                if event.get("type") != DISPUTE_OPENED or not isinstance(obj, dict) or obj.get("invoice"):
                    out.append(event)
                    continue
                charge = obj.get("charge")
                charge_id = charge.get("id") if isinstance(charge, dict) else charge
                invoice, customer = self._api.charge_invoice(self._client(), charge_id) if isinstance(
                    charge_id, str) else (None, None)  # fmt: skip
                if invoice is not None:
                    obj = {**obj, "invoice": invoice, **({"customer": customer} if customer else {})}
                    event = {**event, "data": {**event["data"], "object": obj}}
                out.append(event)
        return out

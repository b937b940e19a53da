"""A fake of the Stripe API for tests: `/v1/invoices` and `/v1/events` on 127.0.0.1, speaking Stripe's list protocol.

What it does as Stripe does (https://docs.stripe.com/api/pagination):

- bearer auth: `Authorization: Bearer <key>`; any other key is answered 401
  with Stripe's error shape (`{"error": {"type": ..., "message": ...}}`); its
  message quotes the key it was given, whole, so a test can prove the pipeline
  never shows the server's text;
- lists newest first, in the list envelope (`object`, `url`, `has_more`,
  `data`); `limit` (1..100, default 10), `starting_after` (the page after an
  id), `ending_before` (the page just before an id, i.e. newer, still newest
  first), an unknown cursor answered 400 naming the parameter;
- `/v1/events` filters on `types[]`, `type` (with Stripe's wildcard: `invoice.*`) and `created[gte|gt|lte|lt]`;
- `/v1/charges/{id}` answers a charge from `charges` (its `invoice` and `customer`), 404 for another id;
- `rate_limited = N` answers the next N requests 429 (`rate_limit`), without
  `Stripe-Should-Retry`; `malformed = True` answers 200 with a body that is not
  JSON.

Writes, for fee invoices (`dunning.fees.posting`), as Stripe takes them (form-encoded bodies, `metadata[k]=v`):
`POST /v1/invoices` (a draft; `customer`, `collection_method`, `days_until_due`, `pending_invoice_items_behavior`,
`metadata`), `POST /v1/invoiceitems` (`invoice=` attaches it to a draft only, as Stripe does), `POST
/v1/invoices/{id}/finalize` (the draft becomes `open`, its `amount_due` the sum of its items), `GET
/v1/invoices/{id}`, `GET /v1/invoices?customer=`, `GET /v1/invoiceitems?invoice=`. An `Idempotency-Key` replays
the first answer; `forget_idempotency_keys()` is Stripe pruning them after 24 hours. `drop_after_accept[path] = N`:
the next N POSTs to `path` are carried out and then the connection is closed without an answer (the answer lost
after Stripe accepted the request).

Every request is recorded in `requests` as (path, query parameters, authorization header).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "stripe"
KEY = "sk_test_fake_4eC39HqLyjWDarjtT1zdp7dc"


def fixture_invoice() -> dict[str, Any]:
    """Stripe's own example invoice object (`tests/fixtures/stripe/invoices_list.json`)."""
    return copy.deepcopy(json.loads((FIXTURES / "invoices_list.json").read_text())["data"][0])


def stripe_invoice(n: int, as_of: dt.datetime, **overrides: Any) -> dict[str, Any]:
    """Stripe's example invoice as the n-th of an account: its own id, customer (two invoices each), amount, dates;
    due five days before `as_of` (stage day3 of the default policy), open, sent by email."""
    invoice = fixture_invoice()
    created = int((as_of - dt.timedelta(days=35)).timestamp()) + n  # a later n is newer
    amount = 1000 + 37 * n
    invoice.update(
        id=f"in_fake{n:05d}",
        customer=f"cus_fake{n // 2:04d}",
        customer_email=f"customer{n // 2}@example.com",
        customer_name=f"Customer {n // 2}",
        currency="eur" if n % 3 == 0 else "usd",
        amount_due=amount,
        amount_paid=0,
        amount_remaining=amount,
        status="open",
        collection_method="send_invoice",
        auto_advance=True,
        created=created,
        period_start=created,
        period_end=created,
        due_date=int((as_of - dt.timedelta(days=5)).timestamp()),
    )
    invoice.update(overrides)
    return invoice


def payment_failed_event(event_id: str, invoice: dict[str, Any], created: dt.datetime) -> dict[str, Any]:
    """Stripe's example event (`tests/fixtures/stripe/event.json`) as an `invoice.payment_failed` for `invoice`."""
    event = json.loads((FIXTURES / "event.json").read_text())
    event.update(id=event_id, type="invoice.payment_failed", created=int(created.timestamp()), data={"object": invoice})
    return event


def _error(kind: str, message: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"type": kind, "message": message}
    if code:
        error["code"] = code
    if param:
        error["param"] = param
    return {"error": error}


class FakeStripe:
    """The fake Stripe API; a context manager that serves on 127.0.0.1 at a free port (`url`)."""

    def __init__(self, key: str = KEY) -> None:
        self.key = key
        self.invoices: list[dict[str, Any]] = []  # any order: served newest `created` first
        self.events: list[dict[str, Any]] = []
        self.charges: dict[str, dict[str, Any]] = {}
        self._updates = 0
        self.rate_limited = 0
        self.malformed = False
        self.requests: list[tuple[str, dict[str, str], str]] = []
        self.invoice_items: list[dict[str, Any]] = []
        self.idempotent: dict[str, tuple[int, Any]] = {}
        self.drop_after_accept: dict[str, int] = {}
        self.posts: list[tuple[str, dict[str, str]]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeStripe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def update_invoices(self, invoices: list[dict[str, Any]]) -> None:
        """The account's invoices change as Stripe changes them: each changed or new invoice also gets its
        `invoice.updated` event now (what an incremental pull reads)."""
        now = int(time.time())
        with self._lock:
            old = {i["id"]: i for i in self.invoices}
            for invoice in invoices:
                if old.get(invoice["id"]) != invoice:
                    self._updates += 1
                    self.events.append({"object": "event", "id": f"evt_upd_{self._updates:05d}",
                                        "type": "invoice.updated", "created": now,
                                        "data": {"object": copy.deepcopy(invoice)}})  # fmt: skip
            self.invoices = invoices

    def requests_to(self, path: str) -> list[dict[str, str]]:
        with self._lock:
            return [params for p, params, _ in self.requests if p == path]

    # what the API answers: (status, body, extra headers)
    def answer(self, path: str, params: dict[str, str], authorization: str) -> tuple[int, Any]:
        with self._lock:
            self.requests.append((path, params, authorization))
            if self.rate_limited > 0:
                self.rate_limited -= 1
                return 429, _error(
                    "invalid_request_error", "Too many requests hit the API too quickly.", code="rate_limit"
                )
            if self.malformed:
                return 200, "<html>502 Bad Gateway</html>"
        if authorization != f"Bearer {self.key}":
            given = authorization.removeprefix("Bearer ")
            return 401, _error("invalid_request_error", f"Invalid API Key provided: {given}")
        if path.startswith("/v1/invoices/"):
            found = [i for i in self.invoices if i["id"] == path.removeprefix("/v1/invoices/")]
            return (200, found[0]) if found else (404, _error("invalid_request_error", "No such invoice"))
        if path == "/v1/invoiceitems":
            with self._lock:
                items = [i for i in self.invoice_items if i.get("invoice") == params.get("invoice")]
            return self._page(path, sorted(items, key=lambda o: (o["created"], o["id"]), reverse=True), params)
        if path == "/v1/invoices":
            items = [i for i in self.invoices if "customer" not in params or _customer_id(i) == params["customer"]]
        elif path == "/v1/events":
            types = {v for k, v in params.items() if k.startswith("types[")} or (
                {params["type"]} if "type" in params else None
            )  # Stripe's `types[]` (up to 20), or one `type`
            items = [e for e in self.events if _created_matches(e, params) and _type_matches(e["type"], types)]
        elif path.startswith("/v1/charges/"):
            charge = self.charges.get(path.removeprefix("/v1/charges/"))
            if charge is None:
                return 404, _error("invalid_request_error", "No such charge", "resource_missing", "id")
            return 200, {"object": "charge", "id": path.removeprefix("/v1/charges/"), **charge}
        else:
            return 404, _error("invalid_request_error", f"Unrecognized request URL (GET: {path})")
        return self._page(path, sorted(items, key=lambda o: (o["created"], o["id"]), reverse=True), params)

    def forget_idempotency_keys(self) -> None:
        """Stripe prunes idempotency keys after 24 hours: a request repeated later is carried out again."""
        with self._lock:
            self.idempotent.clear()

    def fee_invoices(self) -> list[dict[str, Any]]:
        with self._lock:
            return [i for i in self.invoices if "dunning_fee_invoice" in (i.get("metadata") or {})]

    def items_of(self, invoice_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return [i for i in self.invoice_items if i.get("invoice") == invoice_id]

    def post(self, path: str, form: dict[str, str], authorization: str, key: str | None) -> tuple[int, Any, bool]:
        """(status, body, drop): the answer to a POST, and whether the connection is closed instead of answering."""
        if authorization != f"Bearer {self.key}":
            return 401, _error("invalid_request_error", "Invalid API Key provided"), False
        with self._lock:
            self.posts.append((path, form))
            if key is not None and key in self.idempotent:
                status, body = self.idempotent[key]
                return status, body, False
            status, body = self._write(path, form)
            if key is not None:
                self.idempotent[key] = (status, copy.deepcopy(body))
            drop = self.drop_after_accept.get(path, 0) > 0
            if drop:
                self.drop_after_accept[path] -= 1
        return status, body, drop

    def _write(self, path: str, form: dict[str, str]) -> tuple[int, Any]:
        metadata = {k[len("metadata[") : -1]: v for k, v in form.items() if k.startswith("metadata[")}
        now = int(dt.datetime.now(dt.UTC).timestamp())
        if path == "/v1/invoices":
            customer = form.get("customer")
            known = next((i for i in self.invoices if _customer_id(i) == customer), None)
            invoice = {
                "id": f"in_fee{len(self.invoices):05d}", "object": "invoice", "customer": customer,
                "customer_email": known.get("customer_email") if known else None,
                "customer_name": known.get("customer_name") if known else None, "currency": None,
                "amount_due": 0, "amount_paid": 0, "amount_remaining": 0, "status": "draft",
                "collection_method": form.get("collection_method"),
                "days_until_due": int(form.get("days_until_due", 0)),
                "pending_invoice_items_behavior": form.get("pending_invoice_items_behavior"), "auto_advance": False,
                "metadata": metadata, "created": now, "period_start": now, "period_end": now, "due_date": None,
                "description": form.get("description"),
            }  # fmt: skip
            self.invoices.append(invoice)
            return 200, invoice
        if path == "/v1/invoiceitems":
            invoice = next((i for i in self.invoices if i["id"] == form.get("invoice")), None)
            if invoice is None or invoice["status"] != "draft":
                return 400, _error("invalid_request_error", "Invoice items can only be added to draft invoices",
                                   "invoice_not_editable", "invoice")  # fmt: skip
            item = {"id": f"ii_fake{len(self.invoice_items):05d}", "object": "invoiceitem", "invoice": invoice["id"],
                    "customer": form.get("customer"), "amount": int(form["amount"]), "currency": form.get("currency"),
                    "description": form.get("description"), "metadata": metadata, "created": now}  # fmt: skip
            self.invoice_items.append(item)
            invoice["currency"] = item["currency"]
            return 200, item
        if path.startswith("/v1/invoices/") and path.endswith("/finalize"):
            invoice_id = path.removeprefix("/v1/invoices/").removesuffix("/finalize")
            invoice = next((i for i in self.invoices if i["id"] == invoice_id), None)
            if invoice is None or invoice["status"] != "draft":
                return 400, _error("invalid_request_error", "This invoice is already finalized", "invoice_not_editable")
            total = sum(i["amount"] for i in self.invoice_items if i["invoice"] == invoice_id)
            invoice.update(status="open", amount_due=total, amount_remaining=total,
                           due_date=now + 86400 * int(invoice["days_until_due"] or 0))  # fmt: skip
            return 200, invoice
        return 404, _error("invalid_request_error", f"Unrecognized request URL (POST: {path})")

    @staticmethod
    def _page(path: str, items: list[dict[str, Any]], params: dict[str, str]) -> tuple[int, Any]:
        try:
            limit = int(params.get("limit", "10"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            return 400, _error("invalid_request_error", "Invalid integer", "parameter_invalid_integer", "limit")
        ids = [o["id"] for o in items]
        for cursor in ("starting_after", "ending_before"):
            if cursor in params and params[cursor] not in ids:
                missing = f"No such object: '{params[cursor]}'"
                return 400, _error("invalid_request_error", missing, "resource_missing", cursor)
        if "ending_before" in params:
            end = ids.index(params["ending_before"])
            start = max(0, end - limit)
            page, more = items[start:end], start > 0
        else:
            start = ids.index(params["starting_after"]) + 1 if "starting_after" in params else 0
            page, more = items[start : start + limit], start + limit < len(items)
        return 200, {"object": "list", "url": path, "has_more": more, "data": page}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
                parts = urlsplit(self.path)
                params = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
                status, body = fake.answer(parts.path, params, self.headers.get("Authorization", ""))
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Request-Id", "req_fake")
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
                length = int(self.headers.get("Content-Length") or 0)
                form = {k: v[-1] for k, v in parse_qs(self.rfile.read(length).decode(), keep_blank_values=True).items()}
                status, body, drop = fake.post(
                    urlsplit(self.path).path, form, self.headers.get("Authorization", ""),
                    self.headers.get("Idempotency-Key"),
                )  # fmt: skip
                if drop:  # carried out, then the answer is lost: the connection closes without a byte
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Request-Id", "req_fake")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: the tests read `requests`
                pass

        return Handler


def _customer_id(invoice: dict[str, Any]) -> object:
    customer = invoice.get("customer")
    return customer.get("id") if isinstance(customer, dict) else customer


def _type_matches(kind: str, types: set[str] | None) -> bool:
    """Stripe's `type` filter: an exact type, or a wildcard such as `invoice.*`."""
    if types is None:
        return True
    return any(kind == t or (t.endswith(".*") and kind.startswith(t[:-1])) for t in types)


def _created_matches(obj: dict[str, Any], params: dict[str, str]) -> bool:
    created = obj["created"]
    bounds = {
        "gte": lambda v: created >= v,
        "gt": lambda v: created > v,
        "lte": lambda v: created <= v,
        "lt": lambda v: created < v,
    }
    return all(test(int(params[f"created[{op}]"])) for op, test in bounds.items() if f"created[{op}]" in params)


def full_sync_due(deployment: Any, kind: str = "stripe") -> None:
    """The next pull of the deployment's source is complete, as when `source.full_sync_hours` has passed: the mirror
    (`dunning.ingest.sources.mirror`) is removed."""
    (deployment.home / "sources" / kind / "mirror.parquet").unlink(missing_ok=True)

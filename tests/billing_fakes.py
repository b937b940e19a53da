"""Fakes of the Chargebee (v2) and Recurly (v3, v2021-02-25) APIs for tests, on 127.0.0.1, speaking each vendor's
wire protocol as the shared fixtures document it (`tests/fixtures/chargebee/README.md`, `.../recurly/README.md`):
HTTP Basic with the API key as the user name, each vendor's list envelope and pagination, its error bodies, its
filters for incremental pulls. They count every request (`requests`: method, path, query parameters), so a test
can prove an incremental pull asks only for what changed.

These are fakes, not the vendors: only the endpoints and parameters the billing sources use are served.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CHARGEBEE_KEY = "test_cbKey_fake_7Hq2LmN9"
RECURLY_KEY = "rk_fake_3f9a8b7c6d5e4f"


class _FakeServer:
    key = ""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.rate_limited = 0
        self.retry_after: str | None = "30"
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def requests_to(self, path: str) -> list[dict[str, str]]:
        with self.lock:
            return [params for _, p, params in self.requests if p == path]

    def answer(self, method: str, path: str, params: dict[str, str], headers: Any) -> tuple[int, Any, dict[str, str]]:
        raise NotImplementedError

    def authorized(self, header: str) -> bool:
        return header == "Basic " + base64.b64encode(f"{self.key}:".encode()).decode()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
                parts = urlsplit(self.path)
                params = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
                with fake.lock:
                    fake.requests.append(("GET", parts.path, params))
                status, body, headers = fake.answer("GET", parts.path, params, self.headers)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("X-Request-Id", "req-fake")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        return Handler


# --- Chargebee ----------------------------------------------------------------------------------------------------


def chargebee_fixture(name: str) -> Any:
    return json.loads((FIXTURES / "chargebee" / name).read_text())


def chargebee_invoice(n: int, as_of: dt.datetime, **overrides: Any) -> dict[str, Any]:
    """The fixture's `payment_due` invoice (1034) as the n-th of a site: its own id, customer (two invoices each),
    amount; due five days before `as_of` (stage day3 of the default policy)."""
    invoice = copy.deepcopy(chargebee_fixture("invoices_list.json")["list"][1]["invoice"])
    amount = 1000 + 37 * n
    due = int((as_of - dt.timedelta(days=5)).timestamp())
    invoice.update(id=f"cb_inv_{n:04d}", customer_id=f"cb_cus_{n // 2:03d}", total=amount, amount_due=amount,
                   amount_paid=0, date=due, due_date=due, updated_at=due + n, status="payment_due")  # fmt: skip
    invoice.update(overrides)
    return invoice


def chargebee_customer(customer_id: str, **overrides: Any) -> dict[str, Any]:
    customer = copy.deepcopy(chargebee_fixture("customer_retrieve.json")["customer"])
    number = customer_id.rsplit("_", 1)[-1]
    customer.update(id=customer_id, email=f"billing{number}@example.com", company=f"Company {number}")
    customer.update(overrides)
    return customer


class FakeChargebee(_FakeServer):
    """`GET /api/v2/invoices|customers|events|events/{id}|disputes|transactions/{id}` of one site."""

    key = CHARGEBEE_KEY

    def __init__(self) -> None:
        super().__init__()
        self.invoices: dict[str, dict[str, Any]] = {}
        self.customers: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.disputes: list[dict[str, Any]] | None = []  # None: the site answers 404 (no disputes API)
        self.transactions: dict[str, dict[str, Any]] = {}

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v2"

    def put(self, invoice: dict[str, Any], *, at: int | None = None) -> None:
        """Add or change an invoice as Chargebee does: `updated_at` moves to `at` (default: now + 1 s past the last)."""
        with self.lock:
            stamp = at if at is not None else max([i["updated_at"] for i in self.invoices.values()] or [0]) + 1
            self.invoices[invoice["id"]] = {**invoice, "updated_at": max(stamp, invoice.get("updated_at", 0))}
            customer = invoice["customer_id"]
            self.customers.setdefault(customer, chargebee_customer(customer))

    def delete(self, invoice_id: str, *, trace: bool = True) -> None:
        """Delete an invoice: with `trace`, listed with `deleted: true` (include_deleted); without, gone."""
        with self.lock:
            if trace:
                invoice = self.invoices[invoice_id]
                stamp = max(i["updated_at"] for i in self.invoices.values()) + 1
                self.invoices[invoice_id] = {**invoice, "deleted": True, "updated_at": stamp}
            else:
                del self.invoices[invoice_id]

    @staticmethod
    def _error(status: int, code: str, kind: str = "invalid_request") -> tuple[int, Any, dict[str, str]]:
        return status, {"message": f"fake: {code}", "type": kind, "api_error_code": code}, {}

    @staticmethod
    def _page(items: list[dict[str, Any]], key: str, params: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
        limit = int(params.get("limit", "10"))
        start = int(json.loads(params["offset"])[0]) if "offset" in params else 0
        body: dict[str, Any] = {"list": [{key: item} for item in items[start : start + limit]]}
        if start + limit < len(items):
            body["next_offset"] = json.dumps([str(start + limit)])
        return 200, body, {}

    def answer(self, method: str, path: str, params: dict[str, str], headers: Any) -> tuple[int, Any, dict[str, str]]:
        with self.lock:
            if self.rate_limited > 0:
                self.rate_limited -= 1
                status, body, _ = self._error(429, "api_request_limit_exceeded", "operation_failed")
                return status, body, {"Retry-After": self.retry_after} if self.retry_after else {}
            if not self.authorized(headers.get("Authorization", "")):
                return 401, {"message": "Sorry, authentication failed. Invalid api key", "type": "untyped",
                             "api_error_code": "api_authentication_failed"}, {}  # fmt: skip
            return self._route(path, params)

    def _route(self, path: str, params: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
        if path == "/api/v2/invoices":
            items = [
                i for i in self.invoices.values() if params.get("include_deleted") == "true" or not i.get("deleted")
            ]
            if "updated_at[after]" in params:
                items = [i for i in items if i["updated_at"] > int(params["updated_at[after]"])]
            items.sort(key=lambda i: (i["updated_at"], i["id"]) if "sort_by[asc]" in params else (i["id"],))
            return self._page(copy.deepcopy(items), "invoice", params)
        if path == "/api/v2/customers":
            wanted = json.loads(params.get("id[in]", "null"))
            items = [c for c in self.customers.values() if wanted is None or c["id"] in wanted]
            return self._page(copy.deepcopy(sorted(items, key=lambda c: c["id"])), "customer", params)
        if path == "/api/v2/events":
            kinds = json.loads(params.get("event_type[in]", "null"))
            items = [e for e in self.events if (kinds is None or e["event_type"] in kinds)
                     and e["occurred_at"] > int(params.get("occurred_at[after]", "0"))]  # fmt: skip
            return self._page(copy.deepcopy(sorted(items, key=lambda e: e["occurred_at"])), "event", params)
        if path.startswith("/api/v2/events/"):
            found = [e for e in self.events if e["id"] == path.rsplit("/", 1)[-1]]
            return (200, {"event": copy.deepcopy(found[0])}, {}) if found else self._error(404, "resource_not_found")
        if path == "/api/v2/disputes":
            if self.disputes is None:
                return self._error(404, "resource_not_found")
            return self._page(copy.deepcopy(self.disputes), "dispute", params)
        if path.startswith("/api/v2/transactions/"):
            found = self.transactions.get(path.rsplit("/", 1)[-1])
            return (200, {"transaction": copy.deepcopy(found)}, {}) if found else self._error(404, "resource_not_found")
        return self._error(404, "resource_not_found")


def chargebee_event(event_id: str, kind: str, invoice: dict[str, Any], occurred_at: dt.datetime) -> dict[str, Any]:
    """The fixture's v2 `payment_failed` event as `kind` about `invoice`."""
    event = chargebee_fixture("event_payment_failed.json")
    event.update(id=event_id, event_type=kind, occurred_at=int(occurred_at.timestamp()))
    event["content"]["invoice"] = copy.deepcopy(invoice)
    event["content"]["customer"] = chargebee_customer(invoice["customer_id"])
    event["content"]["transaction"].update(customer_id=invoice["customer_id"],
                                           linked_invoices=[{"invoice_id": invoice["id"]}])  # fmt: skip
    return event


# --- Recurly ------------------------------------------------------------------------------------------------------


def recurly_fixture(name: str) -> Any:
    return json.loads((FIXTURES / "recurly" / name).read_text())


def _iso(seconds: int) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def recurly_invoice(n: int, as_of: dt.datetime, **overrides: Any) -> dict[str, Any]:
    """The fixture's past_due invoice (1034) as the n-th of a site: number `20000 + n`, account `acct-{n // 2}` (two
    invoices each), balance `10.00 + 0.37 n` in its currency; due five days before `as_of`."""
    invoice = copy.deepcopy(recurly_fixture("invoices_list.json")["data"][1])
    account = n // 2
    invoice["account"].update(id=f"racct{account:04d}", code=f"acct-{account}", email=f"ap{account}@example.com")
    due = _iso(int((as_of - dt.timedelta(days=5)).timestamp()))
    total = round(10 + 0.37 * n, 2)  # a float here is JSON text `10.37` on the wire, read back as a Decimal
    invoice.update(id=f"rinv{n:05d}", number=str(20000 + n), created_at=due, due_at=due, updated_at=due,
                   total=total, subtotal=total, balance=total, paid=0.0, state="past_due")  # fmt: skip
    invoice.update(overrides)
    return invoice


def recurly_account(account_id: str, code: str, **overrides: Any) -> dict[str, Any]:
    account = copy.deepcopy(recurly_fixture("account.json"))
    account.update(id=account_id, code=code, email=f"ap{code.rsplit('-', 1)[-1]}@example.com")
    account.update(overrides)
    return account


class FakeRecurly(_FakeServer):
    """`GET /invoices`, `/invoices/number-{n}`, `/accounts?ids=`, `/transactions`, `/transactions/uuid-{uuid}`.
    Amounts are served as JSON decimals (`total: 10.37`), exactly as given (text in, a bare number out)."""

    key = RECURLY_KEY

    def __init__(self) -> None:
        super().__init__()
        self.invoices: dict[str, dict[str, Any]] = {}
        self.accounts: dict[str, dict[str, Any]] = {}
        self.transactions: dict[str, dict[str, Any]] = {}
        self.reset_at: int | None = None

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def put(self, invoice: dict[str, Any], *, at: int | None = None) -> None:
        with self.lock:
            stamps = [int(dt.datetime.fromisoformat(i["updated_at"].replace("Z", "+00:00")).timestamp())
                      for i in self.invoices.values()]  # fmt: skip
            stamp = at if at is not None else max(stamps or [0]) + 1
            self.invoices[invoice["number"]] = {**invoice, "updated_at": _iso(stamp)}
            mini = invoice["account"]
            self.accounts.setdefault(mini["id"], recurly_account(mini["id"], mini["code"]))

    def _error(self, status: int, kind: str, headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
        return status, {"error": {"type": kind, "message": f"fake: {kind}", "params": []}}, headers or {}

    @staticmethod
    def _page(path: str, items: list[dict[str, Any]], params: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
        limit = int(params.get("limit", "20"))
        start = int(params.get("cursor", "0"))
        more = start + limit < len(items)
        query = "&".join(f"{k}={v}" for k, v in params.items() if k != "cursor")
        following = f"{path}?cursor={start + limit}&{query}" if more else None
        return 200, {"object": "list", "has_more": more, "next": following, "data": items[start : start + limit]}, {}

    def answer(self, method: str, path: str, params: dict[str, str], headers: Any) -> tuple[int, Any, dict[str, str]]:
        with self.lock:
            if self.rate_limited > 0:
                self.rate_limited -= 1
                reset = {"X-RateLimit-Reset": str(self.reset_at)} if self.reset_at else {}
                return self._error(429, "rate_limited", {"X-RateLimit-Limit": "1000", "X-RateLimit-Remaining": "0",
                                                          **reset})  # fmt: skip
            if not self.authorized(headers.get("Authorization", "")):
                return self._error(401, "unauthorized")
            if headers.get("Accept") != "application/vnd.recurly.v2021-02-25":
                return self._error(406, "invalid_api_version")
            return self._route(path, params)

    @staticmethod
    def _since(items: list[dict[str, Any]], params: dict[str, str]) -> list[dict[str, Any]]:
        if "begin_time" in params:
            items = [i for i in items if i["updated_at"] >= params["begin_time"]]
        return sorted(items, key=lambda i: (i["updated_at"], i["id"]))

    def _route(self, path: str, params: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
        if path == "/invoices":
            return self._page(path, copy.deepcopy(self._since(list(self.invoices.values()), params)), params)
        if path.startswith("/invoices/number-"):
            found = self.invoices.get(path.removeprefix("/invoices/number-"))
            return (200, copy.deepcopy(found), {}) if found else self._error(404, "not_found")
        if path == "/accounts":
            wanted = params["ids"].split(",") if "ids" in params else None
            items = [a for i, a in sorted(self.accounts.items()) if wanted is None or i in wanted]
            return self._page(path, copy.deepcopy(items), params)
        if path == "/transactions":
            return self._page(path, copy.deepcopy(self._since(list(self.transactions.values()), params)), params)
        if path.startswith("/transactions/uuid-"):
            uuid = path.removeprefix("/transactions/uuid-")
            found = [t for t in self.transactions.values() if t["uuid"] == uuid]
            return (200, copy.deepcopy(found[0]), {}) if found else self._error(404, "not_found")
        return self._error(404, "not_found")


def recurly_transaction(txn_id: str, status: str, invoice: dict[str, Any], at: dt.datetime) -> dict[str, Any]:
    """The fixture's declined transaction as `status` on `invoice` (its amount the invoice's balance)."""
    transaction = copy.deepcopy(recurly_fixture("invoices_list.json")["data"][1]["transactions"][0])
    transaction.update(id=txn_id, uuid=f"{txn_id}uuid", status=status, amount=invoice["balance"],
                       currency=invoice["currency"], account=copy.deepcopy(invoice["account"]),
                       updated_at=_iso(int(at.timestamp())), created_at=_iso(int(at.timestamp())))  # fmt: skip
    transaction["invoice"].update(id=invoice["id"], number=invoice["number"], state=invoice["state"])
    return transaction

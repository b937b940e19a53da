"""Recurly as the billing source (`source: {kind: recurly}`) through our own client, end to end through `dunning
run` against the on-the-wire fake (`tests/billing_fakes.py`): amounts in major units into minor units through
Decimal and each currency's exponent, states mapped, accounts as lists, an incremental pull asking only for changes,
transactions as payment signals (`event:recurly:{id}`), and one line (exit 7) naming Recurly on a failure."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from dunning.config import Source
from dunning.errors import BillingSourceFailed
from dunning.ingest.sources.base import Notification
from dunning.ingest.sources.normalize import minor_units
from dunning.ingest.sources.recurly import RecurlySource, invoice_row
from dunning.ingest.sources.recurly_api import RecurlyClient
from tests.billing_fakes import RECURLY_KEY, FakeRecurly, recurly_fixture, recurly_invoice, recurly_transaction
from tests.conftest import Deployment

AS_OF = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
UTC = ZoneInfo("UTC")
ENV = {"RECURLY_API_KEY": RECURLY_KEY}


def at(hours: float = 0) -> str:
    return (AS_OF + dt.timedelta(hours=hours)).isoformat()


@pytest.fixture
def fake():
    with FakeRecurly() as server:
        yield server


def recurly_home(deployment: Deployment, fake: FakeRecurly, monkeypatch) -> Deployment:
    deployment.home.mkdir(parents=True, exist_ok=True)
    (deployment.home / "config.yaml").write_text(
        f"source: {{kind: recurly, api_base: '{fake.api_base}', timeout_seconds: 5}}\n"
    )
    monkeypatch.setenv("RECURLY_API_KEY", RECURLY_KEY)
    return deployment


def test_amounts_go_through_decimal_and_the_currency_exponent_never_a_float():
    assert minor_units(Decimal("10.37"), "USD") == 1037
    assert minor_units(Decimal("1500"), "JPY") == 1500 and minor_units(Decimal("1500.5"), "JPY") is None
    assert minor_units(Decimal("1.234"), "KWD") == 1234
    assert minor_units(Decimal("0.1") + Decimal("0.2"), "EUR") == 30, "0.1 + 0.2 as a float is 0.30000000000000004"
    assert minor_units(0.3, "EUR") is None, "a float is refused"
    assert minor_units(Decimal("1.005"), "EUR") is None, "more digits than the currency has: rejected, not rounded"
    body = b'{"balance": 19.99}'
    assert minor_units(json.loads(body, parse_float=Decimal)["balance"], "USD") == 1999


def test_the_fixture_invoices_and_the_states_map_to_snapshot_rows():
    paid, due = recurly_fixture("invoices_list.json")["data"]
    account = recurly_fixture("account.json")
    row = invoice_row({**due, "paid": Decimal("2.5"), "balance": Decimal("7.5")}, account, UTC)
    amounts = (row["invoice_id"], row["customer_id"], row["amount_due"], row["amount_paid"])
    assert amounts == ("1034", "verena", "1000", "250")
    assert (row["status"], row["customer_email"], row["customer_cc"]) == ("open", "verena@example.com",
                                                                          "billing@example.com")  # fmt: skip
    assert invoice_row(paid, None, UTC)["status"] == "paid"
    states = {s: invoice_row({**due, "state": s}, None, UTC)["status"] for s in
              ("open", "pending", "processing", "past_due", "paid", "failed", "voided")}  # fmt: skip
    assert states == {"open": "open", "pending": "open", "processing": "open", "past_due": "open", "paid": "paid",
                      "failed": "uncollectible", "voided": "void"}  # fmt: skip
    assert invoice_row({**due, "state": "closed", "balance": 0}, None, UTC)["status"] == "paid"


@pytest.mark.slow
def test_runs_remind_the_right_invoices_once_and_pull_only_changes(deployment, fake, monkeypatch):
    for n in range(4):
        fake.put(recurly_invoice(n, AS_OF), at=1_790_000_000 + 1000 * n)
    fake.put(recurly_invoice(4, AS_OF, currency="JPY", total=1500.0, balance=1500.0), at=1_790_004_000)
    fake.put(recurly_invoice(5, AS_OF, state="paid", balance=0.0, paid=11.85), at=1_790_005_000)
    fake.put(recurly_invoice(6, AS_OF, type="credit"), at=1_790_006_000)  # not a receivable
    recurly_home(deployment, fake, monkeypatch)

    code, out, err = deployment.cli("run", "--as-of", at())
    assert code == 0, err
    assert "6 invoices accepted, 0 rejected" in out
    keys = sorted(r["idempotency_key"] for r in deployment.ledger("status = 'sent'"))
    assert keys == [f"dunning:{20000 + n}:1:day3" for n in range(5)]
    yen = [m for m in deployment.outbox() if "20004" in m["X-Dunning-Keys"]][0]
    assert "1,500" in yen.get_body(("plain",)).get_content() or "1500" in yen.get_body(("plain",)).get_content()
    assert len(fake.requests_to("/accounts")) == 1, "accounts as one list, not one request per invoice"

    fake.put({**fake.invoices["20001"], "state": "paid", "paid": 10.37, "balance": 0.0})
    code, out, err = deployment.cli("run", "--as-of", at(1))
    assert code == 0, err
    first, second = fake.requests_to("/invoices")
    assert "begin_time" not in first and second["begin_time"] >= "2026-09-20" and second["sort"] == "updated_at"
    assert second["order"] == "asc"
    assert "reminders newly due: 0" in out and len(deployment.outbox()) == 3
    assert RECURLY_KEY not in out + err


@pytest.mark.slow
def test_a_declined_transaction_gives_one_notice_and_a_processing_one_makes_keys_wait(deployment, fake, monkeypatch):
    for n in range(4):
        fake.put(recurly_invoice(n, AS_OF, account={**recurly_invoice(n, AS_OF)["account"],
                                                    "id": f"racct{n:04d}", "code": f"acct-{n}"}),
                 at=1_790_000_000 + n)  # fmt: skip
    fake.transactions["t1"] = recurly_transaction("t1", "declined", fake.invoices["20000"], AS_OF)
    fake.transactions["t2"] = recurly_transaction("t2", "processing", fake.invoices["20001"], AS_OF)
    fake.transactions["t3"] = recurly_transaction("t3", "chargeback", fake.invoices["20002"], AS_OF)
    recurly_home(deployment, fake, monkeypatch)
    assert deployment.cli("run", "--as-of", at())[0] == 0
    assert deployment.cli("run", "--as-of", at(1))[0] == 0
    kinds = sorted((m["X-Dunning-Kind"], m["X-Dunning-Keys"]) for m in deployment.outbox())
    assert kinds == [("payment_failed", "event:recurly:t1"), ("reminder", "dunning:20000:1:day3"),
                     ("reminder", "dunning:20003:1:day3")], "20001 in flight, 20002 disputed"  # fmt: skip
    reasons = dict(
        deployment.query(
            "SELECT DISTINCT idempotency_key, reason FROM dunning_audit WHERE "
            "idempotency_key IN ('dunning:20001:1:day3', 'dunning:20002:1:day3')"
        )
    )
    assert reasons == {"dunning:20001:1:day3": "payment_in_flight", "dunning:20002:1:day3": "excluded"}


def test_fetch_back_asks_the_api_for_the_payment_and_the_invoice_a_notification_names(fake):
    fake.put(recurly_invoice(0, AS_OF))
    fake.transactions["t1"] = recurly_transaction("t1", "declined", fake.invoices["20000"], AS_OF)
    source = RecurlySource(Source(kind="recurly", api_base=fake.api_base), ENV)
    notes = [
        Notification("recurly", "n1", {**recurly_fixture("webhook_payment_failed.json"), "uuid": "t1uuid"}),
        Notification(
            "recurly", "n2", {**recurly_fixture("webhook_charge_invoice_created.json"), "invoice_number": 20000}
        ),  # fmt: skip
        Notification("recurly", "n3", recurly_fixture("webhook_account_created.json")),
    ]
    fetched = source.fetch_back(notes, UTC)
    assert [e["id"] for e in fetched.events] == ["recurly:t1"]
    assert [r["invoice_id"] for r in fetched.rows] == ["20000"] and fetched.ignored == 1
    assert [p for _, p, _ in fake.requests] == ["/transactions/uuid-t1uuid", "/invoices/number-20000", "/accounts"]


def test_a_429_names_recurly_the_request_and_x_ratelimit_reset_and_a_bad_version_is_named(fake):
    fake.put(recurly_invoice(0, AS_OF))
    fake.rate_limited, fake.reset_at = 1, int(dt.datetime.now(dt.UTC).timestamp()) + 60
    with pytest.raises(BillingSourceFailed) as caught:
        RecurlySource(Source(kind="recurly", api_base=fake.api_base), ENV).pull(None, UTC)
    line = str(caught.value)
    assert line.startswith(f"GET /invoices: the Recurly API at http://127.0.0.1:{fake.port} failed (HTTP 429, "
                           "rate_limited): rate limited; retry after ")  # fmt: skip
    assert "(X-RateLimit-Reset)" in line and "\n" not in line
    client = RecurlyClient(fake.api_base, RECURLY_KEY, "RECURLY_API_KEY", 5)
    client.session.headers["Accept"] = "application/json"
    with pytest.raises(BillingSourceFailed, match=r"HTTP 406, invalid_api_version\): source.api_base points"):
        client.get("/invoices", None, "GET /invoices")
    with pytest.raises(BillingSourceFailed, match=r"HTTP 401, unauthorized\): the key in \$RECURLY_API_KEY"):
        RecurlySource(Source(kind="recurly", api_base=fake.api_base), {"RECURLY_API_KEY": "wrong"}).pull(None, UTC)

"""Chargebee as the billing source (`source: {kind: chargebee}`), end to end through `dunning run` against the
on-the-wire fake (`tests/billing_fakes.py`), through the official SDK: the right invoices with the right remaining
balances, nothing twice across pulls, an incremental pull that asks only for changes, a full sync that drops a
deleted invoice, payment signals, and one line (exit 7) for an API failure."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import polars as pl
import pytest

from dunning.config import Source
from dunning.errors import BillingSourceFailed
from dunning.ingest.sources import mirror
from dunning.ingest.sources.chargebee import ChargebeeSource, invoice_row
from tests.billing_fakes import CHARGEBEE_KEY, FakeChargebee, chargebee_event, chargebee_fixture, chargebee_invoice
from tests.conftest import Deployment

AS_OF = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
UTC = ZoneInfo("UTC")


def at(hours: float = 0) -> str:
    return (AS_OF + dt.timedelta(hours=hours)).isoformat()


@pytest.fixture
def fake():
    with FakeChargebee() as server:
        yield server


def chargebee_home(deployment: Deployment, fake: FakeChargebee, monkeypatch, extra: str = "") -> Deployment:
    deployment.home.mkdir(parents=True, exist_ok=True)
    (deployment.home / "config.yaml").write_text(
        f"source: {{kind: chargebee, api_base: '{fake.api_base}', timeout_seconds: 5{extra}}}\n"
    )
    monkeypatch.setenv("CHARGEBEE_API_KEY", CHARGEBEE_KEY)
    return deployment


def sent_keys(deployment: Deployment) -> list[str]:
    return sorted(r["idempotency_key"] for r in deployment.ledger("status = 'sent'"))


def test_the_fixture_invoices_map_to_snapshot_rows_with_what_remains():
    paid, due = (entry["invoice"] for entry in chargebee_fixture("invoices_list.json")["list"])
    customer = chargebee_fixture("customer_retrieve.json")["customer"]
    customer["contacts"] = [
        {"id": "c1", "email": "ap@example.com", "send_billing_email": True},
        {"id": "c2", "email": "ceo@example.com", "send_billing_email": False},
    ]
    row = invoice_row({**due, "amount_paid": 300, "amount_due": 700}, customer, UTC)
    assert (row["amount_due"], row["amount_paid"]) == ("1000", "300"), "remaining = Chargebee's amount_due (700)"
    assert (row["status"], row["currency"], row["due_date"]) == ("open", "USD", "2022-07-27")
    assert (row["customer_email"], row["customer_cc"]) == ("verena@example.com", "ap@example.com")
    assert invoice_row(paid, customer, UTC)["status"] == "paid"
    statuses = {s: invoice_row({**due, "status": s}, None, UTC)["status"] for s in
                ("paid", "posted", "payment_due", "not_paid", "voided", "pending")}  # fmt: skip
    assert statuses == {"paid": "paid", "posted": "open", "payment_due": "open", "not_paid": "open",
                        "voided": "void", "pending": "draft"}  # fmt: skip
    assert invoice_row(due, None, UTC)["customer_email"] == "verena@example.com", "billing_address when no customer"


@pytest.mark.slow
def test_runs_remind_the_right_invoices_once_pull_only_changes_and_a_full_sync_drops_a_deleted_one(
    deployment, fake, monkeypatch
):
    for n in range(6):
        fake.put(chargebee_invoice(n, AS_OF), at=1_790_000_000 + 1000 * n)
    fake.put(chargebee_invoice(6, AS_OF, status="paid", amount_paid=1222, amount_due=0), at=1_790_006_000)
    fake.put(chargebee_invoice(7, AS_OF, amount_paid=500, amount_due=759), at=1_790_007_000)  # part paid
    chargebee_home(deployment, fake, monkeypatch)

    code, out, err = deployment.cli("run", "--as-of", at())
    assert code == 0, err
    assert "8 invoices accepted, 0 rejected" in out
    assert sent_keys(deployment) == [f"dunning:cb_inv_{n:04d}:1:day3" for n in (0, 1, 2, 3, 4, 5, 7)]
    part_paid = [m for m in deployment.outbox() if "cb_inv_0007" in m["X-Dunning-Keys"]]
    assert "7.59" in part_paid[0].get_body(("plain",)).get_content(), "the email states what remains"
    full = fake.requests_to("/api/v2/invoices")
    assert len(full) == 1 and "updated_at[after]" not in full[0] and full[0]["include_deleted"] == "true"
    assert len(fake.requests_to("/api/v2/customers")) == 1, "customers as a list, not one request per invoice"

    fake.put({**fake.invoices["cb_inv_0001"], "status": "paid", "amount_paid": 1037, "amount_due": 0})
    fake.delete("cb_inv_0002")  # listed with deleted: true
    code, out, err = deployment.cli("run", "--as-of", at(1))
    assert code == 0, err
    [changes] = fake.requests_to("/api/v2/invoices")[1:]
    assert int(changes["updated_at[after]"]) >= 1_790_007_000 - 120 and changes["sort_by[asc]"] == "updated_at"
    assert "7 invoices accepted" in out, "the paid one is in, the deleted one is out"
    assert len(deployment.outbox()) == 4 and "reminders newly due: 0" in out, "nothing twice across pulls"
    state = mirror.load(deployment.home, "chargebee")
    assert state is not None and sorted(state.rows["invoice_id"]) == [f"cb_inv_{n:04d}" for n in (0, 1, 3, 4, 5, 6, 7)]

    fake.delete("cb_inv_0003", trace=False)  # gone without a trace: only a full sync sees it
    code, out, _ = deployment.cli("run", "--as-of", at(2))
    assert code == 0 and "cb_inv_0003" in mirror.load(deployment.home, "chargebee").rows["invoice_id"].to_list()
    stale = mirror.load(deployment.home, "chargebee")
    mirror.store(deployment.home, "chargebee", stale.rows, stale.cursor, stale.full_at - dt.timedelta(hours=25))
    code, out, err = deployment.cli("run", "--as-of", at(3))
    assert code == 0, err
    assert "updated_at[after]" not in fake.requests_to("/api/v2/invoices")[-1], "full_sync_hours passed: a full pull"
    assert "cb_inv_0003" not in mirror.load(deployment.home, "chargebee").rows["invoice_id"].to_list()
    snapshots = sorted((deployment.home / "snapshots").glob("*-chargebee.parquet"))
    assert len(snapshots) == 4 and pl.read_parquet(snapshots[-1]).height == 6, "each run's snapshot: the mirror"
    assert len(deployment.outbox()) == 4
    assert CHARGEBEE_KEY not in out + err


@pytest.mark.slow
def test_a_payment_failed_event_gives_one_notice_keyed_by_the_vendor(deployment, fake, monkeypatch):
    for n in range(2):
        fake.put(chargebee_invoice(n, AS_OF), at=1_790_000_000 + n)
    fake.events.append(chargebee_event("ev_fail_1", "payment_failed", fake.invoices["cb_inv_0001"], AS_OF))
    chargebee_home(deployment, fake, monkeypatch)
    assert deployment.cli("run", "--as-of", at())[0] == 0
    assert deployment.cli("run", "--as-of", at(1))[0] == 0
    notices = [m["X-Dunning-Keys"] for m in deployment.outbox() if m["X-Dunning-Kind"] == "payment_failed"]
    assert notices == ["event:chargebee:ev_fail_1"], "one notice per event, across two polls"
    assert deployment.query("SELECT cursor FROM source_cursors WHERE source = 'chargebee:events'") == [
        (str(int(AS_OF.timestamp())),)
    ]


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_signals_in_flight_paid_and_disputed_and_a_missing_disputes_api_is_counted(fake):
    for n in range(3):
        fake.put(chargebee_invoice(n, AS_OF), at=1_790_000_000 + n)
    paid = {**fake.invoices["cb_inv_0002"], "status": "paid", "amount_paid": 1074, "amount_due": 0}
    fake.events += [
        chargebee_event("ev_init", "payment_initiated", fake.invoices["cb_inv_0000"], AS_OF),
        chargebee_event("ev_paid", "payment_succeeded", paid, AS_OF),
    ]
    fake.disputes = [{"id": "dp_1", "transaction_id": "txn_9", "customer_id": "cb_cus_000", "status": "in_review",
                      "created_at": 1_790_000_100, "updated_at": 1_790_000_200}]  # fmt: skip
    fake.transactions["txn_9"] = {"id": "txn_9", "linked_invoices": [{"invoice_id": "cb_inv_0001"}]}
    source = ChargebeeSource(Source(kind="chargebee", api_base=fake.api_base), {"CHARGEBEE_API_KEY": CHARGEBEE_KEY})
    signals = source.signals(None, AS_OF - dt.timedelta(days=3))
    kinds = {
        (e["id"], e["type"], e["data"]["object"].get("invoice") or e["data"]["object"]["id"]) for e in signals.events
    }
    assert kinds == {
        ("chargebee:ev_init", "payment_intent.processing", "cb_inv_0000"),
        ("chargebee:ev_paid", "invoice.paid", "cb_inv_0002"),
        ("chargebee:dispute:dp_1:open", "charge.dispute.created", "cb_inv_0001"),
    }
    fake.disputes = None  # this site has no disputes API: unknown, counted, not a failed poll
    assert {e["type"] for e in source.signals(None, AS_OF - dt.timedelta(days=3)).events} == {
        "payment_intent.processing",
        "invoice.paid",
    }
    assert source.unknown == 1


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_429_a_wrong_key_and_an_unreachable_api_are_one_line_naming_chargebee(fake, tmp_path):
    fake.put(chargebee_invoice(0, AS_OF))
    settings = Source(kind="chargebee", api_base=fake.api_base)
    fake.rate_limited = 1
    with pytest.raises(BillingSourceFailed) as caught:
        ChargebeeSource(settings, {"CHARGEBEE_API_KEY": CHARGEBEE_KEY}).pull(None, UTC)
    assert str(caught.value) == (
        f"GET /invoices: the Chargebee API at http://127.0.0.1:{fake.port} failed (HTTP 429, "
        "api_request_limit_exceeded): rate limited; retry after 30 s (Retry-After), or pull less often "
        "(schedule.cron); nothing was stored"
    )
    with pytest.raises(
        BillingSourceFailed, match=r"HTTP 401, api_authentication_failed\): the key in \$CHARGEBEE_API_KEY"
    ):
        ChargebeeSource(settings, {"CHARGEBEE_API_KEY": "wrong_key_123456"}).pull(None, UTC)
    fake.__exit__()
    with pytest.raises(BillingSourceFailed, match="Chargebee API at .* is unreachable"):
        ChargebeeSource(settings, {"CHARGEBEE_API_KEY": CHARGEBEE_KEY}).pull(None, UTC)
    assert not (tmp_path / "sources").exists()

"""The invoice email itself: once per invoice and billing period, never for what was open before it was turned on."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import polars as pl
import pytest

from dunning.email.render import render_for
from tests.conftest import invoice
from tests.ledger_backends import backend_fixture  # noqa: F401

ON = "invoice_emails: {enabled: true}\n"


def config(tmp_path, text: str = ON) -> str:
    path = tmp_path / "invoice-emails.yaml"
    path.write_text(text)
    return str(path)


def issued(invoice_id: str, customer: str = "cus_1", due: str = "2026-11-30", **extra) -> dict:
    """An invoice just finalized: open, due later this month."""
    fields = {"billing_period": "2026-11", **extra}
    return invoice(
        invoice_id=invoice_id, customer_id=customer, customer_email=f"{customer}@example.com", due_date=due, **fields
    )


def invoice_emails(deployment) -> list:
    return [m for m in deployment.outbox() if m["X-Dunning-Kind"] == "invoice"]


def keys(deployment, kind: str = "invoice") -> dict[str, str]:
    return {r["idempotency_key"]: r["status"] for r in deployment.ledger(f"kind = '{kind}'")}


@pytest.mark.slow
def test_off_by_default_nothing_is_recorded(deployment):
    code, _, err = deployment.run([issued("in_1")], "2026-11-05T09:00:00Z")
    assert code == 0, err
    assert keys(deployment) == {} and deployment.outbox() == []


@pytest.mark.slow
def test_turning_it_on_emails_only_invoices_issued_after_and_each_once(deployment, tmp_path):
    settings = config(tmp_path)
    before = [issued("in_old")]
    code, out, err = deployment.run(before, "2026-11-05T09:00:00Z", "--config", settings)
    assert code == 0, err
    assert keys(deployment) == {"invoice:in_old:2026-11": "skipped"}, "open before it was turned on: never emailed"
    assert invoice_emails(deployment) == []

    # the next day three invoices are issued to one customer, one to another: one email each customer
    new = [issued("in_a"), issued("in_b"), issued("in_c"), issued("in_d", customer="cus_2")]
    code, out, err = deployment.run(before + new, "2026-11-06T09:00:00Z", "--config", settings)
    assert code == 0, err
    assert "of which not reminders: invoice 4" in out
    emails = invoice_emails(deployment)
    assert sorted(m["X-Dunning-Keys"] for m in emails) == [
        "invoice:in_a:2026-11,invoice:in_b:2026-11,invoice:in_c:2026-11",
        "invoice:in_d:2026-11",
    ]
    assert keys(deployment) == {
        "invoice:in_old:2026-11": "skipped",
        **{f"invoice:{i}:2026-11": "sent" for i in ("in_a", "in_b", "in_c", "in_d")},
    }
    one = next(m for m in emails if m["To"] == "cus_2@example.com")
    assert "Invoice in_d" in one["Subject"] and "100.00 USD" in one.get_body(("plain",)).get_content()

    # later runs, a payment and a reopening in the same period: never a second invoice email
    paid = [dict(r, status="paid", amount_paid=r["amount_due"]) if r["invoice_id"] == "in_a" else r for r in new]
    deployment.run_in_process(before + paid, "2026-11-07T09:00:00Z", settings)
    code, _, err = deployment.run(before + new, "2026-11-08T09:00:00Z", "--config", settings)
    assert code == 0, err
    assert len(invoice_emails(deployment)) == 2


@pytest.mark.slow
def test_an_invoice_first_seen_overdue_gets_only_its_reminder(deployment, tmp_path):
    settings = config(tmp_path)
    deployment.run_in_process([issued("in_0")], "2026-11-05T09:00:00Z", settings)  # turned on
    late = issued("in_late", customer="cus_9", due="2026-11-01")
    code, _, err = deployment.run([issued("in_0"), late], "2026-11-06T09:00:00Z", "--config", settings)
    assert code == 0, err
    assert keys(deployment)["invoice:in_late:2026-11"] == "skipped"
    assert [m["X-Dunning-Kind"] for m in deployment.outbox()] == ["reminder"]


@pytest.mark.slow
def test_turning_it_off_and_on_again_starts_from_the_new_day(deployment, tmp_path):
    on, off = config(tmp_path), str(tmp_path / "off.yaml")
    (tmp_path / "off.yaml").write_text("invoice_emails: {enabled: false}\n")
    deployment.run_in_process([issued("in_0")], "2026-11-05T09:00:00Z", on)
    deployment.run_in_process([issued("in_0")], "2026-11-06T09:00:00Z", off)
    while_off = [issued("in_0"), issued("in_1", customer="cus_2")]
    deployment.run_in_process(while_off, "2026-11-07T09:00:00Z", off)
    code, _, err = deployment.run(while_off, "2026-11-08T09:00:00Z", "--config", on)
    assert code == 0, err
    assert invoice_emails(deployment) == [], "issued while it was off: open before it was turned on again"
    assert keys(deployment)["invoice:in_1:2026-11"] == "skipped"


@pytest.mark.slow
def test_invoice_emails_count_toward_the_breaker(deployment, tmp_path):
    settings = config(tmp_path, ON + "breaker: {max_emails: 1, window_hours: 24}\n")
    overdue = invoice(invoice_id="in_due", due_date="2026-11-01")
    deployment.run_in_process([issued("in_0", customer="cus_0")], "2026-11-03T09:00:00Z", settings)
    code, out, err = deployment.run(
        [issued("in_0", customer="cus_0"), overdue, issued("in_new")], "2026-11-05T09:00:00Z", "--config", settings
    )
    assert code == 3, (out, err)
    assert deployment.outbox() == []


@pytest.mark.slow
def test_a_dry_run_records_nothing(deployment, tmp_path):
    code, out, err = deployment.run([issued("in_1")], "2026-11-05T09:00:00Z", "--config", config(tmp_path), "--dry-run")
    assert code == 0, err
    assert deployment.ledger() == [] and deployment.query("SELECT count(*) FROM feature_state") == [(0,)]


def test_the_key_has_no_period_when_the_snapshot_has_none(deployment, tmp_path):
    settings = config(tmp_path)
    deployment.run_in_process([issued("in_0", billing_period=None)], "2026-11-05T09:00:00Z", settings)
    assert keys(deployment) == {"invoice:in_0:none": "skipped"}


def _invoice_record(**overrides) -> dict:
    record = {
        "kind": "invoice",
        "idempotency_key": "invoice:in_1:2026-11",
        "message_id": "<abc@example.com>",
        "invoice_id": "in_1",
        "customer_email": "ada@example.com",
        "customer_name": "Ada",
        "currency": "EUR",
        "amount_minor": 123456,
        "amount_due": 123456,
        "amount_paid": 0,
        "due_date": dt.date(2026, 11, 30),
        "days_overdue": -25,
        "billing_period": "2026-11",
        "payment_url": "https://pay.example.com/in_1",
    }
    record.update(overrides)
    return record


def test_the_email_shows_lines_total_due_date_and_pay_link_and_escapes_descriptions():
    lines = json.dumps(
        [
            {"description": "Pro plan <script>alert(1)</script>", "amount": 100000, "quantity": 1},
            {"description": "Seats\r\nBcc: evil@example.com", "amount": 23456, "quantity": 3},
        ]
    )
    message = render_for(
        [_invoice_record(invoice_lines=lines)],
        sender="billing@example.com",
        as_of=dt.datetime(2026, 11, 5, tzinfo=dt.UTC),
    )
    assert message["X-Dunning-Kind"] == "invoice"
    text = message.get_payload()[0].get_payload(decode=True).decode()
    html = message.get_payload()[1].get_payload(decode=True).decode()
    assert "Pro plan <script>alert(1)</script> x 1: 1,000.00 EUR" in text
    assert "Seats Bcc: evil@example.com x 3: 234.56 EUR" in text, "a line break in a description becomes a space"
    assert "Total: 1,234.56 EUR" in text and "due Nov 30, 2026" in text and "https://pay.example.com/in_1" in text
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert 'href="https://pay.example.com/in_1"' in html


@pytest.mark.parametrize("lines", ["not json", "[1, 2]", '[{"amount": "12"}]', '{"a": 1}', "[" * 100_000])
def test_unusable_lines_drop_the_lines_not_the_email(lines):
    message = render_for(
        [_invoice_record(invoice_lines=lines)],
        sender="billing@example.com",
        as_of=dt.datetime(2026, 11, 5, tzinfo=dt.UTC),
    )
    text = message.get_payload()[0].get_payload(decode=True).decode()
    assert "Total: 1,234.56 EUR" in text and " x " not in text


def test_a_stripe_invoice_is_keyed_by_the_utc_month_of_period_end_and_carries_its_lines(tmp_path):
    from zoneinfo import ZoneInfo

    from dunning.ingest.sources.stripe import invoice_row

    fixture = json.loads((Path(__file__).parent / "fixtures" / "stripe" / "invoices_list.json").read_text())
    stripe_invoice = dict(fixture["data"][0], period_end=1_764_547_200)  # 2025-12-01T00:00:00Z: November in New York
    row = invoice_row(stripe_invoice, ZoneInfo("America/New_York"))
    assert row["billing_period"] == "2025-12"
    assert json.loads(row["invoice_lines"]) == [
        {"description": "My First Invoice Item (created for API docs)", "amount": 1000, "quantity": 1}
    ]


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_the_ledger_side_of_invoice_emails_on_both_databases(backend):
    from tests.helpers import due_frame

    day = dt.date(2026, 11, 5)
    at = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
    with backend.open() as ledger:
        assert ledger.feature_enabled_on("invoice_emails") is None
        ledger.set_feature("invoice_emails", True, day, at, "run-1")
        ledger.set_feature("invoice_emails", True, day + dt.timedelta(days=1), at, "run-2")  # kept while on
        assert ledger.feature_enabled_on("invoice_emails") == day
        ledger.merge_history_day(day, _history([("in_seen", "c1")], day))
        ledger.merge_history_day(day + dt.timedelta(days=2), _history([("in_later", "c2")], day + dt.timedelta(days=2)))
        asked = pl.DataFrame({"invoice_id": ["in_seen", "in_later", "in_never"]})
        assert ledger.seen_on_or_before(asked, day).get_column("invoice_id").to_list() == ["in_seen"]
        skipped = due_frame(["in_seen"]).with_columns(
            idempotency_key=pl.lit("invoice:in_seen:2026-11"), kind=pl.lit("invoice")
        )
        assert ledger.record_skipped(skipped, "run-1", at) == 1
        assert ledger.record_skipped(skipped, "run-2", at) == 0
        keys = pl.DataFrame({"idempotency_key": ["invoice:in_seen:2026-11", "invoice:in_later:2026-11"]})
        assert ledger.invoice_keys_on_record(keys).get_column("idempotency_key").to_list() == [
            "invoice:in_seen:2026-11"
        ]
        ledger.set_feature("invoice_emails", False, day, at, "run-3")
        assert ledger.feature_enabled_on("invoice_emails") is None


def _history(invoices: list[tuple[str, str]], day: dt.date) -> pl.DataFrame:
    n = len(invoices)
    return pl.DataFrame(
        {
            "business_date": [day] * n,
            "run_id": ["r"] * n,
            "as_of": [dt.datetime.combine(day, dt.time(9), dt.UTC)] * n,
            "invoice_id": [i for i, _ in invoices],
            "customer_id": [c for _, c in invoices],
            "customer_email": [None] * n,
            "currency": ["USD"] * n,
            "amount_due": [100] * n,
            "amount_paid": [0] * n,
            "remaining_minor": [100] * n,
            "due_date": [day] * n,
            "status": ["open"] * n,
            "days_overdue": pl.Series([0] * n, dtype=pl.Int32),
            "cycle": pl.Series([None] * n, dtype=pl.Int32),
        }
    )

"""Payment signals pause reminders: a dispute excludes its invoice until it closes, a payment in flight makes its keys
wait, and an `invoice.paid` between snapshots closes the cycle at once; a snapshot older than a stored payment never
reopens the invoice. Events arrive as Stripe sends them (a file here; the poll and the webhook store the same rows)."""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path

import pytest

from dunning.ingest.sources.stripe_api import POLLED_TYPES
from dunning.plan import payment_signals
from tests.conftest import invoice

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "stripe"
DAY4 = "2026-11-04T09:00:00Z"
DAY8 = "2026-11-08T09:00:00Z"


def stripe_event(event_id: str, kind: str, obj: dict, created: str) -> dict:
    event = copy.deepcopy(json.loads((FIXTURES / "event.json").read_text()))
    moment = dt.datetime.fromisoformat(created.replace("Z", "+00:00"))
    event.update(id=event_id, type=kind, created=int(moment.timestamp()), data={"object": obj})
    return event


def dispute(event_id: str, kind: str, created: str, invoice_id: str = "in_1", customer: str = "cus_1") -> dict:
    """A dispute naming its invoice in its metadata; its charge expanded, so the event says whose charge it is."""
    obj = {"id": "dp_1", "object": "dispute", "charge": {"id": "ch_1", "object": "charge", "customer": customer},
           "status": "needs_response", "metadata": {"invoice_id": invoice_id}}  # fmt: skip
    return stripe_event(event_id, kind, obj, created)


def intent(event_id: str, kind: str, created: str, invoice_id: str = "in_1", customer: str | None = "cus_1") -> dict:
    return stripe_event(event_id, kind, {"id": "pi_1", "object": "payment_intent", "invoice": invoice_id,
                                         "customer": customer, "status": kind.rsplit(".", 1)[-1]}, created)  # fmt: skip


def paid(event_id: str, created: str, invoice_id: str = "in_1") -> dict:
    return stripe_event(event_id, "invoice.paid", {"id": invoice_id, "object": "invoice", "customer": "cus_1",
                                                   "status": "paid", "amount_due": 10000, "amount_paid": 10000,
                                                   "amount_remaining": 0, "currency": "usd"}, created)  # fmt: skip


def events_file(tmp_path: Path, name: str, events: list[dict]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(events))
    return path


def audit_reason(deployment, run_id: str, key: str) -> str | None:
    rows = deployment.query("SELECT reason FROM dunning_audit WHERE run_id = ? AND idempotency_key = ?", [run_id, key])
    return rows[0][0] if rows else None


def test_the_poll_asks_stripe_for_every_signal_it_acts_on():
    assert set(payment_signals.SIGNAL_TYPES) <= set(POLLED_TYPES) and len(POLLED_TYPES) <= 20  # Stripe's limit


@pytest.mark.slow
def test_a_dispute_excludes_its_invoice_until_it_closes_and_status_shows_it(deployment, tmp_path):
    rows = [invoice()]
    opened = events_file(tmp_path, "opened.json", [dispute("evt_d1", "charge.dispute.created", "2026-11-03T12:00:00Z")])
    first = deployment.run_in_process(rows, DAY4, events=opened)
    assert first.sent_keys == [], "no reminder for a disputed invoice"
    assert audit_reason(deployment, first.run_id, "dunning:in_1:1:day3") == "excluded"
    deployment.run_in_process(rows, "2026-11-05T09:00:00Z")  # the next snapshot: the exclusion is on record
    code, out, _ = deployment.cli("status")
    assert "invoice in_1" in out and "by stripe" in out and "disputed" in out
    closed = events_file(tmp_path, "closed.json", [dispute("evt_d2", "charge.dispute.closed", "2026-11-06T12:00:00Z")])
    deployment.run_in_process(rows, "2026-11-07T09:00:00Z", events=closed)
    later = deployment.run_in_process(rows, DAY8)
    assert later.sent_keys == ["dunning:in_1:1:day7"], "after the dispute closes: the stage reached by then, once"


@pytest.mark.slow
def test_closing_a_dispute_never_ends_an_operators_exclusion(deployment, tmp_path):
    assert deployment.cli("exclude", "--invoice", "in_1", "--reason", "payment plan")[0] == 0
    events = [dispute("evt_d1", "charge.dispute.created", "2026-11-03T12:00:00Z"),
              dispute("evt_d2", "charge.dispute.closed", "2026-11-03T13:00:00Z")]  # fmt: skip
    deployment.run_in_process([invoice()], DAY4, events=events_file(tmp_path, "d.json", events))
    assert deployment.run_in_process([invoice()], DAY8).sent_keys == []


@pytest.mark.slow
def test_a_payment_in_flight_makes_its_keys_wait_until_the_attempt_ends(deployment, tmp_path):
    rows = [invoice(), invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bob@example.com")]
    processing = events_file(
        tmp_path, "p.json", [intent("evt_p1", "payment_intent.processing", "2026-11-03T12:00:00Z")]
    )
    first = deployment.run_in_process(rows, DAY4, events=processing)
    assert first.sent_keys == ["dunning:in_2:1:day3"]
    assert audit_reason(deployment, first.run_id, "dunning:in_1:1:day3") == "payment_in_flight"
    failed = events_file(
        tmp_path, "f.json", [intent("evt_p2", "payment_intent.payment_failed", "2026-11-04T12:00:00Z")]
    )
    later = deployment.run_in_process(rows, "2026-11-05T09:00:00Z", events=failed)
    assert later.sent_keys == ["dunning:in_1:1:day3"], "the attempt failed: the reminder goes, once"


@pytest.mark.slow
def test_an_invoice_paid_between_snapshots_closes_its_cycle_and_an_older_snapshot_never_reopens_it(
    deployment, tmp_path
):
    export = invoice(snapshot_at="2026-11-04T06:00:00Z")  # the billing system's export of the morning
    assert deployment.run_in_process([export], DAY4).sent_keys == ["dunning:in_1:1:day3"]
    paid_file = events_file(tmp_path, "paid.json", [paid("evt_paid", "2026-11-04T10:00:00Z")])
    deployment.run_in_process([export], "2026-11-04T11:00:00Z", events=paid_file)
    # four days on, no new export yet: the morning's predates the payment, so in_1 is paid and its cycle closed
    later = deployment.run_in_process([export], DAY8)
    assert later.sent_keys == [], "a snapshot taken before the stored payment never reopens the invoice"
    assert deployment.query("SELECT cycle_open FROM invoice_cycles WHERE invoice_id = 'in_1'") == [(False,)]


@pytest.mark.slow
def test_a_snapshot_taken_after_the_payment_decides_by_itself(deployment, tmp_path):
    export = invoice(snapshot_at="2026-11-04T06:00:00Z")
    paid_file = events_file(tmp_path, "paid.json", [paid("evt_paid", "2026-11-04T10:00:00Z")])
    deployment.run_in_process([export], "2026-11-04T11:00:00Z", events=paid_file)
    deployment.run_in_process([export], "2026-11-05T09:00:00Z")  # read as paid: the cycle closes
    reopened = invoice(snapshot_at="2026-11-07T06:00:00Z", due_date="2026-11-03")  # charged back, due again
    assert deployment.run_in_process([reopened], DAY8).sent_keys == ["dunning:in_1:2:day3"]


def test_two_disputes_on_one_invoice_keep_it_excluded_until_both_close():
    import polars as pl

    def row(event_id, kind, dispute_id, second):
        payload = json.dumps({"data": {"object": {"id": dispute_id, "object": "dispute"}}})
        moment = dt.datetime(2026, 11, 3, 12, 0, second, tzinfo=dt.UTC)
        return {"invoice_id": "in_1", "type": kind, "created_at": moment, "event_id": event_id, "payload": payload}

    opened, closed = "charge.dispute.created", "charge.dispute.closed"
    events = pl.DataFrame([row("e1", opened, "dp_1", 0), row("e2", opened, "dp_2", 1), row("e3", closed, "dp_1", 2)])
    assert payment_signals.disputes(events) == (["in_1"], [])
    both = pl.concat([events, pl.DataFrame([row("e4", closed, "dp_2", 3)])])
    assert payment_signals.disputes(both) == ([], ["in_1"])


def test_a_payment_that_started_and_succeeded_in_one_second_is_not_left_in_flight():
    import polars as pl

    moment = dt.datetime(2026, 11, 3, 12, tzinfo=dt.UTC)
    kinds = ["payment_intent.succeeded", "payment_intent.processing"]  # the ending one first by id
    events = pl.DataFrame({"invoice_id": ["in_1", "in_1"], "type": kinds, "created_at": [moment, moment],
                           "event_id": ["evt_a", "evt_z"]})  # fmt: skip
    assert payment_signals.in_flight(events) == []


def set_aside(deployment) -> list[tuple[str, str]]:
    return deployment.query("SELECT event_id, reason FROM event_quarantine ORDER BY event_id")


@pytest.mark.slow
def test_a_payment_in_flight_of_another_customer_naming_an_invoice_in_its_metadata_pauses_nothing(deployment, tmp_path):
    """Issue 35, item 9: `metadata.invoice_id` is the merchant's free text; the event's customer must be the
    invoice's own in the snapshot, else the signal is recorded, counted and ignored."""
    rows = [invoice(), invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bob@example.com")]
    foreign = intent("evt_p1", "payment_intent.processing", "2026-11-03T12:00:00Z", invoice_id="", customer="cus_2")
    foreign["data"]["object"].pop("invoice")
    foreign["data"]["object"]["metadata"] = {"invoice_id": "in_1"}
    code, out, err = deployment.run(rows, DAY4, "--events", str(events_file(tmp_path, "p.json", [foreign])))
    assert code == 0, err
    sent = deployment.query("SELECT idempotency_key FROM reminder_ledger WHERE status = 'sent' ORDER BY 1")
    assert sent == [("dunning:in_1:1:day3",), ("dunning:in_2:1:day3",)]
    [(event_id, reason)] = set_aside(deployment)
    assert event_id == "evt_p1" and reason.startswith("payment signal of another customer") and "cus_2" in reason
    assert "billing events set aside (table event_quarantine): payment signal of another customer 1" in out
    again = deployment.run_in_process(rows, "2026-11-05T09:00:00Z")
    assert again.sent_keys == [] and len(set_aside(deployment)) == 1, "recorded once, not again by every run"


@pytest.mark.slow
def test_a_dispute_of_another_customer_excludes_nothing_and_is_set_aside(deployment, tmp_path):
    rows = [invoice()]
    opened = events_file(tmp_path, "d.json", [dispute("evt_d1", "charge.dispute.created", "2026-11-03T12:00:00Z",
                                                      customer="cus_9")])  # fmt: skip
    first = deployment.run_in_process(rows, DAY4, events=opened)
    assert first.sent_keys == ["dunning:in_1:1:day3"], "another customer's dispute holds nothing"
    assert deployment.query("SELECT count(*) FROM exclusions") == [(0,)]
    assert [e for e, _ in set_aside(deployment)] == ["evt_d1"]


@pytest.mark.slow
def test_a_closing_dispute_of_another_customer_never_ends_the_invoices_own(deployment, tmp_path):
    rows = [invoice()]
    events = [dispute("evt_d1", "charge.dispute.created", "2026-11-03T12:00:00Z"),
              dispute("evt_d2", "charge.dispute.closed", "2026-11-03T13:00:00Z", customer="cus_9")]  # fmt: skip
    deployment.run_in_process(rows, DAY4, events=events_file(tmp_path, "d.json", events))
    assert deployment.run_in_process(rows, DAY8).sent_keys == [], "the invoice's own dispute is still open"
    assert [e for e, _ in set_aside(deployment)] == ["evt_d2"]


def test_a_signal_naming_no_customer_is_not_taken_on_trust():
    import polars as pl

    snapshot = pl.DataFrame({"invoice_id": ["in_1", "in_2"], "customer_id": ["cus_1", "cus_2"]})
    payloads = [{"customer": "cus_1"}, {"customer": {"id": "cus_1", "object": "customer"}}, {"customer": None},
                {"charge": {"id": "ch_1", "customer": "cus_1"}}, {"charge": "ch_1"}, {"customer": "cus_1"}]  # fmt: skip
    moment = dt.datetime(2026, 11, 3, 12, tzinfo=dt.UTC)
    signals = pl.DataFrame({
        "invoice_id": ["in_1", "in_1", "in_1", "in_1", "in_1", "in_9"],
        "type": ["payment_intent.processing"] * 6, "created_at": [moment] * 6,
        "event_id": [f"evt_{n}" for n in range(6)],
        "payload": [json.dumps({"data": {"object": p}}) for p in payloads],
    })  # fmt: skip
    kept, foreign = payment_signals.owned(signals, snapshot)
    assert kept.get_column("event_id").to_list() == ["evt_0", "evt_1", "evt_3"]
    assert foreign.get_column("event_id").to_list() == ["evt_2", "evt_4"], "an invoice the snapshot lacks: neither"
    assert "(none)" in foreign.get_column("reason")[0]

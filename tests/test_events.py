"""Webhook retries: a webhook delivered many times produces one payment-failed notice."""

import copy
import json
from pathlib import Path

from tests.conftest import invoice

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "stripe"


def payment_failed_event(event_id="evt_pf_1", customer="cus_1", email="ada@example.com", remaining=4200):
    event = json.loads((FIXTURES / "event.json").read_text())
    stripe_invoice = copy.deepcopy(json.loads((FIXTURES / "invoices_list.json").read_text())["data"][0])
    stripe_invoice.update(id="in_pf", customer=customer, customer_email=email, status="open", amount_due=remaining,
                          amount_paid=0, amount_remaining=remaining, currency="eur")
    event.update(id=event_id, type="invoice.payment_failed", data={"object": stripe_invoice})
    return event


def write(path, events, lines=False):
    path.write_text("\n".join(json.dumps(e) for e in events) if lines else json.dumps(events))
    return str(path)


def test_five_deliveries_in_a_file_and_again_next_run_give_one_notice(deployment, tmp_path):
    other = json.loads((FIXTURES / "event.json").read_text())  # plan.created: counted and ignored
    events = write(tmp_path / "events.json", [payment_failed_event()] * 5 + [other])
    snapshot = [invoice(invoice_id="not_due_yet", due_date="2026-12-01")]
    code, out, err = deployment.run(snapshot, "2026-11-05T09:00:00Z", "--events", events)
    assert code == 0, err
    again = write(tmp_path / "events.jsonl", [payment_failed_event()] * 2, lines=True)
    code, _, err = deployment.run(snapshot, "2026-11-05T10:00:00Z", "--events", again)
    assert code == 0, err
    notices = [m for m in deployment.outbox() if m["X-Dunning-Kind"] == "payment_failed"]
    assert len(notices) == 1
    assert notices[0]["X-Dunning-Keys"] == "event:evt_pf_1"
    assert "42.00 EUR is still due" in notices[0].get_body(("plain",)).get_content()
    rows = deployment.ledger("kind = 'payment_failed'")
    assert [(r["idempotency_key"], r["status"], r["customer_id"]) for r in rows] == [("event:evt_pf_1", "sent", "cus_1")]
    stored = deployment.query("SELECT event_id, type FROM billing_events ORDER BY event_id")
    assert stored == [("evt_1Pgc76B7WZ01zgkWwyRHS12y", "plan.created"), ("evt_pf_1", "invoice.payment_failed")]


def test_notices_pass_through_the_breaker(deployment, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("group_by: invoice\n")
    rows = [invoice(invoice_id="a"), invoice(invoice_id="b", due_date="2026-10-28")]
    events = write(tmp_path / "e.json", [payment_failed_event()])
    code, _, err = deployment.run(rows, "2026-11-05T09:00:00Z", "--config", str(config), "--events", events)
    assert code == 3 and "cus_1 (3 emails" in err
    assert deployment.outbox() == []


def test_a_notice_without_an_address_uses_the_snapshot_or_is_held(deployment, tmp_path):
    events = write(tmp_path / "e.json", [payment_failed_event("evt_a", customer="cus_1", email=None),
                                         payment_failed_event("evt_b", customer="cus_ghost", email=None)])
    code, out, err = deployment.run([invoice(due_date="2026-12-01")], "2026-11-05T09:00:00Z", "--events", events)
    assert code == 0, err
    [notice] = deployment.outbox()
    assert notice["To"] == "ada@example.com" and notice["X-Dunning-Keys"] == "event:evt_a"
    assert "no_email_address 1" in out


def test_an_unreadable_events_file_is_a_clear_error(deployment, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = deployment.run([invoice()], "2026-11-05T09:00:00Z", "--events", str(bad))
    assert code == 2 and "neither JSON nor JSON Lines" in err and "Traceback" not in err
    assert deployment.outbox() == []

"""Webhook retries: a webhook delivered many times produces one payment-failed notice."""

import copy
import datetime as dt
import json
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import invoice

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "stripe"
PAYMENT_FAILED_TYPE = "invoice.payment_failed"


def payment_failed_event(
    event_id="evt_pf_1", customer="cus_1", email="ada@example.com", remaining=4200, invoice_id="in_1"
):
    """A Stripe `invoice.payment_failed` event for `invoice_id` (by default the snapshot's `in_1` of cus_1: a
    notice goes to the invoice's owner in the snapshot, never to an address the event names)."""
    event = json.loads((FIXTURES / "event.json").read_text())
    stripe_invoice = copy.deepcopy(json.loads((FIXTURES / "invoices_list.json").read_text())["data"][0])
    stripe_invoice.update(
        id=invoice_id,
        customer=customer,
        customer_email=email,
        status="open",
        amount_due=remaining,
        amount_paid=0,
        amount_remaining=remaining,
        currency="eur",
    )
    event.update(id=event_id, type="invoice.payment_failed", data={"object": stripe_invoice})
    return event


def write(path, events, lines=False):
    path.write_text("\n".join(json.dumps(e) for e in events) if lines else json.dumps(events))
    return str(path)


@pytest.mark.slow
def test_five_deliveries_in_a_file_and_again_next_run_give_one_notice(deployment, tmp_path):
    other = json.loads((FIXTURES / "event.json").read_text())  # plan.created: counted and ignored
    events = write(tmp_path / "events.json", [payment_failed_event()] * 5 + [other])
    snapshot = [invoice(invoice_id="in_1", due_date="2026-12-01")]  # known to the snapshot, not due yet
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
    assert [(r["idempotency_key"], r["status"], r["customer_id"]) for r in rows] == [
        ("event:evt_pf_1", "sent", "cus_1")
    ]
    stored = deployment.query("SELECT event_id, type FROM billing_events ORDER BY event_id")
    assert stored == [("evt_1Pgc76B7WZ01zgkWwyRHS12y", "plan.created"), ("evt_pf_1", "invoice.payment_failed")]


@pytest.mark.slow
def test_notices_pass_through_the_breaker(deployment, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("group_by: invoice\n")
    rows = [invoice(invoice_id="a"), invoice(invoice_id="b", due_date="2026-10-28")]
    events = write(tmp_path / "e.json", [payment_failed_event(invoice_id="a")])
    code, _, err = deployment.run(rows, "2026-11-05T09:00:00Z", "--config", str(config), "--events", events)
    assert code == 3 and "cus_1 (3 emails" in err
    assert deployment.outbox() == []


@pytest.mark.slow
def test_a_notice_goes_to_the_snapshots_address_or_waits(deployment, tmp_path):
    events = write(
        tmp_path / "e.json",
        [
            payment_failed_event("evt_a", customer="cus_1", email=None),
            payment_failed_event("evt_b", customer="cus_ghost", email=None, invoice_id="in_ghost"),
        ],
    )
    code, out, err = deployment.run([invoice(due_date="2026-12-01")], "2026-11-05T09:00:00Z", "--events", events)
    assert code == 0, err
    [notice] = deployment.outbox()
    assert notice["To"] == "ada@example.com" and notice["X-Dunning-Keys"] == "event:evt_a"
    assert "event_address_not_trusted 1" in out, "an invoice the snapshot does not know: its notice waits"


def test_an_unreadable_events_file_is_a_clear_error(deployment, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = deployment.run([invoice()], "2026-11-05T09:00:00Z", "--events", str(bad))
    assert code == 2 and "neither JSON nor JSON Lines" in err and "Traceback" not in err
    assert deployment.outbox() == []


# Hostile events: one bad event is quarantined, never a halt for everyone; a bad file is one line, never a traceback.


def quarantined(deployment):
    return deployment.query(
        "SELECT event_id, type, reason, run_id IS NOT NULL AND received_at IS NOT NULL AND payload IS NOT NULL "
        "FROM event_quarantine ORDER BY event_id"
    )


@pytest.mark.slow
def test_bad_payment_failed_events_are_quarantined_and_the_good_one_is_sent(deployment, tmp_path):
    no_data = payment_failed_event("evt_no_data")
    no_data["data"] = None
    not_invoice = payment_failed_event("evt_not_invoice")
    not_invoice["data"] = {"object": "nope"}
    events = write(
        tmp_path / "e.json",
        [payment_failed_event("evt_good"), no_data, payment_failed_event("evt_nothing_owed", remaining=0), not_invoice],
    )
    snapshot = [invoice(due_date="2026-12-01")]
    code, out, err = deployment.run(snapshot, "2026-11-05T09:00:00Z", "--events", events, "--dry-run")
    assert code == 0, err
    assert deployment.outbox() == [] and quarantined(deployment) == []  # a dry run writes no quarantine
    code, out, err = deployment.run(snapshot, "2026-11-05T09:00:00Z", "--events", events)
    assert code == 0, err
    [notice] = deployment.outbox()
    assert notice["X-Dunning-Keys"] == "event:evt_good"
    assert quarantined(deployment) == [
        ("evt_no_data", "invoice.payment_failed", "data is not an object", True),
        ("evt_not_invoice", "invoice.payment_failed", "data.object is not an invoice", True),
        ("evt_nothing_owed", "invoice.payment_failed", "amount_remaining is not positive", True),
    ]
    assert deployment.query("SELECT event_id FROM billing_events") == [("evt_good",)]


@pytest.mark.slow
def test_an_unparsable_created_quarantines_a_payment_failed_event_and_is_null_on_others(deployment, tmp_path):
    bad = payment_failed_event("evt_yesterday")
    other = json.loads((FIXTURES / "event.json").read_text())
    bad["created"] = other["created"] = "yesterday"
    events = write(tmp_path / "e.json", [bad, other, payment_failed_event("evt_good")])
    code, _, err = deployment.run([invoice(due_date="2026-12-01")], "2026-11-05T09:00:00Z", "--events", events)
    assert code == 0, err
    assert [m["X-Dunning-Keys"] for m in deployment.outbox()] == ["event:evt_good"]
    assert quarantined(deployment) == [
        ("evt_yesterday", "invoice.payment_failed", "created is not a Unix timestamp", True)
    ]
    assert deployment.query("SELECT type, created_at FROM billing_events WHERE event_id = ?", [other["id"]]) == [
        ("plan.created", None)
    ]


@pytest.mark.slow
def test_a_header_injection_in_the_invoice_id_is_quarantined_and_the_good_one_still_sent(deployment, tmp_path):
    injected = payment_failed_event("evt_injected")
    injected["data"]["object"]["id"] = "in_1\r\nBcc: x@evil.test"
    events = write(tmp_path / "e.jsonl", [injected, payment_failed_event("evt_good")], lines=True)
    code, _, err = deployment.run([invoice(due_date="2026-12-01")], "2026-11-05T09:00:00Z", "--events", events)
    assert code == 0, err
    [notice] = deployment.outbox()
    assert notice["X-Dunning-Keys"] == "event:evt_good" and notice["Bcc"] is None
    assert quarantined(deployment) == [
        ("evt_injected", "invoice.payment_failed", "invoice id contains a control character", True)
    ]


def test_a_latin1_events_file_is_a_clear_error(deployment, tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes(json.dumps(payment_failed_event(customer="cus_Müller"), ensure_ascii=False).encode("latin-1"))
    code, _, err = deployment.run([invoice()], "2026-11-05T09:00:00Z", "--events", str(path))
    assert code == 2, err
    assert "Traceback" not in err and "latin1.json" in err and "not UTF-8" in err
    assert len(err.strip().splitlines()) == 1
    assert deployment.outbox() == []


def test_deeply_nested_json_is_a_clear_error(deployment, tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 200000 + "]" * 200000)
    code, _, err = deployment.run([invoice()], "2026-11-05T09:00:00Z", "--events", str(path))
    assert code == 2, err
    assert "Traceback" not in err and "deep.json" in err and "nested too deeply" in err
    assert deployment.outbox() == []


def test_an_entry_that_is_not_an_event_is_a_clear_error(deployment, tmp_path):
    path = write(tmp_path / "e.json", [payment_failed_event(), {"id": "evt_x", "type": 5}, 7])
    code, _, err = deployment.run([invoice()], "2026-11-05T09:00:00Z", "--events", path)
    assert code == 2, err
    assert "Traceback" not in err and "entries [1, 2] are not Stripe events" in err
    assert deployment.outbox() == []


def test_validation_names_every_broken_rule():
    from dunning.ingest.events import split_events

    good = payment_failed_event("evt_good", customer={"id": "cus_1", "object": "customer"})
    bad = payment_failed_event("evt_bad\u2028", customer="")
    bad.update(created=True)
    bad["data"]["object"].update(currency="€", amount_remaining=True)
    loaded = split_events([good, bad, copy.deepcopy(good)])
    assert loaded.accepted.select("event_id", "customer_id", "amount_remaining").rows() == [("evt_good", "cus_1", 4200)]
    assert loaded.rejected.select("event_id", "reason").rows() == [
        (
            "evt_bad\u2028",
            "event id contains a control character; created is not a Unix timestamp; customer is empty; "
            "currency is not a three-letter code; amount_remaining is not an integer",
        )
    ]


try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # hypothesis comes with the test extra
    st = None

if st is None:

    @pytest.mark.skip(reason="hypothesis is not installed")
    def test_validation_never_raises_and_accepts_only_sound_events():
        pass
else:

    def _json_values():
        scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
        return st.recursive(
            scalars,
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
            max_leaves=5,
        )

    MISSING = object()  # the key is left out
    _texts = st.text(min_size=1, max_size=40)  # arbitrary unicode: control characters and line separators included
    _hostile_ids = st.text() | st.sampled_from(
        ["", "a" * 200, "a" * 201, "x\u0085", "x\u2029", "in\r\nBcc: x@evil.test", "x\ud800"]
    )
    _hostile = {  # field -> what it may become instead of a sound value
        "id": _hostile_ids | _json_values(),
        "created": st.integers()
        | st.integers(946684800 - 2, 946684800 + 2)
        | st.integers(4102444800 - 2, 4102444800 + 2)
        | st.sampled_from(["yesterday", 1.7e9, True])
        | _json_values(),
        "data": _json_values(),
        "data.object": _json_values(),
        "object": st.sampled_from(["plan", None, "Invoice"]) | _json_values(),
        "invoice id": _hostile_ids | _json_values(),
        "customer": _hostile_ids
        | st.fixed_dictionaries({}, optional={"id": _hostile_ids | _json_values()})
        | _json_values(),
        "customer_email": _json_values(),
        "currency": st.text(max_size=4) | _json_values(),
        "amount_remaining": st.integers()
        | st.integers(-2, 2)
        | st.integers(2**63 - 2, 2**64)
        | st.sampled_from([True, 4.2])
        | _json_values(),
        "amount_due": st.integers() | _json_values(),
        "amount_paid": st.integers() | _json_values(),
    }

    @st.composite
    def _payment_failed_events(draw):
        """A sound payment_failed event with any number of its fields (none to all) made hostile or left out."""
        invoice_ = {
            "object": "invoice",
            "id": draw(_texts),
            "customer": draw(_texts | st.fixed_dictionaries({"id": _texts})),
            "customer_email": draw(st.text() | st.just("ada@example.com")),
            "currency": draw(st.sampled_from(["eur", "usd", "jpy"])),
            "amount_remaining": draw(st.integers(1, 10**9)),
            "amount_due": 0,
            "amount_paid": 0,
        }
        event = {
            "id": draw(_texts),
            "type": draw(st.sampled_from([PAYMENT_FAILED_TYPE] * 3 + ["invoice.paid", "plan.created"])),
            "created": draw(st.integers(946684800, 4102444800 - 1)),
            "data": {"object": invoice_},
        }
        for field in draw(st.lists(st.sampled_from(sorted(_hostile)), unique=True)):
            value = draw(st.just(MISSING) | _hostile[field])
            if field in ("id", "created", "data"):
                target, key = event, field
            elif field == "data.object":
                target, key = event.get("data"), "object"
            else:
                target, key = invoice_, "id" if field == "invoice id" else field
            if isinstance(target, dict):
                if value is MISSING:
                    target.pop(key, None)
                else:
                    target[key] = value
        return event

    @pytest.mark.slow
    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(_payment_failed_events(), max_size=4))
    def test_validation_never_raises_and_accepts_only_sound_events(events):
        import unicodedata

        from dunning.ingest.events import split_events

        loaded = split_events(events)  # never raises, whatever the events hold

        def sound(text):
            return (
                isinstance(text, str)
                and 0 < len(text) <= 200
                and text.encode("utf-8", "surrogatepass").decode("utf-8") == text
                and not any(unicodedata.category(c) in ("Cc", "Cs") or c in "\u2028\u2029\u0085" for c in text)
            )

        accepted = loaded.accepted.to_dicts()
        assert len(accepted) + loaded.rejected.height <= len(events)
        assert loaded.rejected.get_column("reason").is_not_null().all()
        ids = [e["event_id"] for e in accepted]
        assert len(ids) == len(set(ids)) and not set(ids) & set(loaded.rejected.get_column("event_id").drop_nulls())
        for row in accepted:
            assert isinstance(row["event_id"], str) and isinstance(row["type"], str)
            if row["type"] != PAYMENT_FAILED_TYPE:
                continue
            assert sound(row["event_id"]) and sound(row["invoice_id"]) and sound(row["customer_id"])
            assert isinstance(row["amount_remaining"], int) and row["amount_remaining"] > 0
            assert isinstance(row["currency"], str)
            assert dt.datetime(2000, 1, 1, tzinfo=dt.UTC) <= row["created_at"] < dt.datetime(2100, 1, 1, tzinfo=dt.UTC)


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_an_event_never_chooses_the_recipient(deployment, tmp_path):
    """The event names the victim's invoice and customer but the attacker's address: the notice goes to the
    victim's address from the snapshot, with the victim's own pay link; an event naming someone else's invoice is
    quarantined."""
    rows = [
        invoice(invoice_id="in_1", due_date="2026-12-01", payment_url="https://pay.example.com/in_1"),
        invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bo@example.com", due_date="2026-12-01"),
    ]
    events = write(
        tmp_path / "e.json",
        [
            payment_failed_event("evt_redirect", customer="cus_1", email="attacker@evil.test"),
            payment_failed_event("evt_other_owner", customer="cus_2", email="bo@example.com", invoice_id="in_1"),
        ],
    )
    result = deployment.run_in_process(rows, "2026-11-05T09:00:00Z", events=events)
    assert result.sent_keys == ["event:evt_redirect"]
    [notice] = deployment.outbox()
    assert notice["To"] == "ada@example.com" and "evil.test" not in notice.as_string()
    assert "https://pay.example.com/in_1" in notice.get_body(("plain",)).get_content()
    [(event_id, reason)] = deployment.query("SELECT event_id, reason FROM event_quarantine")
    assert event_id == "evt_other_owner" and "belongs to another customer" in reason


@pytest.mark.parametrize("trusted", [False, True])
@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_an_unknown_invoices_notice_uses_the_events_address_only_when_trusted(deployment, tmp_path, trusted):
    config = tmp_path / "c.yaml"
    config.write_text(f"events: {{trust_event_email: {str(trusted).lower()}}}\n")
    events = write(tmp_path / "e.json", [payment_failed_event(email="new@example.com", invoice_id="in_new")])
    result = deployment.run_in_process([invoice(due_date="2026-12-01")], "2026-11-05T09:00:00Z", config, Path(events))
    assert result.sent_keys == (["event:evt_pf_1"] if trusted else [])
    assert [m["To"] for m in deployment.outbox()] == (["new@example.com"] if trusted else [])
    if not trusted:
        held = result.audit.filter(pl.col("idempotency_key") == "event:evt_pf_1").get_column("reason").to_list()
        assert held == ["event_address_not_trusted"]


@pytest.mark.slow
def test_a_stored_event_past_the_lookback_is_counted_as_expired_in_the_summary_and_status(deployment):
    """Issue 35, item 11: an event older than `source.events_lookback_days` was stored and silently yielded nothing.
    Now it is set aside once as `expired` (table event_quarantine), and the run summary and `status` count it."""
    from dunning.run import inbox

    rows = [invoice(), invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bob@example.com")]
    old = payment_failed_event("evt_old", customer="cus_1", invoice_id="in_1")  # created 2009: long past
    fresh = payment_failed_event("evt_new", customer="cus_2", email="bob@example.com", invoice_id="in_2")
    fresh["created"] = int(dt.datetime(2026, 11, 3, 12, tzinfo=dt.UTC).timestamp())
    at = dt.datetime.now(dt.UTC)
    for event in (old, fresh):  # as `dunning serve-webhooks` keeps them
        inbox.store(deployment.home, "stripe", event["id"], json.dumps(event).encode(), at)
    code, out, err = deployment.run(rows, "2026-11-04T09:00:00Z")
    assert code == 0, err
    assert deployment.query("SELECT idempotency_key FROM reminder_ledger WHERE kind = 'payment_failed'") == [
        ("event:evt_new",)]  # fmt: skip
    [(event_id, reason)] = deployment.query("SELECT event_id, reason FROM event_quarantine")
    assert event_id == "evt_old" and reason.startswith("expired: created 2009-02-13") and "(3)" in reason
    assert "billing events set aside (table event_quarantine): expired 1" in out
    code, status, _ = deployment.cli("status")
    assert "billing events set aside: expired 1" in status
    code, out, err = deployment.run(rows, "2026-11-05T09:00:00Z")
    assert code == 0 and "expired" not in out, "counted by the run that found it, once"
    assert deployment.query("SELECT count(*) FROM event_quarantine") == [(1,)]

"""Every contact (`customer_cc`): one reminder To the customer's address and Cc the others, in the .eml, the SMTP
message and envelope, Resend's body; a bad copy address left out and counted; each address suppressed on its own,
a live copy taking a suppressed primary's place; `reminder_ledger.recipients`."""

from __future__ import annotations

import datetime as dt
import email
from email import policy

import pytest

from dunning.desk.contacts import split_cc
from dunning.email.render import Draft, Sender, message_of
from dunning.send.providers.resend_api import request_params
from dunning.vocabulary import EmailKind
from tests.conftest import invoice
from tests.delivery_messages import dsn, write_mbox
from tests.smtp_server import ScriptedHandler, SmtpServer, smtp_config

DAY4 = "2026-11-04T09:00:00Z"
TWO_COPIES = "Bob <bob@example.com>, carol@example.com"


class EnvelopeHandler(ScriptedHandler):
    """The scripted server, also keeping each message's envelope recipients."""

    def __init__(self) -> None:
        super().__init__()
        self.envelopes: list[list[str]] = []

    async def handle_DATA(self, server, session, envelope):
        self.envelopes.append(list(envelope.rcpt_tos))
        return await super().handle_DATA(server, session, envelope)


@pytest.mark.slow
def test_two_copy_addresses_get_one_email_with_cc_in_the_outbox(deployment):
    code, _, err = deployment.run([invoice(customer_cc=TWO_COPIES)], DAY4)
    assert code == 0, err
    [sent] = deployment.outbox()
    assert sent["To"] == "ada@example.com" and sent["Cc"] == "bob@example.com, carol@example.com"
    [row] = deployment.ledger()
    assert row["recipients"] == "ada@example.com,bob@example.com,carol@example.com"
    assert row["customer_email"] == "ada@example.com"


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_smtp_sends_one_message_with_one_envelope_recipient_per_address(deployment, tmp_path):
    handler = EnvelopeHandler()
    with SmtpServer(handler) as server:
        config = smtp_config(tmp_path / "smtp.yaml", server.port)
        result = deployment.run_in_process([invoice(customer_cc=TWO_COPIES)], DAY4, config)
    assert result.sent_keys == ["dunning:in_1:1:day3"]
    [message] = handler.received
    assert message["To"] == "ada@example.com" and message["Cc"] == "bob@example.com, carol@example.com"
    assert handler.envelopes == [["ada@example.com", "bob@example.com", "carol@example.com"]]


def test_invoices_of_one_customer_copied_to_different_contacts_go_in_one_email_to_every_contact(deployment):
    """One email per customer as before, its Cc every copy address of its invoices, and each key's `recipients` what
    the email went to (a review found the email Cc'd to the first invoice's contact alone while each key recorded
    its own: carol was on record for in_2 and never mailed)."""
    rows = [invoice(customer_cc="bob@example.com"), invoice(invoice_id="in_2", customer_cc="carol@example.com"),
            invoice(invoice_id="in_3", customer_cc="Bob@example.com"), invoice(invoice_id="in_4")]  # fmt: skip
    result = deployment.run_in_process(rows, DAY4)
    assert len(result.sent_keys) == 4
    [sent] = deployment.outbox()
    assert (sent["To"], sent["Cc"]) == ("ada@example.com", "bob@example.com, carol@example.com")
    every = "ada@example.com,bob@example.com,carol@example.com"
    assert {r["idempotency_key"]: r["recipients"] for r in deployment.ledger()} == {
        f"dunning:in_{i}:1:day3": every for i in (1, 2, 3, 4)
    }


def test_a_bad_copy_address_is_left_out_and_counted(deployment):
    result = deployment.run_in_process([invoice(customer_cc="not an address, bob@example.com, x@@y, ada@EXAMPLE.com")],
                                       DAY4)  # fmt: skip
    assert result.sent_keys == ["dunning:in_1:1:day3"]
    [sent] = deployment.outbox()
    assert sent["Cc"] == "bob@example.com"
    assert deployment.query("SELECT reason FROM dunning_audit") == [("cc_address_dropped",)]
    assert split_cc("a@example.com, bad, b@example.com,,A@example.com", None) == (["a@example.com", "b@example.com"], 1)


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_with_the_primary_suppressed_the_first_live_copy_is_to_and_a_new_primary_is_asked_for(deployment):
    assert deployment.cli("suppress", "--email", "ada@example.com")[0] == 0
    assert deployment.cli("suppress", "--email", "bob@example.com")[0] == 0
    result = deployment.run_in_process([invoice(customer_cc="bob@example.com, carol@example.com, dan@example.com")],
                                       DAY4)  # fmt: skip
    assert result.sent_keys == ["dunning:in_1:1:day3"]
    [sent] = deployment.outbox()
    assert sent["To"] == "carol@example.com" and sent["Cc"] == "dan@example.com"
    [row] = deployment.ledger()
    assert row["recipients"] == "carol@example.com,dan@example.com" and row["customer_email"] == "carol@example.com"
    [(message,)] = deployment.query("SELECT message FROM alerts WHERE kind = 'contact_suppressed'")
    assert "ada@example.com" in message


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_every_address_suppressed_holds_the_key(deployment):
    for address in ("ada@example.com", "bob@example.com"):
        deployment.cli("suppress", "--email", address)
    result = deployment.run_in_process([invoice(customer_cc="bob@example.com")], DAY4)
    assert result.sent_keys == [] and deployment.outbox() == []
    assert deployment.query("SELECT reason FROM dunning_audit") == [("suppressed",)]


def test_the_breaker_still_counts_per_customer_not_per_address(deployment, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("breaker: {max_emails: 1, window_hours: 24}\ngroup_by: invoice\n")
    rows = [invoice(customer_cc=TWO_COPIES), invoice(invoice_id="in_2", customer_cc=TWO_COPIES)]
    result = deployment.run_in_process(rows, DAY4, config)
    assert result.result is None and not result.verdict.passed, "two emails to one customer trip a cap of one"


def test_resend_gets_the_copies_in_cc():
    draft = Draft("ada@example.com", Sender("billing@example.com"), "Reminder", "<m@example.com>",
                  EmailKind.REMINDER, ["dunning:in_1:1:day3"], "text", "<p>html</p>",
                  dt.datetime(2026, 11, 4, tzinfo=dt.UTC), cc=("bob@example.com", "carol@example.com"))  # fmt: skip
    params = request_params(email.message_from_bytes(message_of(draft).as_bytes(), policy=policy.compat32))
    assert params["to"] == ["ada@example.com"] and params["cc"] == ["bob@example.com", "carol@example.com"]


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_bounce_of_a_copy_address_suppresses_that_address_alone(deployment, tmp_path):
    rows = [invoice(customer_cc=TWO_COPIES)]
    deployment.run_in_process(rows, DAY4)
    [sent] = deployment.outbox()
    box = write_mbox(tmp_path / "bounces.mbox", [dsn("carol@example.com", sent["Message-ID"])])
    code, out, err = deployment.cli("feedback", "--mbox", str(box))
    assert code == 0 and "suppressed: 1 address(es): carol@example.com" in out, (out, err)
    deployment.run_in_process(rows, "2026-11-08T09:00:00Z")
    later = deployment.outbox()[-1]
    assert later["To"] == "ada@example.com" and later["Cc"] == "bob@example.com"


def test_stripe_customer_metadata_dunning_cc_fills_customer_cc(tmp_path):
    import json
    from zoneinfo import ZoneInfo

    from dunning.ingest.sources.stripe import load_stripe_invoices

    stripe_invoice = {
        "id": "in_1", "object": "invoice", "customer": {"id": "cus_1", "email": "ada@example.com",
                                                        "metadata": {"dunning_cc": "bob@example.com"}},
        "currency": "usd", "amount_due": 1000, "amount_paid": 0, "due_date": 1793491200, "status": "open",
    }  # fmt: skip
    path = tmp_path / "invoices.json"
    path.write_text(json.dumps({"object": "list", "data": [stripe_invoice], "has_more": False}))
    [row] = load_stripe_invoices(path, ZoneInfo("UTC"))
    assert row["customer_cc"] == "bob@example.com"


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_retried_email_keeps_every_copy_address_of_its_invoices(deployment, tmp_path):
    """The retry of a failed grouped email goes with the same Message-ID to the same copies: the union of its keys'
    (a review of the union found the retry Cc'd to the first row's contact alone)."""
    from tests.smtp_server import RawSmtpServer, RefusedPort

    def smtp(port: int) -> str:
        return smtp_config(tmp_path / "smtp.yaml", port, timeout=0.5)

    rows = [invoice(customer_cc="bob@example.com"), invoice(invoice_id="in_2", customer_cc="carol@example.com")]
    with RawSmtpServer("drop_on_data") as server:
        deployment.run_in_process(rows, "2026-11-05T09:00:00Z", smtp(server.port))
    assert {r["status"] for r in deployment.ledger("status <> 'skipped'")} == {"failed"}
    handler, refused = ScriptedHandler(), RefusedPort()
    with SmtpServer(handler, port=refused.release()):
        assert len(deployment.run_in_process(rows, "2026-11-05T09:31:00Z", smtp(refused.port)).sent_keys) == 2
    [message] = handler.received
    assert message["Cc"] == "bob@example.com, carol@example.com"
    every = "ada@example.com,bob@example.com,carol@example.com"
    assert {r["recipients"] for r in deployment.ledger("status <> 'skipped'")} == {every}


def test_the_copies_of_one_email_are_ten_at_most_and_a_frame_without_any_is_left_as_it_is():
    import polars as pl

    from dunning.send.sending import with_group_copies

    first, second = (",".join(f"{who}{i}@example.com" for i in range(10)) for who in ("a", "b"))
    frame = pl.DataFrame({"email_group": ["g", "g"], "customer_email": ["ada@example.com"] * 2,
                          "customer_cc": [first, second], "recipients": [None, None]})  # fmt: skip
    copies = with_group_copies(frame).get_column("customer_cc").to_list()
    assert copies == [first, first]  # the first ten seen
    empty = pl.DataFrame({"email_group": ["g"], "customer_email": ["ada@example.com"], "customer_cc": [None]})
    assert with_group_copies(empty).get_column("customer_cc").to_list() == [None]  # a Null column, no error

"""Customers' replies read by `dunning feedback`: a human reply matched by In-Reply-To (or the customer's address)
holds the next stage until `dunning ack` or until `replies.pause_days` business days pass; an out-of-office reply
holds nothing; a reply naming another customer's email pauses no one. Through the `dunning` command."""

from __future__ import annotations

import json
from email.message import EmailMessage

import pytest

from tests.conftest import invoice
from tests.delivery_messages import write_maildir, write_mbox

DAY4 = "2026-11-04T09:00:00Z"  # in_1 due 2026-11-01: day3 reached
BOB = {"invoice_id": "in_2", "customer_id": "cus_2", "customer_email": "bob@example.com", "customer_name": "Bob"}


def reply(
    sender: str = "Ada <ada@example.com>", *, in_reply_to: str | None = None, subject: str = "Re: your reminder",
    text: str = "We paid last week, see the attached remittance.\n\nOn Wed, Billing wrote:\n> Hello Ada",
    date: str | None = "Thu, 05 Nov 2026 10:00:00 +0000", message_id: str | None = "<r1@mail.example.com>",
    **headers: str,
) -> bytes:  # fmt: skip
    message = EmailMessage()
    message["From"] = sender
    message["To"] = "billing@example.com"
    message["Subject"] = subject
    if date:
        message["Date"] = date
    if message_id:
        message["Message-ID"] = message_id
    if in_reply_to:
        message["In-Reply-To"] = in_reply_to
        message["References"] = in_reply_to
    for name, value in headers.items():
        message[name.replace("_", "-")] = value
    message.set_content(text)
    return message.as_bytes()


def audit_of(deployment, run_id: str) -> dict[str, tuple[str, str | None]]:
    rows = deployment.query("SELECT idempotency_key, outcome, reason FROM dunning_audit WHERE run_id = ?", [run_id])
    return {key: (outcome, reason) for key, outcome, reason in rows}


def alerts(deployment, kind: str) -> list[str]:
    return [m for (m,) in deployment.query("SELECT message FROM alerts WHERE kind = ? ORDER BY created_at", [kind])]


def first_reminder(deployment, rows) -> str:
    assert deployment.run_in_process(rows, DAY4).sent_keys == ["dunning:in_1:1:day3"]
    return deployment.outbox()[0]["Message-ID"]


def feedback(deployment, tmp_path, messages: list[bytes], name: str = "replies.mbox") -> str:
    box = write_mbox(tmp_path / name, messages)
    code, out, err = deployment.cli("feedback", "--mbox", str(box))
    assert code == 0, err
    return out


@pytest.mark.slow
def test_a_reply_holds_the_next_stage_until_ack(deployment, tmp_path):
    rows = [invoice()]
    ours = first_reminder(deployment, rows)
    out = feedback(deployment, tmp_path, [reply(in_reply_to=ours)])
    assert "replies: 1 new (0 automatic" in out and "waiting for an answer: cus_1" in out
    [paged] = alerts(deployment, "customer_replied")
    assert "cus_1" in paged and "Re: your reminder" in paged and "We paid last week" in paged
    assert "Hello Ada" not in paged, "the quoted history is left out"
    [(customer, sender, matched_by, automatic, received)] = deployment.query(
        'SELECT customer_id, "from", matched_by, automatic, received_at::VARCHAR FROM customer_replies'
    )
    assert (customer, sender, matched_by, automatic) == ("cus_1", "ada@example.com", "message_id", False)
    assert received.startswith("2026-11-05 10:00:00")
    held = deployment.run_in_process(rows, "2026-11-08T09:00:00Z")  # day7 reached (a Sunday: 1 business day)
    assert held.sent_keys == [] and audit_of(deployment, held.run_id) == {"dunning:in_1:1:day7": ("held", "replied")}
    code, out, _ = deployment.cli("status", "--json")
    waiting = json.loads(out)["replies_waiting"]
    assert [(w["customer_id"], w["replies"]) for w in waiting] == [("cus_1", 1)]  # status reads the wall clock
    assert "customers waiting for an answer: 1" in deployment.cli("status")[1]
    code, out, err = deployment.cli("ack", "--customer", "cus_1", "--note", "told them it is booked",
                                    "--as-of", "2026-11-08T12:00:00Z")  # fmt: skip
    assert code == 0 and "acknowledged 1 reply" in out, err
    code, _, err = deployment.run(rows, "2026-11-09T09:00:00Z")
    assert code == 0, err
    assert [m["X-Dunning-Keys"] for m in deployment.outbox()] == ["dunning:in_1:1:day3", "dunning:in_1:1:day7"]
    assert json.loads(deployment.cli("status", "--json")[1])["replies_waiting"] == []
    # importing the same mailbox again records nothing and pages no one again
    again = feedback(deployment, tmp_path, [reply(in_reply_to=ours)], "again.mbox")
    assert "replies: 0 new" in again and len(alerts(deployment, "customer_replied")) == 1


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_an_ack_holds_only_for_runs_at_or_after_it(deployment, tmp_path):
    rows = [invoice()]
    ours = first_reminder(deployment, rows)
    feedback(deployment, tmp_path, [reply(in_reply_to=ours)])
    assert deployment.cli("ack", "--customer", "cus_1", "--as-of", "2026-11-09T12:00:00Z")[0] == 0
    assert deployment.run_in_process(rows, "2026-11-09T09:00:00Z").sent_keys == [], "the ack is later that day"
    assert deployment.run_in_process(rows, "2026-11-09T13:00:00Z").sent_keys == ["dunning:in_1:1:day7"]


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_an_out_of_office_reply_holds_nothing_and_pages_no_one(deployment, tmp_path):
    rows = [invoice()]
    ours = first_reminder(deployment, rows)
    messages = [
        reply(in_reply_to=ours, subject="Out of Office: Re: your reminder", message_id="<o1@x>"),
        reply(in_reply_to=ours, subject="Re: your reminder", message_id="<o2@x>", Auto_Submitted="auto-replied"),
        reply(in_reply_to=ours, subject="Abwesenheitsnotiz", message_id="<o3@x>"),
        reply(in_reply_to=ours, subject="thanks", message_id="<o4@x>", Precedence="bulk"),
        reply(in_reply_to=ours, subject="hi", message_id="<o5@x>", X_Autoreply="yes"),
    ]
    out = feedback(deployment, tmp_path, messages)
    assert "replies: 5 new (5 automatic" in out
    assert deployment.query("SELECT count(*) FROM customer_replies WHERE automatic") == [(5,)]
    assert alerts(deployment, "customer_replied") == []
    assert deployment.run_in_process(rows, "2026-11-08T09:00:00Z").sent_keys == ["dunning:in_1:1:day7"]


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_an_unanswered_reply_pauses_for_the_business_days_then_pages_once_and_dunning_resumes(deployment, tmp_path):
    rows = [invoice()]
    ours = first_reminder(deployment, rows)
    feedback(deployment, tmp_path, [reply(in_reply_to=ours)])  # Thursday 5 November
    # Fri 6 and Mon 9 are two business days: still paused on Monday; Tue 10 is the third
    assert deployment.run_in_process(rows, "2026-11-09T09:00:00Z").sent_keys == []
    assert alerts(deployment, "reply_unanswered") == []
    assert deployment.run_in_process(rows, "2026-11-10T09:00:00Z").sent_keys == ["dunning:in_1:1:day7"]
    [unanswered] = alerts(deployment, "reply_unanswered")
    assert "cus_1" in unanswered and "3 business days" in unanswered
    deployment.run_in_process(rows, "2026-11-10T15:00:00Z")
    assert len(alerts(deployment, "reply_unanswered")) == 1


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_reply_from_the_customers_address_pauses_without_in_reply_to(deployment, tmp_path):
    rows = [invoice()]
    first_reminder(deployment, rows)
    out = feedback(deployment, tmp_path, [reply("ADA@example.com")], "plain.mbox")
    assert "replies: 1 new" in out
    assert deployment.query("SELECT customer_id, matched_by FROM customer_replies") == [("cus_1", "address")]
    assert deployment.run_in_process(rows, "2026-11-08T09:00:00Z").sent_keys == []


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_reply_naming_another_customers_email_is_recorded_and_pauses_no_one(deployment, tmp_path):
    rows = [invoice(), invoice(**BOB)]
    deployment.run_in_process(rows, DAY4)
    ada_message = next(m["Message-ID"] for m in deployment.outbox() if m["To"] == "ada@example.com")
    out = feedback(deployment, tmp_path, [reply("bob@example.com", in_reply_to=ada_message)])
    assert "1 pausing no one" in out
    assert deployment.query("SELECT customer_id, pauses FROM customer_replies") == [("cus_1", False)]
    later = deployment.run_in_process(rows, "2026-11-08T09:00:00Z")
    assert later.sent_keys == ["dunning:in_1:1:day7", "dunning:in_2:1:day7"]


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_reply_never_suppresses_nor_changes_a_recipient_and_strangers_are_not_recorded(deployment, tmp_path):
    rows = [invoice()]
    ours = first_reminder(deployment, rows)
    box = write_maildir(tmp_path / "Maildir", [
        reply(in_reply_to=ours, text="please write to ap@ada.example from now on"),
        reply("stranger@elsewhere.example", message_id="<s1@x>"),  # names nothing of ours, from no customer
        reply("Ada <ada@example.com>", message_id=None, date=None, subject="\x1b[31mred\x1b[0m <b>bold</b>"),
    ])  # fmt: skip
    code, out, err = deployment.cli("feedback", "--maildir", str(box))
    assert code == 0, err
    assert deployment.query("SELECT count(*) FROM customer_replies") == [(2,)]
    assert deployment.query("SELECT count(*) FROM suppressions") == [(0,)]
    for paged in alerts(deployment, "customer_replied"):
        assert "\x1b" not in paged
    # no Date: the import's time; no Message-ID: unique on a digest of the message
    [(key,)] = deployment.query("SELECT reply_key FROM customer_replies WHERE message_id IS NULL")
    assert key.startswith("sha256:")
    deployment.cli("ack", "--customer", "cus_1", "--as-of", "2099-01-01T00:00:00Z")
    assert deployment.run_in_process(rows, "2026-11-08T09:00:00Z").sent_keys == []  # paused: the ack is later
    code, _, err = deployment.cli("ack", "--customer", "cus_404")
    assert code == 2 and "no reply on record" in err


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_reply_with_a_remittance_larger_than_any_bounce_still_holds_the_chasing(deployment, tmp_path):
    """Over the reports' 5 MB limit (a scanned PDF of about 4 MB, base64), the message is unreadable as a report but
    read from its header block as a reply: it pauses, pages, and says its text was not read (a review found it
    dropped with no alert while the next stage went)."""
    rows = [invoice()]
    ours = first_reminder(deployment, rows)
    headers = {"From": "Ada <ada@example.com>", "To": "billing@example.com", "Subject": "Re: your reminder",
               "Date": "Thu, 05 Nov 2026 10:00:00 +0000", "Message-ID": "<big@mail.example.com>",
               "In-Reply-To": ours, "References": ours}  # fmt: skip
    message = EmailMessage()
    for name, value in headers.items():
        message[name] = value
    message.set_content("We paid, the remittance is attached. Please stop.")
    message.add_attachment(b"%PDF-1.7\n" + bytes(range(256)) * 16_000, maintype="application", subtype="pdf",
                           filename="remittance.pdf")  # fmt: skip
    raw = message.as_bytes()
    assert len(raw) > 5 * 1024 * 1024
    out = feedback(deployment, tmp_path, [raw])
    assert "replies: 1 new" in out and "waiting for an answer: cus_1" in out, out
    [paged] = alerts(deployment, "customer_replied")
    assert "cus_1" in paged and "its text was not read: larger than 5 MB" in paged, paged
    held = deployment.run_in_process(rows, "2026-11-08T09:00:00Z")
    assert held.sent_keys == [] and audit_of(deployment, held.run_id) == {"dunning:in_1:1:day7": ("held", "replied")}


def test_a_reply_quoted_in_an_alert_is_never_slack_markup_in_the_webhook_text():
    import datetime as dt

    from dunning.send.alerts import Alert, webhook_payload

    quoted = "cus_1 replied: '<!channel> <https://evil.example/pay|Remittance portal> & <@U123>'"
    alert = Alert("customer_replied", quoted, dt.datetime(2026, 11, 5, tzinfo=dt.UTC), details={"subject": quoted})
    text = webhook_payload(alert)["text"]
    assert "<" not in text and ">" not in text, text
    assert "&lt;!channel&gt; &lt;https://evil.example/pay|Remittance portal&gt; &amp; &lt;@U123&gt;" in text
    assert webhook_payload(alert)["details"] == {"subject": quoted}  # the data itself, as JSON


def test_two_runs_that_both_find_a_reply_unanswered_page_once(deployment, tmp_path):
    """Two shards' plan steps read the unanswered replies before either pages: the page is claimed on the reply,
    so the second run raises nothing (a review found one page per shard)."""
    import datetime as dt

    from dunning.config import DunningConfig
    from dunning.desk import replies
    from dunning.ledger.factory import open_ledger_for

    rows = [invoice()]
    feedback(deployment, tmp_path, [reply(in_reply_to=first_reminder(deployment, rows))])
    config, at = DunningConfig(), dt.datetime(2026, 11, 20, 9, tzinfo=dt.UTC)
    with open_ledger_for(config.ledger, deployment.home) as ledger:
        seen = [replies.waiting(ledger, at, config).ran_out for _ in ("shard 0/2", "shard 1/2")]
        paged = [replies.alert_unanswered(ledger, ran_out, config, as_of=at, run_id=run)
                 for ran_out, run in zip(seen, ("run-0", "run-1"), strict=True)]  # fmt: skip
    assert paged == [1, 0]
    assert deployment.query("SELECT run_id FROM alerts WHERE kind = 'reply_unanswered'") == [("run-0",)]
    [(noted,)] = deployment.query("SELECT unanswered_alert_id FROM customer_replies")
    assert noted == deployment.query("SELECT alert_id FROM alerts WHERE kind = 'reply_unanswered'")[0][0]


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_reply_imported_after_an_ack_but_dated_before_it_still_holds_the_chasing(deployment, tmp_path):
    """Mail delayed or read late: the ack answered the replies on record when it was made, not one that arrived
    after it with an earlier Date (a review found such a reply paged "their reminders wait" and paused nothing)."""
    rows = [invoice()]
    ours = first_reminder(deployment, rows)
    feedback(deployment, tmp_path, [reply(in_reply_to=ours)])  # Thursday 5 November, 10:00
    code, _, err = deployment.cli("ack", "--customer", "cus_1", "--as-of", "2026-11-06T12:00:00Z")
    assert code == 0, err
    late = reply(in_reply_to=ours, message_id="<r2@mail.example.com>", subject="Re: we dispute in_1",
                 text="We dispute in_1, please do not chase.", date="Fri, 06 Nov 2026 11:00:00 +0000")  # fmt: skip
    out = feedback(deployment, tmp_path, [late], "late.mbox")
    assert "waiting for an answer: cus_1" in out, out
    held = deployment.run_in_process(rows, "2026-11-08T09:00:00Z")
    assert held.sent_keys == [] and audit_of(deployment, held.run_id) == {"dunning:in_1:1:day7": ("held", "replied")}

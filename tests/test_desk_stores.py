"""The desk's tables on both ledger backends: promises and what they cover, replies and acknowledgements, notes,
IMAP cursors, a claim's recipients, and every read `dunning customer` makes."""

from __future__ import annotations

import datetime as dt

import polars as pl

from dunning.config import DunningConfig
from dunning.desk import story
from tests.helpers import due_frame
from tests.ledger_backends import backend_fixture  # noqa: F401 - the `backend` fixture

AT = dt.datetime(2026, 11, 4, 9, tzinfo=dt.UTC)


def history(ledger) -> None:
    rows = pl.DataFrame({
        "business_date": [AT.date()], "run_id": ["r1"], "as_of": [AT], "invoice_id": ["in_1"],
        "customer_id": ["c_in_1"], "customer_email": ["Ada@example.com"], "currency": ["USD"], "amount_due": [10000],
        "amount_paid": [0], "remaining_minor": [10000], "due_date": [dt.date(2026, 11, 1)], "status": ["open"],
        "days_overdue": [3], "cycle": [1],
    }).cast({"cycle": pl.Int32, "days_overdue": pl.Int32})  # fmt: skip
    ledger.merge_history_day(AT.date(), rows)


def test_the_desk_tables_on_both_ledgers(backend):
    with backend.open() as ledger:
        history(ledger)
        due = due_frame(["in_1"]).with_columns(pl.lit("x@example.com,cc@example.com").alias("recipients"))
        assert ledger.claim(due, due.clear(), "r1", AT).won == {"dunning:in_1:1:day3"}
        [row] = ledger.emails_by_id([due["message_id"][0]], "message_id").to_dicts()
        assert row["recipients"] == "x@example.com,cc@example.com"
        promise = {
            "promise_id": "p1", "customer_id": "c_in_1", "invoice_id": "in_1", "until": dt.date(2026, 11, 9),
            "amount_minor": 5000, "currency": "USD", "created_at": AT, "created_by": "me", "note": None,
            "owed_minor": 10000, "source": "cli",
        }  # fmt: skip
        assert ledger.add_promise(promise, [("in_1", 1, 10000)]) is True
        assert ledger.add_promise(promise, [("in_1", 1, 10000)]) is False, "one promise id is recorded once"
        assert ledger.promise_ids_on_record(["p1", "p2"]) == {"p1"}
        assert ledger.promise_coverage().select("promise_id", "invoice_id", "cycle").rows() == [("p1", "in_1", 1)]
        assert ledger.latest_invoices(customer_id="c_in_1").get_column("remaining_minor").to_list() == [10000]
        assert ledger.resolve_promise("p1", "broken", AT) and not ledger.resolve_promise("p1", "kept", AT)
        assert ledger.broken_promise_counts().rows() == [("in_1", 1, 1)]
        assert ledger.promises_listed(AT - dt.timedelta(days=1)).get_column("invoices").to_list() == ["in_1"]
        reply = {
            "reply_key": "<r@x>", "customer_id": "c_in_1", "from": "ada@example.com", "subject": "Re: hi",
            "received_at": AT, "matched_by": "message_id", "automatic": False, "pauses": True, "message_id": "<r@x>",
            "in_reply_to": None, "excerpt": "paid", "source": "mbox", "recorded_at": AT,
        }  # fmt: skip
        assert ledger.record_replies([reply]) == {"<r@x>"} and ledger.record_replies([reply]) == set()
        assert ledger.unanswered_replies(AT).get_column("customer_id").to_list() == ["c_in_1"]
        assert ledger.customers_by_address(["ada@example.com"]).rows() == [("ada@example.com", "c_in_1")]
        assert ledger.acknowledge("c_in_1", AT + dt.timedelta(hours=1), "me", "done") == 1
        assert ledger.unanswered_replies(AT).height == 1, "the ack is later than this clock"
        assert ledger.unanswered_replies(AT + dt.timedelta(hours=2)).is_empty()
        ledger.add_note("c_in_1", "called", "me", AT)
        ledger.set_imap_cursor("imaps://u@h:993/INBOX", 7, 42, AT)
        ledger.set_imap_cursor("imaps://u@h:993/INBOX", 7, 43, AT)
        assert ledger.imap_cursor("imaps://u@h:993/INBOX") == (7, 43)
        told = story.customer_story(ledger, "c_in_1", AT + dt.timedelta(days=1), DunningConfig())
    assert told["open_invoices"][0]["days_overdue"] == 4
    events = [e["event"] for e in told["events"]]
    assert sorted(events[:-1]) == ["email", "note", "promise", "promise_broken", "reply"], "all at the same time"
    assert events[-1] == "reply_answered", "the ack an hour later comes last"

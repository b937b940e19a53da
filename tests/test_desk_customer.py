"""One customer's whole story: `dunning customer ID [--json]`, `dunning note`, `dunning report --customer`, and the
analysts' `customer_timeline` and `recovery_by_stage` promise counts. Through the `dunning` command."""

from __future__ import annotations

import json

import duckdb
import pytest

from dunning.ledger.backends.duckdb_ledger import open_ledger
from tests.conftest import invoice
from tests.delivery_messages import write_mbox
from tests.helpers import parsed_html_elements
from tests.test_desk_replies import reply

DAY4 = "2026-11-04T09:00:00Z"


def analytics(deployment, sql: str) -> list[tuple]:
    con = duckdb.connect(str(deployment.home / "analytics.duckdb"), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.mark.slow
def test_the_customer_shows_every_email_promise_reply_and_note_in_order(deployment, tmp_path):
    rows = [invoice(customer_cc="bob@example.com"), invoice(invoice_id="in_2", amount_due=5000)]
    code, _, err = deployment.run(rows, DAY4)
    assert code == 0, err
    ours = deployment.outbox()[0]["Message-ID"]
    box = write_mbox(tmp_path / "r.mbox", [reply(in_reply_to=ours, subject="<b>Re:</b> invoice", date=None)])
    assert deployment.cli("feedback", "--mbox", str(box))[0] == 0
    deployment.cli("ack", "--customer", "cus_1", "--as-of", "2026-11-05T10:00:00Z")
    deployment.cli("promise", "--invoice", "in_1", "--until", "2026-11-09", "--as-of", "2026-11-05T11:00:00Z")
    code, out, err = deployment.cli("note", "--customer", "cus_1", "called, <script>x</script>", "--as-of",
                                    "2026-11-05T12:00:00Z")  # fmt: skip
    assert code == 0 and "note note_" in out, err
    code, _, err = deployment.run(rows, "2026-11-08T09:00:00Z")  # in_1 waits for the promise, in_2's day7 goes
    assert code == 0, err
    code, out, err = deployment.cli("customer", "cus_1", "--json", "--as-of", "2026-11-08T10:00:00Z")
    assert code == 0, err
    story = json.loads(out)
    assert [(i["invoice_id"], i["remaining_minor"], i["days_overdue"], i["stage"]) for i in story["open_invoices"]] == [
        ("in_1", 10000, 7, "day3"), ("in_2", 5000, 7, "day7"),
    ]  # fmt: skip
    events = [e["event"] for e in story["events"]]
    assert events.index("email") < events.index("promise") < events.index("note") < len(events)
    emails = [e for e in story["events"] if e["event"] == "email"]
    assert [e["keys"] for e in emails] == [["dunning:in_1:1:day3", "dunning:in_2:1:day3"], ["dunning:in_2:1:day7"]]
    assert emails[0]["recipients"] == ["ada@example.com", "bob@example.com"] and emails[0]["outcome"] == "sent"
    assert emails[0]["stages"] == ["day3"]
    waiting = [e for e in story["events"] if e["event"] == "waiting"]
    assert [(w["keys"], w["why"]) for w in waiting] == [(["dunning:in_1:1:day7"], "promised")]
    assert {"reply", "reply_answered", "promise", "note"} <= set(events)
    times = [e["at"] for e in story["events"]]
    assert times == sorted(times), "one chronological list"
    code, text, _ = deployment.cli("customer", "cus_1")
    assert "open invoices: 2" in text and "promise" in text and "called" in text
    page = tmp_path / "cus_1.html"
    code, out, err = deployment.cli("report", "--customer", "cus_1", "--out", str(page))
    assert code == 0, err
    html = page.read_text()
    assert "<script>" not in html and "&lt;script&gt;" in html and "&lt;b&gt;Re:" in html
    assert "dunning:in_2:1:day7" in html
    assert all(tag not in ("script", "link", "img", "iframe") for tag, _ in parsed_html_elements(html))
    timeline = analytics(deployment, "SELECT event FROM customer_timeline WHERE customer_id = 'cus_1' ORDER BY \"at\"")
    assert {"email_reminder", "promise", "reply", "reply_answered", "note"} <= {e for (e,) in timeline}
    assert analytics(deployment, "SELECT sum(promises_kept), sum(promises_broken) FROM recovery_by_stage") == [(0, 0)]


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_an_unknown_customer_is_refused(deployment):
    deployment.run_in_process([invoice()], DAY4)
    code, _, err = deployment.cli("customer", "cus_404")
    assert code == 2 and "customer cus_404 is unknown" in err
    code, _, err = deployment.cli("note", "--customer", "cus_404", "hello")
    assert code == 2 and "unknown" in err
    assert deployment.query("SELECT count(*) FROM customer_notes") == [(0,)]


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_recovery_by_stage_counts_promises_kept_and_broken(deployment):
    rows = [invoice(), invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bob@example.com")]
    deployment.run_in_process(rows, DAY4)
    for target in ("in_1", "in_2"):
        deployment.cli("promise", "--invoice", target, "--until", "2026-11-05", "--as-of", "2026-11-04T10:00:00Z")
    later = [invoice(status="paid", amount_paid=10000), rows[1]]
    deployment.run_in_process(later, "2026-11-08T09:00:00Z")  # in_1 kept, in_2 broken
    with open_ledger(deployment.home / "dunning.duckdb") as ledger:
        view = ledger.recovery_by_stage()
    counts = view.select("stage", "promises_kept", "promises_broken").rows()
    assert counts == [("day3", 1, 1), ("day7", 0, 0)], "each counts for the reminder before it (in_2's day7 after)"

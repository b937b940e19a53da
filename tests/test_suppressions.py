"""Suppressions (guarantee 15): no one is mailed after they bounced or complained, and nothing is lost.

`dunning suppress` / `unsuppress` through the command; the check by the plan (keys wait with reason `suppressed`) and
inside the claim's transaction (a suppression recorded while a run sends); one `contact_suppressed` alert per customer
and address; `dunning status` and the analysts' view list who needs a new contact.
"""

from __future__ import annotations

import datetime as dt
import json

import duckdb
import polars as pl
import pytest

from dunning.ledger.backends.duckdb_ledger import open_ledger
from tests.conftest import invoice
from tests.ledger_backends import backend_fixture  # noqa: F401 - the `backend` fixture

DAY4 = "2026-11-04T09:00:00Z"  # due 2026-11-01: day3 reached
DAY8 = "2026-11-08T09:00:00Z"  # day7 reached


def held(deployment, run_id: str) -> dict[str, str | None]:
    rows = deployment.query("SELECT idempotency_key, reason FROM dunning_audit WHERE run_id = ?", [run_id])
    return dict(rows)


def alerts(deployment, kind: str = "contact_suppressed") -> list[dict]:
    rows = deployment.query("SELECT message, details FROM alerts WHERE kind = ? ORDER BY created_at", [kind])
    return [{"message": m, "details": json.loads(d) if isinstance(d, str) else d} for m, d in rows]


@pytest.mark.slow
def test_a_suppressed_address_gets_nothing_its_keys_wait_and_go_once_it_is_lifted(deployment):
    rows = [invoice(customer_email="Ada@Example.com"), invoice(invoice_id="in_2", customer_id="cus_2",
                                                                customer_email="bob@example.com")]  # fmt: skip
    code, out, err = deployment.cli("suppress", "--email", "ADA@example.COM", "--reason", "mailbox closed")
    assert code == 0, err
    assert "suppressed ada@example.com" in out
    first = deployment.run_in_process(rows, DAY4)
    assert first.sent_keys == ["dunning:in_2:1:day3"], "only the address not suppressed is mailed"
    assert held(deployment, first.run_id)["dunning:in_1:1:day3"] == "suppressed"
    assert deployment.ledger("invoice_id = 'in_1'") == [], "nothing of a waiting key is on record"
    [alert] = alerts(deployment)
    assert alert["details"] == {"customer_id": "cus_1", "email": "ada@example.com"}
    deployment.run_in_process(rows, "2026-11-05T09:00:00Z")
    assert len(alerts(deployment)) == 1, "one alert per customer and address, not one per run"
    code, out, _ = deployment.cli("status")
    assert "suppressed addresses: 1" in out and "ada@example.com (manual" in out and "mailbox closed" in out
    assert "customers who need a new contact: 1" in out and "cus_1: ada@example.com" in out
    code, out, err = deployment.cli("unsuppress", "--email", "ada@EXAMPLE.com")
    assert code == 0, err
    later = deployment.run_in_process(rows, DAY8)
    assert later.sent_keys == ["dunning:in_1:1:day7", "dunning:in_2:1:day7"], "the stage reached by then, once"
    assert [r["status"] for r in deployment.ledger("invoice_id = 'in_1'")] == ["skipped", "sent"]


@pytest.mark.slow
def test_suppress_until_a_date_holds_through_that_day_only(deployment):
    assert deployment.cli("suppress", "--email", "ada@example.com", "--until", "2026-11-04")[0] == 0
    assert deployment.run_in_process([invoice()], DAY4).sent_keys == []
    assert deployment.run_in_process([invoice()], "2026-11-05T09:00:00Z").sent_keys == ["dunning:in_1:1:day3"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["suppress", "--email", "not an address"], "--email is not one email address"),
        (["suppress", "--email", "a@example.com\nBcc: x@evil.test"], "--email is not one email address"),
        (["suppress", "--email", "a@example.com", "--until", "someday"], "--until 'someday' is not a date"),
        (["unsuppress", "--email", "nobody@example.com"], "nobody@example.com is not suppressed"),
    ],
)
def test_bad_suppress_input_is_exit_2_in_one_line(deployment, args, says):
    code, _, err = deployment.cli(*args)
    assert code == 2 and says in err and "Traceback" not in err
    assert "Bcc" not in err


def test_a_suppression_recorded_while_a_run_sends_holds_what_it_has_not_claimed(tmp_path, backend):
    due = pl.DataFrame({
        "idempotency_key": ["dunning:in_1:1:day3", "dunning:in_2:1:day3", "escalation:in_1:1"],
        "kind": ["reminder", "reminder", "escalation"], "invoice_id": ["in_1", "in_2", "in_1"],
        "customer_id": ["cus_1", "cus_2", "cus_1"],
        "customer_email": ["Ada@example.com", "bob@example.com", "Ada@example.com"], "cycle": [1, 1, 1],
        "stage": ["day3", "day3", None], "status": ["claimed"] * 3, "amount_minor": [100, 100, 100],
        "currency": ["USD"] * 3, "email_id": ["e1", "e2", "x"], "message_id": ["<m1>", "<m2>", "<x>"],
        "run_id": ["r"] * 3, "claimed_at": [dt.datetime(2026, 11, 4, tzinfo=dt.UTC)] * 3, "role": ["due"] * 3,
        "email_group": ["g1", "g2", "g3"], "policy": ["default"] * 3, "stage_days": [3, 3, None],
    }, schema_overrides={"cycle": pl.Int32})  # fmt: skip
    with backend.open() as ledger:
        ledger.suppress("ada@example.com", "hard_bounce", "test", dt.datetime(2026, 11, 4, tzinfo=dt.UTC))
        result = ledger.claim(due, due.clear(), "r", dt.datetime(2026, 11, 4, 9, tzinfo=dt.UTC))
    assert result.suppressed == {"dunning:in_1:1:day3"}, "an escalation is not an email: no address holds it"
    assert result.won == {"dunning:in_2:1:day3", "escalation:in_1:1"}


@pytest.mark.slow
def test_the_analysts_see_who_needs_a_new_contact(deployment):
    deployment.cli("suppress", "--email", "ada@example.com")
    run = deployment.run_in_process([invoice()], DAY4)
    assert run.sent_keys == []
    with open_ledger(deployment.home / "dunning.duckdb") as ledger:
        ledger.publish(deployment.home)
    con = duckdb.connect(str(deployment.home / "analytics.duckdb"), read_only=True)
    try:
        rows = con.execute("SELECT customer_id, email, reason FROM contacts_to_fix").fetchall()
    finally:
        con.close()
    assert rows == [("cus_1", "ada@example.com", "manual")]

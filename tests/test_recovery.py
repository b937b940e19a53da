"""Did the reminders bring the money in: `recovery_by_stage` and `collections_daily` for analysts (the ledger's own
query on both backends), the dunning_audit asset's recovery table, and `dunning report --out FILE.html`."""

from __future__ import annotations

import re

import duckdb
import pytest

from dunning.ledger.backends.duckdb_ledger import open_ledger
from tests.conftest import invoice

DAY4 = "2026-11-04T09:00:00Z"


def paid_on_the_6th(deployment):
    rows = [invoice(), invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bob@example.com")]
    assert len(deployment.run_in_process(rows, DAY4).sent_keys) == 2
    rows[0] = invoice(status="paid", amount_paid=10000)
    deployment.run_in_process(rows, "2026-11-06T09:00:00Z")
    with open_ledger(deployment.home / "dunning.duckdb") as ledger:
        ledger.publish(deployment.home)
        return ledger.recovery_by_stage()


def analytics(deployment, sql: str) -> list[tuple]:
    con = duckdb.connect(str(deployment.home / "analytics.duckdb"), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.mark.slow
def test_recovery_by_stage_counts_reminders_followed_by_payment(deployment):
    from_ledger = paid_on_the_6th(deployment)
    view = analytics(deployment, "SELECT * FROM recovery_by_stage")
    # late fees claimed and collected (`dunning.fees`), promises kept and broken (`dunning.desk`): none here
    assert view == [("default", "day3", "USD", 2, 1, 1, 10000, 2.0, 0, 0, 0, 0)]
    assert [tuple(r.values()) for r in from_ledger.to_dicts()] == view, "the ledger's query is the view's"


@pytest.mark.slow
def test_collections_daily_tracks_overdue_amounts_reminders_and_recoveries(deployment):
    paid_on_the_6th(deployment)
    rows = analytics(deployment, "SELECT * FROM collections_daily ORDER BY business_date")
    assert rows == [
        (__import__("datetime").date(2026, 11, 4), "USD", 2, 2, 20000, 2, 0),
        (__import__("datetime").date(2026, 11, 6), "USD", 1, 1, 10000, 0, 10000),
    ]


@pytest.mark.slow
def test_the_report_is_one_self_contained_page_with_charts_and_nothing_fetched(deployment, tmp_path):
    rows = [invoice(customer_name="<script>alert(1)</script>")]
    assert deployment.run(rows, DAY4)[0] == 0
    assert deployment.run([invoice(status="paid", amount_paid=10000)], "2026-11-06T09:00:00Z")[0] == 0
    out = tmp_path / "report.html"
    code, text, err = deployment.cli("report", "--out", str(out))
    assert code == 0, err
    assert str(out) in text
    page = out.read_text()
    # the funnel and recovery by stage and policy; two days of history are too few for the overdue amount over time,
    # which the page says in words (`tests/test_first_hour.py` draws it)
    assert page.count("<svg") >= 2, "the funnel, recovery by stage and policy"
    assert "this page draws the overdue amount of each currency over time" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "nothing is fetched from the network"
    assert "<script" not in page
    assert "Recovery by stage and policy" in page and "day3" in page
    metadata = deployment.latest_materialization("dunning_audit").metadata
    assert "recovery" in metadata and "day3" in metadata["recovery"].value


def test_a_report_without_history_says_so_in_one_line(deployment, tmp_path):
    code, _, err = deployment.cli("report", "--out", str(tmp_path / "r.html"))
    assert code == 2 and "no history" in err and "Traceback" not in err

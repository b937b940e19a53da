"""A stale snapshot never reopens what a newer one closed; a whole stale snapshot is refused unless allowed."""

import pytest

from tests.conftest import invoice

OPEN_9TH = invoice(due_date="2026-11-01", snapshot_at="2026-11-09T08:00:00Z")
PAID_10TH = invoice(due_date="2026-11-01", status="paid", amount_paid=10000, snapshot_at="2026-11-10T08:00:00Z")


@pytest.mark.slow
def test_yesterdays_export_loaded_after_todays_reminds_no_one_who_paid(deployment):
    assert deployment.run_in_process([OPEN_9TH], "2026-11-09T09:00:00Z").sent_keys == ["dunning:in_1:1:day7"]
    assert len(deployment.outbox()) == 1
    deployment.run_in_process([PAID_10TH], "2026-11-10T09:00:00Z")
    code, out, err = deployment.run([OPEN_9TH], "2026-11-10T12:00:00Z")
    assert code == 2 and "Traceback" not in err
    assert (
        "snapshot taken at 2026-11-09T08:00:00+00:00 is older than the last applied one "
        "(taken at 2026-11-10T08:00:00+00:00" in err
    )
    code, out, err = deployment.run([OPEN_9TH], "2026-11-10T12:00:00Z", "--allow-stale")
    assert code == 0, err
    assert len(deployment.outbox()) == 1, "the cycle the paid snapshot closed stays closed"
    assert deployment.query("SELECT cycle, cycle_open FROM invoice_cycles") == [(1, False)]
    # a genuinely newer snapshot that shows the invoice open again (a chargeback) does start a new cycle
    reopened = invoice(due_date="2026-11-01", snapshot_at="2026-11-12T08:00:00Z")
    assert deployment.run([reopened], "2026-11-12T09:00:00Z")[0] == 0
    assert deployment.query("SELECT cycle, cycle_open FROM invoice_cycles") == [(2, True)]
    assert len(deployment.outbox()) == 2


@pytest.mark.slow
def test_without_snapshot_at_the_runs_clock_dates_the_snapshot(deployment):
    open_row, paid_row = invoice(), invoice(status="paid", amount_paid=10000)
    deployment.run_in_process([open_row], "2026-11-09T09:00:00Z")
    deployment.run_in_process([paid_row], "2026-11-10T09:00:00Z")
    code, _, err = deployment.run([open_row], "2026-11-10T08:00:00Z")
    assert code == 2 and "older than the last applied one" in err
    assert deployment.run([open_row], "2026-11-10T08:00:00Z", "--allow-stale")[0] == 0
    assert len(deployment.outbox()) == 1

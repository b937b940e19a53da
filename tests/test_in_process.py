"""The in-process cycle (`tests/in_process.py`) that the long policy tests use stays the CLI's cycle.

The same days through `dunning run` in one home and through the in-process
composition in another must leave the same ledger, cycles, history, audit
outcomes and emails. If an asset ever composes the steps differently, this
fails and the policy tests that lean on the in-process runner are no longer
trusted.
"""

from __future__ import annotations

import pytest

from tests.conftest import Deployment, invoice

SEQUENCE = [  # (as_of, rows): stages crossed, a grouped customer, one invoice paid and one reopened
    (
        "2026-11-04T09:00:00Z",
        [
            invoice(),
            invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bo@example.com", amount_paid=2500),
            invoice(invoice_id="in_3", customer_id="cus_2", customer_email="bo@example.com", due_date="2026-10-20"),
        ],
    ),
    (
        "2026-11-08T09:00:00Z",
        [
            invoice(status="paid", amount_paid=10000),
            invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bo@example.com", amount_paid=2500),
            invoice(invoice_id="in_3", customer_id="cus_2", customer_email="bo@example.com", due_date="2026-10-20"),
        ],
    ),
    (
        "2026-11-20T09:00:00Z",
        [
            invoice(due_date="2026-11-12"),
            invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bo@example.com", amount_paid=2500),
            invoice(invoice_id="in_3", customer_id="cus_2", customer_email="bo@example.com", due_date="2026-10-20"),
        ],
    ),
]


def _state(deployment: Deployment) -> dict:
    ledger = deployment.query(
        "SELECT idempotency_key, kind, status, attempts, customer_id, stage, amount_minor, email_id "
        "FROM reminder_ledger ORDER BY 1"
    )
    emails = sorted(
        (m["To"], m["Subject"], m["X-Dunning-Keys"], m.get_body(("plain",)).get_content()) for m in deployment.outbox()
    )
    return {
        "ledger": ledger,
        "emails": emails,
        "cycles": deployment.query(
            "SELECT invoice_id, cycle, cycle_open, opened_at, closed_at FROM invoice_cycles ORDER BY ALL"
        ),
        "history": deployment.query(
            "SELECT business_date, invoice_id, cycle, days_overdue, remaining_minor FROM invoice_history_daily "
            "ORDER BY ALL"
        ),
        "audit": deployment.query(
            "SELECT as_of, idempotency_key, outcome, reason, amount_stated_minor FROM dunning_audit ORDER BY ALL"
        ),
    }


@pytest.mark.slow
def test_the_in_process_cycle_leaves_what_the_cli_leaves(tmp_path, monkeypatch):
    cli, in_process = Deployment(tmp_path / "cli"), Deployment(tmp_path / "in_process")
    monkeypatch.setenv("DUNNING_MESSAGE_SECRET", "one secret for both homes, 32 chars")  # the same Message-IDs
    for home in (cli.home, in_process.home):
        home.mkdir(parents=True)
        (home / "config.yaml").write_text("message_secret_env: DUNNING_MESSAGE_SECRET\n")
    for as_of, rows in SEQUENCE:
        code, _, err = cli.run(rows, as_of)
        assert code == 0, err
        assert in_process.run_in_process(rows, as_of).verdict.passed
    expected, actual = _state(cli), _state(in_process)
    assert len(expected["emails"]) >= 4 and any(row[2] == "sent" for row in expected["ledger"])
    for part in expected:
        assert actual[part] == expected[part], part

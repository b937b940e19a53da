"""Review of issue 35 (round 4): what a hostile environment and a hurried operator still found, each test failing on
the code before its fix."""

from __future__ import annotations

import pytest

from tests.conftest import invoice
from tests.escalation_receiver import EscalationServer, Receiver
from tests.test_escalations_round4 import ENV, SECRET, at, config

QUIET = "policies:\n  - {name: quiet, match: {segment: [quiet]}, escalation: null}\n"


def test_a_failed_escalation_whose_invoice_no_longer_escalates_stops_nothing_else(deployment, tmp_path, monkeypatch):
    """The receiver was down (500); the operator moves the invoice to a policy that does not escalate. Its failed key
    is no longer retried, and the run (another invoice's escalation, the emails) goes on: it used to end in a KeyError
    after the claim, every hour."""
    monkeypatch.setenv(ENV, SECRET)
    first = [invoice(due_date="2026-10-10")]
    receiver = Receiver(SECRET, statuses=[500])
    with EscalationServer(receiver) as server:
        path = config(tmp_path, server.url, "retry: {max_attempts: 3, backoff_minutes: 1}\n" + QUIET)
        deployment.run_in_process(first, at(9), path)
        assert deployment.ledger("kind = 'escalation'")[0]["status"] == "failed"
        moved = [invoice(due_date="2026-10-10", segment="quiet"),
                 invoice(invoice_id="in_2", customer_id="cus_2", customer_email="b@example.com",
                         due_date="2026-10-10")]  # fmt: skip
        result = deployment.run_in_process(moved, at(10), path)
    assert receiver.keys_requested() == {"escalation:in_1:1": 1, "escalation:in_2:1": 1}
    assert "escalation:in_2:1" in result.sent_keys
    states = {r["idempotency_key"]: r["status"] for r in deployment.ledger("kind = 'escalation'")}
    assert states == {"escalation:in_1:1": "failed", "escalation:in_2:1": "sent"}

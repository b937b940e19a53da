"""The `charges` table on both databases: claimed in the reminder's claim transaction, once, never moved back."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from dunning.fees.planning import CHARGE_SCHEMA
from tests.helpers import due_frame
from tests.ledger_backends import backend_fixture  # noqa: F401 - the fixture: both databases

AS_OF = dt.datetime(2026, 11, 20, 9, tzinfo=dt.UTC)
NO_SKIPS = pl.DataFrame(schema=due_frame(["x"]).schema)


def charges_for(invoice_ids: list[str], stage: str = "day3") -> pl.DataFrame:
    rows = [
        {"charge_key": f"fee:{i}:1:{kind}", "reminder_key": f"dunning:{i}:1:{stage}", "invoice_id": i,
         "customer_id": "c_" + i, "cycle": 1, "kind": kind, "amount_minor": 4000 if kind == "compensation" else 123,
         "currency": "EUR", "basis": "test", "status": "proposed", "policy": "default", "stage": stage,
         "customer_type": "business", "balance_minor": 100}
        for i in invoice_ids for kind in ("compensation", "interest")
    ]  # fmt: skip
    return pl.DataFrame(rows, schema=CHARGE_SCHEMA)


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_charge_is_claimed_with_its_reminder_once_and_only_when_the_reminder_is_won(backend):
    with backend.open() as ledger, backend.open() as other:
        due = due_frame(["in_1", "in_2"])
        won = ledger.claim(due, NO_SKIPS, "run-a", AS_OF, charges=charges_for(["in_1", "in_2"]))
        assert len(won.won) == 2 and len(won.charges) == 4
        # another run claims the same reminders with the same charges: it wins nothing, and no charge is added
        lost = other.claim(due, NO_SKIPS, "run-b", AS_OF, charges=charges_for(["in_1", "in_2"]))
        assert lost.won == set() and lost.charges == set()
        # a later stage's reminder of the same cycle carries the same keys: the reminder is won, the charge is not
        later = due_frame(["in_1"]).with_columns(pl.lit("dunning:in_1:1:day7").alias("idempotency_key"))
        again = ledger.claim(later, NO_SKIPS, "run-c", AS_OF, charges=charges_for(["in_1"], "day7"))
        assert again.won == {"dunning:in_1:1:day7"} and again.charges == set()
        rows = ledger.charges()
        assert rows.height == 4 and set(rows.get_column("run_id")) == {"run-a"}
        assert set(rows.get_column("amount_minor")) == {4000, 123}


def test_decisions_and_posts_move_only_the_status_they_expect(backend):
    with backend.open() as ledger:
        ledger.claim(due_frame(["in_1"]), NO_SKIPS, "run-a", AS_OF, charges=charges_for(["in_1"]))
        assert ledger.claim_post(["fee:in_1:1:compensation"], "run-p", AS_OF) == set()  # proposed: not yet
        assert len(ledger.decide_charges(approve=True, invoice_id="in_1", by="op", at=AS_OF)) == 2
        assert ledger.claim_post(["fee:in_1:1:compensation"], "run-p", AS_OF) == {"fee:in_1:1:compensation"}
        assert ledger.claim_post(["fee:in_1:1:compensation"], "run-q", AS_OF) == set()  # taken once
        assert ledger.record_post(["fee:in_1:1:compensation"], "posted", at=AS_OF) == 1
        assert ledger.record_post(["fee:in_1:1:compensation"], "failed", at=AS_OF) == 0  # a late outcome: ignored
        waived = ledger.decide_charges(approve=False, invoice_id="in_1", by="op", at=AS_OF, note="goodwill")
        assert waived == ["fee:in_1:1:interest"]  # a posted charge is not waived here
        statuses = dict(ledger.charges().select("charge_key", "status").iter_rows())
        assert statuses == {"fee:in_1:1:compensation": "posted", "fee:in_1:1:interest": "waived"}


def test_a_failed_charge_whose_item_is_on_a_fee_invoice_is_not_waived_here(backend):
    """Its item is on a Stripe invoice (a finalize refused after the items went on): Stripe bills it, so a waive
    in the ledger alone would hide a charge the customer is asked to pay; the failed one without an item goes."""
    with backend.open() as ledger:
        ledger.claim(due_frame(["in_1"]), NO_SKIPS, "run-a", AS_OF, charges=charges_for(["in_1"]))
        ledger.decide_charges(approve=True, invoice_id="in_1", by="op", at=AS_OF)
        keys = ["fee:in_1:1:compensation", "fee:in_1:1:interest"]
        assert ledger.claim_post(keys, "run-p", AS_OF) == set(keys)
        ledger.note_external(keys, "in_fee1", {"fee:in_1:1:compensation": "ii_1"}, AS_OF)
        assert ledger.record_post(keys, "failed", at=AS_OF, error="finalize refused") == 2
        assert ledger.decide_charges(approve=False, invoice_id="in_1", by="op", at=AS_OF) == ["fee:in_1:1:interest"]
        statuses = dict(ledger.charges().select("charge_key", "status").iter_rows())
        assert statuses == {"fee:in_1:1:compensation": "failed", "fee:in_1:1:interest": "waived"}

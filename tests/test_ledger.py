"""The ledger's safety net, on a real DuckDB file and a real PostgreSQL database (`backend`): the key is unique,
claims race safely, crashes become unknown."""

import datetime as dt
import threading

import polars as pl
import pytest

from dunning.config import DunningConfig
from dunning.email.render import reminder_email
from dunning.errors import LedgerBusy
from dunning.ledger.backends.duckdb_ledger import open_ledger
from dunning.send.providers.file_outbox import FileOutbox
from dunning.send.resubmission import resolve_unknown
from dunning.send.sending import send_due, with_email_ids
from tests.helpers import due_frame, minted_ids
from tests.ledger_backends import backend_fixture  # noqa: F401 - the fixture: each test below runs on both databases

AS_OF = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)


def due_rows(n: int, customer: str = "c1") -> pl.DataFrame:
    frame = pl.DataFrame(
        {
            "idempotency_key": [f"dunning:in_{i}:1:day3" for i in range(n)],
            "kind": ["reminder"] * n,
            "invoice_id": [f"in_{i}" for i in range(n)],
            "customer_id": [customer] * n,
            "customer_email": ["ada@example.com"] * n,
            "customer_name": ["Ada"] * n,
            "cycle": pl.Series([1] * n, dtype=pl.Int32),
            "stage": ["day3"] * n,
            "stage_days": pl.Series([3] * n, dtype=pl.Int32),
            "amount_minor": [1000] * n,
            "amount_due": [1000] * n,
            "amount_paid": [0] * n,
            "currency": ["USD"] * n,
            "due_date": [dt.date(2026, 11, 1)] * n,
            "days_overdue": [4] * n,
            "tone": ["gentle"] * n,
            "billing_period": [None] * n,
        }
    )
    return with_email_ids(frame, DunningConfig(group_by="invoice"), minted_ids())


NO_SKIPS = due_rows(1).head(0)


def test_the_primary_key_refuses_a_second_row_for_a_key(backend):
    with backend.open() as ledger:
        assert ledger.claim(due_rows(1), NO_SKIPS, "run-1", AS_OF).won == {"dunning:in_0:1:day3"}
        assert ledger.claim(due_rows(1), NO_SKIPS, "run-2", AS_OF).won == set()
        with pytest.raises(backend.duplicate_error):
            ledger.con.execute(
                "INSERT INTO reminder_ledger (idempotency_key, kind, customer_id, status) "
                "VALUES ('dunning:in_0:1:day3', 'reminder', 'c1', 'claimed')"
            )
        assert ledger.con.execute("SELECT count(*), min(run_id) FROM reminder_ledger").fetchone() == (1, "run-1")


def test_two_overlapping_claimers_cannot_both_own_a_key(backend):
    with backend.open() as ledger, backend.open() as first, backend.open() as second:
        barrier, won = threading.Barrier(2), {}

        def claim(name, claimer):
            barrier.wait()
            won[name] = claimer.claim(due_rows(50), NO_SKIPS, name, AS_OF).won

        threads = [threading.Thread(target=claim, args=(n, c)) for n, c in (("a", first), ("b", second))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not (won["a"] & won["b"])
        assert len(won["a"] | won["b"]) == 50
        owners = dict(ledger.con.execute("SELECT idempotency_key, run_id FROM reminder_ledger").fetchall())
        assert all(owners[k] == "a" for k in won["a"]) and all(owners[k] == "b" for k in won["b"])


def test_a_claim_without_outcome_becomes_unknown_and_lookup_resolves_it(tmp_path, backend):
    outbox = FileOutbox(tmp_path / "outbox")
    due = due_rows(2)
    with backend.open() as ledger:
        ledger.claim(due, NO_SKIPS, "crashed-run", AS_OF)
        # the crashed run had handed in_0's email to the provider before dying, but not in_1's
        first = due.row(0, named=True)
        outbox.send(
            reminder_email(
                [{**first, "tone": "gentle"}], sender="b@example.com", message_id=first["message_id"], as_of=AS_OF
            )
        )
        assert ledger.expire_stale_claims("next-run", AS_OF) == 2
        statuses = dict(ledger.con.execute("SELECT idempotency_key, status FROM reminder_ledger").fetchall())
        assert set(statuses.values()) == {"unknown"}
        assert resolve_unknown(ledger, outbox, DunningConfig().provider, AS_OF, backoff_minutes=30).by_lookup == 2
        statuses = dict(ledger.con.execute("SELECT idempotency_key, status FROM reminder_ledger").fetchall())
        assert statuses == {"dunning:in_0:1:day3": "sent", "dunning:in_1:1:day3": "failed"}


def test_send_due_claims_before_sending_and_records_outcomes(tmp_path, backend):
    outbox = FileOutbox(tmp_path / "outbox")
    with backend.open() as ledger:
        config = DunningConfig(group_by="invoice", claim_chunk_size=2)
        report, outcomes = send_due(
            ledger, outbox, due_rows(5), NO_SKIPS, config=config, run_id="r1", as_of=AS_OF, now=lambda: AS_OF
        )
        assert (report.claimed, report.sent, report.emails) == (5, 5, 5)
        assert len(list((tmp_path / "outbox").glob("*.eml"))) == 5
        again, _ = send_due(
            ledger, outbox, due_rows(5), NO_SKIPS, config=config, run_id="r2", as_of=AS_OF, now=lambda: AS_OF
        )
        assert (again.claimed, again.lost, again.emails) == (0, 5, 0)


@pytest.mark.slow
def test_a_held_lock_ends_in_a_clear_busy_error(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "d.duckdb"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb,time; c=duckdb.connect({str(path)!r}); print('held', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LedgerBusy, match="held by another process"), open_ledger(path, timeout_seconds=0.5):
            pass
    finally:
        holder.kill()
        holder.wait()
    with open_ledger(path, timeout_seconds=5) as ledger:  # released as soon as the holder dies
        assert ledger.con.execute("SELECT 1").fetchone() == (1,)


def test_vectorized_email_ids_equal_the_key_function():
    frame = (
        due_rows(5)
        .drop("email_group", "email_id", "message_id")
        .with_columns(pl.Series("customer_id", ["a", "a", "b", "c", "c"]), pl.Series("customer_email", ["x@e.com"] * 5))
    )
    ids = minted_ids()
    grouped = with_email_ids(frame, DunningConfig(group_by="customer"), ids)
    for _group, members in grouped.group_by("email_group"):
        keys = members.get_column("idempotency_key").to_list()
        assert set(members.get_column("email_id")) == {ids.email_id(keys)}
        assert members.get_column("message_id")[0] == f"<{ids.email_id(keys)}@example.com>" == ids.message_id(keys)


@pytest.mark.slow
def test_send_due_gives_unnumbered_keys_their_message_ids_and_keeps_existing_ones(tmp_path, backend):
    """The plan carries no Message-IDs for new keys; each chunk gets them at claim time (signed with the secret the
    send made in the ledger), a retry keeps its own."""
    from dunning.keys import MessageIds

    fresh = (
        due_rows(3)
        .drop("email_group", "email_id", "message_id")
        .with_columns(
            pl.Series("customer_id", ["a", "a", "b"]),
            pl.lit(None, dtype=pl.String).alias("email_id"),
            pl.lit(None, dtype=pl.String).alias("message_id"),
        )
    )
    fresh = fresh.with_columns(
        pl.concat_str([pl.col("customer_id"), pl.col("customer_email")], separator="|").alias("email_group")
    )
    retry = (
        due_rows(4)
        .tail(1)
        .with_columns(
            pl.lit("kept-id").alias("email_id"),
            pl.lit("<kept-id@example.com>").alias("message_id"),
            pl.lit("kept-id").alias("email_group"),
        )
    )
    due = pl.concat([fresh, retry.select(fresh.columns)])
    config = DunningConfig(group_by="customer", claim_chunk_size=1)  # one email per chunk
    with backend.open() as ledger:
        report, outcomes = send_due(
            ledger,
            FileOutbox(tmp_path / "outbox"),
            due,
            NO_SKIPS,
            config=config,
            run_id="r",
            as_of=AS_OF,
            now=lambda: AS_OF,
        )
        stored = dict(ledger.con.execute("SELECT idempotency_key, message_id FROM reminder_ledger").fetchall())
        email_id = MessageIds("example.com", (bytes.fromhex(ledger.message_secret()),)).email_id
    assert report.emails == 3 and report.sent == 4
    a_keys = ["dunning:in_0:1:day3", "dunning:in_1:1:day3"]
    assert stored["dunning:in_0:1:day3"] == stored["dunning:in_1:1:day3"] == f"<{email_id(a_keys)}@example.com>"
    assert stored["dunning:in_2:1:day3"] == f"<{email_id(['dunning:in_2:1:day3'])}@example.com>"
    assert stored["dunning:in_3:1:day3"] == "<kept-id@example.com>"
    assert sorted(p.name for p in (tmp_path / "outbox").iterdir()) == sorted(
        f"{i}_example.com.eml" for i in (email_id(a_keys), email_id(["dunning:in_2:1:day3"]), "kept-id")
    )


def test_reminders_sent_counts_claimed_sent_and_adopted_per_invoice_and_cycle_and_none_on_a_new_ledger(backend):
    """The count the templates' first contact is judged on (`ScheduleStore.reminders_sent`): on a ledger with no
    reminder that may have reached anyone, an empty frame of its schema without asking about the invoices (a new
    deployment's million); else each asked (invoice, cycle) with one."""
    from dunning.ledger.stores.schedule_store import REMINDERS_SENT_SCHEMA

    at = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
    asked = pl.DataFrame(
        {"invoice_id": ["in_1", "in_2", "in_3"], "cycle": [1, 1, 1]}, schema_overrides={"cycle": pl.Int32}
    )
    due = due_frame(["in_1", "in_2"])
    with backend.open() as ledger:
        empty = ledger.reminders_sent(asked)
        assert empty.schema == REMINDERS_SENT_SCHEMA and empty.height == 0
        ledger.claim(due.head(1), due.tail(1), "run-1", at, lease_until=at)  # in_1 claimed, in_2 recorded skipped
        counted = ledger.reminders_sent(asked)
        assert counted.schema == REMINDERS_SENT_SCHEMA
        assert counted.rows() == [("in_1", 1, 1)], "a skipped key reached no one"

"""Racing claimers on the real databases: the cap holds, workers never deadlock each other, a deadlock or a lost
race loses only its chunk, leases protect a live worker's claims; and the PostgreSQL connection layer (frames,
registered tables, placeholders, the guard's probe) behaves as DuckDB's does.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
from collections.abc import Iterator

import polars as pl
import psycopg
import pytest

from dunning.config import DunningConfig
from dunning.ledger.backends.duckdb_ledger import open_ledger
from dunning.ledger.backends.pg_connection import translate
from dunning.ledger.backends.pg_ledger import open_postgres_ledger
from dunning.ledger.schema.migrations import LATEST
from dunning.ledger.schema.tables import DDL
from dunning.ledger.stores.claims import ClaimCap
from dunning.send.sending import with_email_ids
from tests.helpers import minted_ids
from tests.ledger_backends import Backend, backend_fixture  # noqa: F401 - the fixture: both databases
from tests.test_ledger import AS_OF, NO_SKIPS, due_rows

HOUR = dt.timedelta(hours=1)


def rows_for(customer: str, invoices: list[str]) -> pl.DataFrame:
    """Day-3 keys of `invoices` for `customer`, one email per invoice."""
    base = due_rows(len(invoices), customer).drop("email_group", "email_id", "message_id")
    frame = base.with_columns(
        pl.Series("invoice_id", invoices), pl.Series("idempotency_key", [f"dunning:{i}:1:day3" for i in invoices])
    )
    return with_email_ids(frame, DunningConfig(group_by="invoice"), minted_ids())


@contextlib.contextmanager
def writers(backend, n: int) -> Iterator[list]:
    """`n` more writers on the ledger, each opened again (`Backend.open`), closed together."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(backend.open()) for _ in range(n)]


def race(claimers: list, jobs: list) -> list:
    """Run `job(claimer)` for each pair at once (a barrier starts them together); their results in order."""
    barrier, results = threading.Barrier(len(claimers)), [None] * len(claimers)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = jobs[i](claimers[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(claimers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a claimer hung"
    return results


@pytest.mark.slow
def test_racing_claims_for_one_customer_never_pass_the_cap_on_postgres(postgres_dsn):
    """Each round, six workers claim one new email each for the same customer under a cap of 2: two win, the
    others wait for the customer's lock row, count the window after it and are throttled; none is lost.

    PostgreSQL only: six cursors of one DuckDB connection racing on a customer's first lock row can all commit
    (measured before this backend existed too), and DuckDB never has two writer processes on one file."""
    cap = ClaimCap(max_emails=2, window_start=AS_OF - 24 * HOUR, window_end=AS_OF)
    backend = Backend("postgres", dsn=postgres_dsn)
    with backend.open() as ledger, writers(backend, 6) as workers:
        for round_ in range(4):
            customer = f"cus_{round_}"
            dues = [rows_for(customer, [f"in_{round_}_{i}"]) for i in range(len(workers))]
            jobs = [
                (lambda w, due=due, i=i: w.claim(due, NO_SKIPS, f"run-{i}", AS_OF, cap)) for i, due in enumerate(dues)
            ]
            results = race(workers, jobs)
            emails = ledger.con.execute(
                "SELECT count(DISTINCT email_id) FROM reminder_ledger WHERE customer_id = ?", [customer]
            ).fetchall()[0][0]
            assert emails == 2, f"round {round_}: {emails} emails under a cap of 2"
            assert sum(len(r.won) for r in results) == 2 and not any(r.lost for r in results)
            assert sum(len(r.throttled) for r in results) == 4


@pytest.mark.slow
def test_workers_claiming_overlapping_customers_in_opposite_orders_do_not_deadlock(backend):
    """Without ordered lock rows and keys, two transactions taking customers in opposite orders deadlock."""
    customers = [f"cus_{c:02d}" for c in range(40)]
    due = pl.concat([rows_for(c, [f"in_{c}_{k}" for k in range(3)]) for c in customers])
    with backend.open(), writers(backend, 2) as workers:  # the first holds the ledger open
        for round_ in range(3):
            keyed = due.with_columns(
                (pl.col("idempotency_key") + f":r{round_}").alias("idempotency_key"),
                (pl.col("email_id") + f"r{round_}").alias("email_id"),
            )
            forward, backward = keyed, keyed.reverse()
            jobs = [
                lambda w, due=forward: w.claim(due, NO_SKIPS, "forward", AS_OF),
                lambda w, due=backward: w.claim(due, NO_SKIPS, "backward", AS_OF),
            ]
            first, second = race(workers, jobs)
            if backend.kind == "postgres":
                assert not first.lost and not second.lost, "a deadlock between the two claimers"
            assert not (first.won & second.won)
            assert first.won | second.won == set(keyed.get_column("idempotency_key"))


def wait_until_blocked(dsn: str, pid: int) -> None:
    """Until the backend `pid` waits for a lock (polled; a claim blocks within milliseconds)."""
    deadline = time.monotonic() + 30
    with psycopg.connect(dsn, autocommit=True) as watcher:
        waiting = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s"
        while not watcher.execute(waiting, [pid]).fetchone()[0]:
            assert time.monotonic() < deadline, "the claim never waited for the blocker's lock row"
            time.sleep(0.01)


@pytest.mark.slow
def test_a_claim_on_postgres_takes_its_customers_lock_rows_in_customer_order(postgres_dsn):
    """Held up at cus_50 by another transaction, a claim for cus_00..cus_99 (given in reverse) holds exactly the
    rows before it: every worker takes lock rows in one order, so two workers can wait, never deadlock."""
    customers = [f"cus_{c:02d}" for c in range(100)]
    due = pl.concat([rows_for(c, [f"in_{c}"]) for c in reversed(customers)])
    with open_postgres_ledger(postgres_dsn, "$TEST_DSN") as ledger:
        blocker = psycopg.connect(postgres_dsn)
        blocker.execute("INSERT INTO customer_claim_locks VALUES ('cus_50', now())")
        result: dict = {}
        claimer = threading.Thread(target=lambda: result.update(r=ledger.claim(due, NO_SKIPS, "run-1", AS_OF)))
        claimer.start()
        wait_until_blocked(postgres_dsn, ledger.raw.info.backend_pid)
        held = []
        with psycopg.connect(postgres_dsn) as probe:
            probe.execute("SET lock_timeout = '50ms'")
            for customer in customers[::7]:
                probe.execute("SAVEPOINT p")
                try:
                    probe.execute(
                        "INSERT INTO customer_claim_locks VALUES (%s, now()) ON CONFLICT DO NOTHING", [customer]
                    )
                except psycopg.errors.LockNotAvailable:
                    held.append(customer)
                probe.execute("ROLLBACK TO SAVEPOINT p")
            probe.rollback()
        blocker.rollback()
        blocker.close()
        claimer.join(timeout=30)
    assert held == [c for c in customers[::7] if c < "cus_50"]
    assert len(result["r"].won) == 100


@pytest.mark.slow
def test_a_deadlock_on_postgres_loses_the_chunk_and_leaves_nothing(postgres_dsn):
    with open_postgres_ledger(postgres_dsn, "$TEST_DSN") as ledger:
        ledger.con.execute("SET deadlock_timeout = '100ms'")  # the claim, not the blocker, detects the deadlock
        blocker = psycopg.connect(postgres_dsn)  # a transaction of its own, left open
        blocker.execute("SET deadlock_timeout = '60s'")
        blocker.execute("INSERT INTO customer_claim_locks VALUES ('cus_b', now())")
        due = pl.concat([rows_for("cus_a", ["in_a"]), rows_for("cus_b", ["in_b"])])
        result: dict = {}
        claimer = threading.Thread(target=lambda: result.update(r=ledger.claim(due, NO_SKIPS, "run-1", AS_OF)))
        claimer.start()
        wait_until_blocked(postgres_dsn, ledger.raw.info.backend_pid)  # the claim holds cus_a, waits for cus_b
        blocker.execute(  # waits for the claim's cus_a: a deadlock, which the claim's session detects first
            "INSERT INTO customer_claim_locks VALUES ('cus_a', now()) ON CONFLICT (customer_id) DO NOTHING"
        )
        claimer.join(timeout=30)
        blocker.rollback()
        blocker.close()
        assert result["r"].lost is True and result["r"].won == set()
        assert ledger.con.execute("SELECT count(*) FROM reminder_ledger").fetchall() == [(0,)]
        again = ledger.claim(due, NO_SKIPS, "run-2", AS_OF)  # the connection is usable again, the chunk claimable
        assert again.won == {"dunning:in_a:1:day3", "dunning:in_b:1:day3"} and not again.lost


@pytest.mark.slow
def test_a_worker_never_expires_another_live_workers_claims(backend):
    with backend.open() as ledger, backend.open() as other:
        ledger.claim(due_rows(2), NO_SKIPS, "worker-a", AS_OF, lease_until=AS_OF + 30 * dt.timedelta(minutes=1))
        assert other.expire_stale_claims("worker-b", AS_OF + 10 * dt.timedelta(minutes=1)) == 0
        assert other.claim_owners("worker-b") == ["worker-a"]
        assert other.renew_leases("worker-a", AS_OF + HOUR) == 2  # the live worker renews while it sends
        assert other.expire_stale_claims("worker-b", AS_OF + 45 * dt.timedelta(minutes=1)) == 0
        assert other.expire_stale_claims("worker-b", AS_OF + 2 * HOUR) == 2  # lease over: unknown, never unsent
        statuses = ledger.con.execute("SELECT DISTINCT status FROM reminder_ledger").fetchall()
        assert statuses == [("unknown",)]


def test_frames_have_the_same_dtypes_on_both_databases(tmp_path, postgres_dsn):
    tables = [s.split("EXISTS", 1)[1].split("(", 1)[0].strip() for s in DDL]
    with open_ledger(tmp_path / "d.duckdb") as duck, open_postgres_ledger(postgres_dsn, "$TEST_DSN") as pg:
        for ledger in (duck, pg):
            ledger.claim(due_rows(3), NO_SKIPS, "run-1", AS_OF, lease_until=AS_OF + HOUR)
        for table in tables:
            assert duck.frame(f"SELECT * FROM {table}").schema == pg.frame(f"SELECT * FROM {table}").schema, table
        window = (AS_OF - HOUR, AS_OF + HOUR)
        assert duck.emails_in_window(*window).equals(pg.emails_in_window(*window))
        for name in ("invoice_state", "open_problems", "unknown_sends"):
            assert getattr(duck, name)().schema == getattr(pg, name)().schema, name
        assert (
            duck.frame("SELECT 1 AS one, 'x' AS x, true AS b").schema
            == pg.frame("SELECT 1 AS one, 'x' AS x, true AS b").schema
        )


TRICKY = pl.DataFrame(
    {
        "text": ["plain", "", None, 'quote " and , comma', "new\nline", "\\N", "100% ? 'q'", "ü → ✓"],
        "number": [1, None, -3, 2**40, 0, 7, 8, 9],
        "small": pl.Series([1, 2, None, 4, 5, 6, 7, 8], dtype=pl.Int32),
        "at": [AS_OF + dt.timedelta(microseconds=i) if i % 3 else None for i in range(8)],
        "day": [dt.date(2026, 11, i + 1) for i in range(8)],
        "flag": [True, False, None, True, False, True, None, False],
        "ratio": [0.5, None, 1e300, -0.0, 2.25, 3.0, 4.0, 5.0],
    }
)


def test_a_registered_frame_reads_back_unchanged(backend):
    with backend.open() as ledger, ledger.registered("tricky", TRICKY):
        back = ledger.frame("SELECT * FROM tricky ORDER BY day")
        assert ledger.frame("SELECT count(*) AS n FROM tricky WHERE text = ?", ["100% ? 'q'"]).item() == 1
    assert back.equals(TRICKY.with_columns(pl.col("at").dt.replace_time_zone("UTC")))
    assert back.schema == TRICKY.with_columns(pl.col("at").dt.replace_time_zone("UTC")).schema


def test_placeholders_are_translated_outside_quotes_only():
    assert translate("SELECT ? WHERE a LIKE 'x%' AND b = '?' -- what?\n AND c = ?") == (
        "SELECT %s WHERE a LIKE 'x%%' AND b = '?' -- what?\n AND c = %s"
    )
    assert translate("SELECT \"odd?col\", 'it''s ?' FROM t WHERE x % 2 = ?") == (
        "SELECT \"odd?col\", 'it''s ?' FROM t WHERE x %% 2 = %s"
    )


def test_the_guards_probe_on_postgres_rolls_back_and_fails_without_the_key(postgres_dsn):
    with open_postgres_ledger(postgres_dsn, "$TEST_DSN") as ledger:
        assert ledger.refuses_duplicate_key() is True
        assert ledger.con.execute("SELECT count(*) FROM reminder_ledger").fetchall() == [(0,)]
        ledger.con.execute("ALTER TABLE reminder_ledger DROP CONSTRAINT reminder_ledger_pkey")
        assert ledger.refuses_duplicate_key() is False
        assert ledger.con.execute("SELECT count(*) FROM reminder_ledger").fetchall() == [(0,)]


def test_several_workers_opening_a_new_database_at_once_migrate_it_once(postgres_dsn):
    workers = 6

    def open_and_count(_: object) -> int:
        with open_postgres_ledger(postgres_dsn, "$TEST_DSN") as ledger:
            return int(ledger.scalar("SELECT count(*) FROM schema_version"))

    assert race([None] * workers, [open_and_count] * workers) == [LATEST] * workers
    with open_postgres_ledger(postgres_dsn, "$TEST_DSN") as ledger:
        versions = ledger.con.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
    assert versions == [(v,) for v in range(1, LATEST + 1)]


def test_a_failed_keys_backoff_doubles_per_attempt_on_both_databases(backend):
    failure = pl.DataFrame(
        {"idempotency_key": ["dunning:in_0:1:day3"], "status": ["failed"], "message_id": [None], "error": ["550"]},
        schema_overrides={"message_id": pl.String},
    )
    with backend.open() as ledger:
        ledger.claim(due_rows(1), NO_SKIPS, "run-1", AS_OF)
        assert ledger.record_outcomes(failure, AS_OF, AS_OF, backoff_minutes=30, run_id="run-1") == 1
        first = ledger.frame("SELECT next_attempt_at, attempts FROM reminder_ledger").row(0)
        ledger.con.execute("UPDATE reminder_ledger SET status = 'claimed', attempts = 8")  # the ninth attempt fails
        assert ledger.record_outcomes(failure, AS_OF, AS_OF, backoff_minutes=30) == 1
        ninth = ledger.frame("SELECT next_attempt_at, attempts FROM reminder_ledger").row(0)
    assert first == (AS_OF + dt.timedelta(minutes=30), 1)
    assert ninth == (AS_OF + dt.timedelta(minutes=30 * 2**8), 9)


@pytest.mark.slow
def test_recording_a_chunk_of_outcomes_on_postgres_never_rescans_it_per_claimed_key(postgres_dsn, monkeypatch):
    """The statistics of a ledger taken before a run claimed anything say no row is `claimed`; a guard written as
    a filter on the ledger then made PostgreSQL scan the chunk's outcomes once per claimed key (10,000 outcomes:
    13 s a chunk). The guard is a join condition: the plan never joins a scan of the ledger to a rescanned chunk."""
    with open_postgres_ledger(postgres_dsn, "$TEST_DSN") as ledger:
        ledger.con.execute(
            "INSERT INTO reminder_ledger (idempotency_key, kind, invoice_id, customer_id, cycle, stage, status, "
            "amount_minor, currency, email_id, message_id, run_id, claimed_at, sent_at) "
            "SELECT 'dunning:in_' || i || ':1:day3', 'reminder', 'in_' || i, 'c' || i, 1, 'day3', 'sent', 100, "
            "'USD', 'e' || i, '<m' || i || '@x>', 'old', ?, ? FROM generate_series(1, 300000) AS i",
            [AS_OF - HOUR, AS_OF - HOUR],
        )
        ledger.con.execute("ANALYZE reminder_ledger")  # taken while nothing is claimed, as before a run's claims
        ledger.con.execute(
            "UPDATE reminder_ledger SET status = 'claimed', run_id = 'r', sent_at = NULL "
            "WHERE invoice_id LIKE 'in\\_1____'"  # 10,000 of them
        )
        keys = [r[0] for r in ledger.con.execute("SELECT idempotency_key FROM reminder_ledger WHERE run_id = 'r'")]
        assert len(keys) > 5000
        outcomes = pl.DataFrame(
            {"idempotency_key": keys, "status": "sent", "message_id": None, "error": None},
            schema={"idempotency_key": pl.String, "status": pl.String, "message_id": pl.String, "error": pl.String},
        )
        plans: list[str] = []

        def explain(sql, params):
            plans.append("\n".join(r[0] for r in ledger.con.execute("EXPLAIN " + sql, params).fetchall()))
            return 0

        monkeypatch.setattr(ledger, "changed_rows", explain)
        ledger.record_outcomes(outcomes, AS_OF, AS_OF, 30.0, run_id="r")
        monkeypatch.undo()
        assert ledger.record_outcomes(outcomes, AS_OF, AS_OF, 30.0, run_id="r") == len(keys)
    [plan] = plans
    rescanned = "Nested Loop" in plan and "Join Filter" in plan and "Seq Scan on outcomes" in plan
    assert not rescanned, plan

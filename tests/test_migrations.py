"""Upgrades keep the ledger: a ledger made by release 0.1 opens, migrated, and the next cycle sends nothing twice."""

import datetime as dt
import gzip
import shutil
from pathlib import Path

import duckdb
import polars as pl
import pytest

from dunning.ledger.backends.duckdb_ledger import open_ledger
from dunning.ledger.schema.migrations import LATEST, MIGRATIONS, LedgerTooNew
from dunning.ledger.schema.tables import DDL
from tests.conftest import invoice
from tests.helpers import due_frame
from tests.ledger_backends import backend_fixture  # noqa: F401 - the fixture: both databases

RELEASE_0_1 = Path(__file__).parent / "fixtures" / "ledger_release_0_1.duckdb.gz"
# the snapshot release 0.1 ran twice (2026-11-04 and 2026-11-09) to make the fixture
ROWS = [
    invoice(invoice_id="in_1"),
    invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bob@example.com", amount_paid=10000, status="paid"),
    invoice(invoice_id="in_3", customer_id="cus_3", customer_email=None),
    invoice(invoice_id="in_4", customer_id="cus_4", due_date="2026-10-20", customer_email="d@example.com"),
]


def unpack(target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(RELEASE_0_1) as source, open(target, "wb") as out:
        shutil.copyfileobj(source, out)
    return target


def test_a_release_0_1_ledger_is_migrated_in_order_with_nothing_lost(tmp_path):
    path = unpack(tmp_path / "dunning.duckdb")
    con = duckdb.connect(str(path), read_only=True)
    before = con.execute("SELECT * FROM reminder_ledger ORDER BY idempotency_key").fetchall()
    assert "lease_expires_at" not in [c[0] for c in con.execute("DESCRIBE reminder_ledger").fetchall()]
    con.close()
    with open_ledger(path) as ledger:
        versions = [v for (v,) in ledger.con.execute("SELECT version FROM schema_version ORDER BY version").fetchall()]
        after = ledger.con.execute(
            "SELECT * EXCLUDE (lease_expires_at, provider_message_id, settled_run_id, policy, skip_reason, refused_at, "
            "refusal_alert_id, recipients) "
            "FROM reminder_ledger "
            "ORDER BY idempotency_key"
        ).fetchall()
        policies = ledger.con.execute("SELECT DISTINCT policy FROM reminder_ledger").fetchall()
        audit_columns = [c[0] for c in ledger.con.execute("DESCRIBE dunning_audit").fetchall()]
    # in order, each once (a branch may leave a gap for another's number until the merge renumbers)
    assert versions == [m.version for m in MIGRATIONS] == sorted(set(versions)) and versions[-1] == LATEST
    assert after == before and len(after) == 6
    assert policies == [("default",)], "rows from before policies read `default`"
    assert {"policy", "waits_until"} <= set(audit_columns)
    with open_ledger(path) as ledger:  # opening again applies nothing more
        assert ledger.con.execute("SELECT count(*) FROM schema_version").fetchone()[0] == len(MIGRATIONS)


@pytest.mark.slow
def test_the_next_cycle_on_an_upgraded_home_sends_nothing_twice(deployment):
    unpack(deployment.home / "dunning.duckdb")
    code, out, err = deployment.run(ROWS, "2026-11-09T10:00:00Z")
    assert code == 0, err
    assert deployment.outbox() == [], "everything due was sent by release 0.1"
    code, _, err = deployment.run(ROWS, "2026-11-18T10:00:00Z")  # in_1 crosses day14 now
    assert code == 0, err
    assert [m["X-Dunning-Keys"] for m in deployment.outbox()] == ["dunning:in_1:1:day14"]


@pytest.mark.slow
def test_a_ledger_newer_than_the_code_is_refused(deployment):
    path = unpack(deployment.home / "dunning.duckdb")
    with open_ledger(path) as ledger:
        ledger.con.execute("INSERT INTO schema_version VALUES (?, 'from the future', now())", [LATEST + 1])
    code, _, err = deployment.run(ROWS, "2026-11-09T10:00:00Z")
    assert code == 2 and f"schema version {LATEST + 1}, newer than this release knows ({LATEST})" in err
    assert "Traceback" not in err


def test_a_new_ledger_gets_the_current_schema_with_every_migration_recorded(backend):
    with backend.open() as ledger:
        versions = ledger.con.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
        columns = set(ledger.frame("SELECT * FROM reminder_ledger").columns)
    assert versions == [(m.version,) for m in MIGRATIONS] and "lease_expires_at" in columns
    with backend.open() as ledger:  # opening again applies nothing more
        assert ledger.scalar("SELECT count(*) FROM schema_version") == len(MIGRATIONS)


def test_a_ledger_newer_than_the_code_is_refused_on_either_database(backend):
    with backend.open() as ledger:
        ledger.con.execute("INSERT INTO schema_version VALUES (?, 'from the future', now())", [LATEST + 1])
    with pytest.raises(LedgerTooNew) as refused, backend.open():
        pass
    assert f"schema version {LATEST + 1}, newer than this release knows ({LATEST})" in str(refused.value)
    assert not backend.dsn or backend.dsn not in str(refused.value), "it names the variable, never the DSN"


def test_the_ledger_rebuilt_for_invoice_emails_keeps_its_rows_and_takes_the_new_kind_on_both(backend):
    at = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
    due = due_frame(["in_1", "in_2"])
    with backend.open() as ledger:
        ledger.claim(due, due.head(0), "run-1", at, lease_until=at)
        ledger.con.execute("UPDATE reminder_ledger SET recipients = NULL")  # a column release 6 did not have
        before = ledger.frame("SELECT * FROM reminder_ledger ORDER BY idempotency_key")
        ledger.con.execute("DELETE FROM schema_version WHERE version >= 7")  # as a ledger of release 6 left it
        ledger.con.execute("DROP TABLE feature_state")
    with backend.open() as ledger:  # migration 7 rebuilds reminder_ledger
        assert ledger.frame("SELECT * FROM reminder_ledger ORDER BY idempotency_key").equals(before)
        skipped = due.head(1).with_columns(idempotency_key=pl.lit("invoice:in_1:2026-11"), kind=pl.lit("invoice"))
        assert ledger.record_skipped(skipped, "run-2", at) == 1
        with pytest.raises(backend.duplicate_error):  # the primary key survived the rebuild
            ledger.con.execute("INSERT INTO reminder_ledger SELECT * FROM reminder_ledger LIMIT 1")


def test_a_new_ledger_has_the_tables_columns_and_indexes_a_migrated_one_has(tmp_path):
    """A new file gets its schema as one script (`migrate`); a release-0.1 file gets it migration by migration. The
    same schema either way: a statement lost or merged in the script shows here."""

    def schema(path):
        with open_ledger(path) as ledger:
            return (
                set(ledger.con.execute("SELECT table_name, column_name, data_type FROM duckdb_columns() "
                                       "WHERE database_name = current_database()").fetchall()),
                set(ledger.con.execute("SELECT table_name, index_name, is_unique FROM duckdb_indexes() "
                                       "WHERE database_name = current_database()").fetchall()),
                set(ledger.con.execute("SELECT table_name, constraint_type, constraint_text FROM duckdb_constraints() "
                                       "WHERE database_name = current_database()").fetchall()),
            )  # fmt: skip

    new = schema(tmp_path / "new.duckdb")
    migrated = schema(unpack(tmp_path / "dunning.duckdb"))
    assert new == migrated
    assert len(new[0]) > 100 and len(new[2]) > 30  # the ledger's keys are constraints; no index is made apart


def test_a_schema_statement_ending_in_a_comment_does_not_swallow_the_next():
    from dunning.ledger.schema.migrations import migrate

    con = duckdb.connect(":memory:")
    ddl = ["CREATE TABLE IF NOT EXISTS first_one (x INTEGER) -- a comment at the end", *DDL]
    assert migrate(con, ":memory:", ddl=ddl) == [m.version for m in MIGRATIONS]
    tables = {row[0] for row in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    assert {"first_one", "reminder_ledger", "schema_version"} <= tables

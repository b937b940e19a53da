"""Publication for analysts costs the new day, not the history: only changed days are rewritten.

And whatever an analyst did to `analytics.duckdb` (wrote to it, died holding it, holds it still), the file
that publication leaves always opens; analysts' own tables live in their own file, which ATTACHes it.
"""

import datetime as dt
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import duckdb
import polars as pl
import pytest

from dunning.ledger.backends import publication as analytics
from dunning.ledger.backends.duckdb_ledger import open_ledger
from dunning.ledger.backends.publication import publish

AS_OF = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)


def day_rows(day: dt.date, run_id: str, invoices: int) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "business_date": [day] * invoices,
            "run_id": [run_id] * invoices,
            "as_of": [AS_OF] * invoices,
            "invoice_id": [f"in_{i}" for i in range(invoices)],
            "customer_id": ["cus"] * invoices,
            "customer_email": ["a@example.com"] * invoices,
            "currency": ["USD"] * invoices,
            "amount_due": [100] * invoices,
            "amount_paid": [0] * invoices,
            "remaining_minor": [100] * invoices,
            "due_date": [dt.date(2026, 10, 1)] * invoices,
            "status": ["open"] * invoices,
            "days_overdue": pl.Series([30] * invoices, dtype=pl.Int32),
            "cycle": pl.Series([1] * invoices, dtype=pl.Int32),
        }
    )


def published_files(home) -> dict[str, tuple[int, int]]:
    """Day file -> inode and mtime: a rewrite is a new file (written beside the old one, then renamed over it)."""
    return {
        p.name: (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in (home / "analytics" / "invoice_history_daily").glob("2026-*.parquet")
    }


def view_count(home, sql: str) -> int:
    con = duckdb.connect(str(home / "analytics.duckdb"), read_only=True)
    try:
        return con.execute(sql).fetchone()[0]
    finally:
        con.close()


@pytest.mark.slow
def test_only_changed_days_are_rewritten_and_removed_days_disappear(tmp_path):
    days = [dt.date(2026, 11, d) for d in (1, 2, 3)]
    with open_ledger(tmp_path / "dunning.duckdb") as ledger:
        assert (
            publish(ledger.con, tmp_path)["invoice_history_daily"] == 0
        )  # an empty table publishes and reads as empty
        assert view_count(tmp_path, "SELECT count(*) FROM invoice_history_daily") == 0
        for n, day in enumerate(days):
            ledger.replace_partition("invoice_history_daily", day, day_rows(day, f"run-{n}", 10 + n))
        publish(ledger.con, tmp_path)
        first = published_files(tmp_path)
        assert sorted(first) == ["2026-11-01.parquet", "2026-11-02.parquet", "2026-11-03.parquet"]

        ledger.replace_partition(
            "invoice_history_daily", days[2], day_rows(days[2], "run-again", 12)
        )  # same count, new run
        ledger.replace_partition(
            "invoice_history_daily", dt.date(2026, 11, 4), day_rows(dt.date(2026, 11, 4), "run-4", 5)
        )
        ledger.con.execute("DELETE FROM invoice_history_daily WHERE business_date = ?", [days[0]])
        counts = publish(ledger.con, tmp_path)
        second = published_files(tmp_path)

    assert counts["invoice_history_daily"] == 11 + 12 + 5
    assert sorted(second) == ["2026-11-02.parquet", "2026-11-03.parquet", "2026-11-04.parquet"]
    assert second["2026-11-02.parquet"] == first["2026-11-02.parquet"]  # unchanged day: not rewritten
    assert second["2026-11-03.parquet"] != first["2026-11-03.parquet"]  # replaced by another run: rewritten
    assert view_count(tmp_path, "SELECT count(*) FROM invoice_history_daily") == 28
    assert view_count(tmp_path, "SELECT count(*) FROM invoice_history_daily WHERE run_id = 'run-again'") == 12


def test_a_single_file_from_an_earlier_version_is_replaced_by_the_day_files(tmp_path):
    (tmp_path / "analytics").mkdir()
    (tmp_path / "analytics" / "invoice_history_daily.parquet").write_bytes(b"stale")
    with open_ledger(tmp_path / "dunning.duckdb") as ledger:
        ledger.replace_partition("invoice_history_daily", dt.date(2026, 11, 1), day_rows(dt.date(2026, 11, 1), "r", 3))
        publish(ledger.con, tmp_path)
    assert not (tmp_path / "analytics" / "invoice_history_daily.parquet").exists()
    assert view_count(tmp_path, "SELECT count(*) FROM invoice_history_daily") == 3


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_status_change_on_an_old_reminder_republishes_only_its_day(tmp_path):
    rows = [
        ("dunning:a:1:day3", "2026-11-01 09:00:00+00"),
        ("dunning:b:1:day3", "2026-11-02 09:00:00+00"),
        ("dunning:c:1:day3", "2026-11-02 10:00:00+00"),
        ("dunning:d:1:day3", None),
    ]
    with open_ledger(tmp_path / "dunning.duckdb") as ledger:
        for key, claimed_at in rows:
            ledger.con.execute(
                "INSERT INTO reminder_ledger (idempotency_key, kind, customer_id, status, claimed_at) "
                "VALUES (?, 'reminder', 'cus', 'unknown', ?::TIMESTAMPTZ)",
                [key, claimed_at],
            )
        publish(ledger.con, tmp_path)
        day_files = tmp_path / "analytics" / "reminder_ledger"
        first = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in day_files.glob("2026-*.parquet")}
        ledger.con.execute("UPDATE reminder_ledger SET status = 'sent' WHERE idempotency_key = 'dunning:b:1:day3'")
        publish(ledger.con, tmp_path)
        second = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in day_files.glob("2026-*.parquet")}
    assert sorted(first) == ["2026-11-01.parquet", "2026-11-02.parquet"]
    assert (day_files / "undated.parquet").exists()  # a row without a claim time is published too
    assert second["2026-11-01.parquet"] == first["2026-11-01.parquet"]
    assert second["2026-11-02.parquet"] != first["2026-11-02.parquet"]
    assert view_count(tmp_path, "SELECT count(*) FROM reminder_ledger WHERE status = 'sent'") == 1
    assert view_count(tmp_path, "SELECT count(*) FROM reminder_ledger") == 4
    assert not (day_files / ".staging").exists()


# A second process, as an analyst's session: it opens one DuckDB file and runs the SQL it reads, one statement a line.
ANALYST = r"""
import duckdb, json, sys
con = duckdb.connect(sys.argv[1], read_only=sys.argv[2] == "ro")
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    try:
        print(json.dumps({"rows": con.execute(line).fetchall()}, default=str), flush=True)
    except duckdb.Error as error:
        print(json.dumps({"error": str(error)}), flush=True)
con.close()
"""


class Analyst:
    def __init__(self, database: str, cwd: Path, read_only: bool = False):
        self.process = subprocess.Popen(
            [sys.executable, "-c", ANALYST, database, "ro" if read_only else "rw"],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._answer() == {"ready": True}

    def _answer(self) -> dict:
        timer = threading.Timer(60, self.process.kill)  # a hung analyst fails the test instead of hanging it
        timer.start()
        try:
            line = self.process.stdout.readline()
        finally:
            timer.cancel()
        assert line, f"the analyst's process ended (exit {self.process.poll()})"
        return json.loads(line)

    def run(self, sql: str) -> dict:
        self.process.stdin.write(sql + "\n")
        self.process.stdin.flush()
        return self._answer()

    def rows(self, sql: str) -> list:
        answer = self.run(sql)
        assert "rows" in answer, answer
        return answer["rows"]

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def close(self) -> None:
        self.process.stdin.close()
        assert self.process.wait(timeout=60) == 0


@pytest.fixture
def analysts():
    started = []
    yield lambda *args, **kwargs: started.append(Analyst(*args, **kwargs)) or started[-1]
    for analyst in started:
        if analyst.process.poll() is None:
            analyst.process.kill()
            analyst.process.wait()


def assert_opens_and_answers(home, invoices: int) -> None:
    """A fresh connection, read-only and then read-write, opens the published file and its views answer."""
    for read_only in (True, False):
        con = duckdb.connect(str(home / "analytics.duckdb"), read_only=read_only)
        try:
            assert con.execute("SELECT count(*) FROM invoice_history_daily").fetchone()[0] == invoices
            assert con.execute("SELECT count(*) FROM owed_vs_reminded").fetchone()[0] >= 1
            assert (
                con.execute(
                    "SELECT count(*) FROM information_schema.tables WHERE table_type = 'BASE TABLE'"
                ).fetchone()[0]
                == 0
            )
        finally:
            con.close()


@pytest.mark.slow
def test_a_table_written_by_an_analyst_who_was_killed_does_not_break_the_next_publication(tmp_path, analysts, caplog):
    wal = tmp_path / "analytics.duckdb.wal"
    with open_ledger(tmp_path / "dunning.duckdb") as ledger:
        ledger.replace_partition("invoice_history_daily", dt.date(2026, 11, 1), day_rows(dt.date(2026, 11, 1), "r1", 3))
        publish(ledger.con, tmp_path)
        # as in a home published before publication guarded the WAL path, or after someone removed the guard
        wal.unlink(missing_ok=True)
        analyst = analysts(str(tmp_path / "analytics.duckdb"), tmp_path)
        analyst.rows("CREATE TABLE notes AS SELECT 1 AS n")
        analyst.kill()  # before closing: its table lives only in the log it leaves behind
        assert wal.is_file() and not wal.is_symlink()

        ledger.replace_partition("invoice_history_daily", dt.date(2026, 11, 2), day_rows(dt.date(2026, 11, 2), "r2", 5))
        with caplog.at_level(logging.WARNING, logger="dunning.ledger.backends.publication"):
            publish(ledger.con, tmp_path)

    assert any("notes" in r.getMessage() and "lost" in r.getMessage() for r in caplog.records), caplog.text
    assert not wal.is_file()  # the old file's log is gone (at most the guard, a dangling link, is left)
    assert_opens_and_answers(tmp_path, 8)


@pytest.mark.slow
def test_an_analyst_still_holding_the_replaced_file_cannot_break_readers_of_the_new_one(tmp_path, analysts):
    """Their session opened before a publication writes by name to analytics.duckdb.wal: that commit is refused."""
    wal = tmp_path / "analytics.duckdb.wal"
    with open_ledger(tmp_path / "dunning.duckdb") as ledger:
        ledger.replace_partition("invoice_history_daily", dt.date(2026, 11, 1), day_rows(dt.date(2026, 11, 1), "r1", 3))
        publish(ledger.con, tmp_path)
        analyst = analysts(str(tmp_path / "analytics.duckdb"), tmp_path)
        assert analyst.rows("SELECT count(*) FROM invoice_history_daily") == [[3]]
        ledger.replace_partition("invoice_history_daily", dt.date(2026, 11, 2), day_rows(dt.date(2026, 11, 2), "r2", 5))
        publish(ledger.con, tmp_path)  # replaces the file the analyst holds

        refused = analyst.run("CREATE TABLE notes AS SELECT 1 AS n")
        assert "analytics.duckdb.wal" in refused.get("error", ""), refused
        assert not wal.is_file()
        assert_opens_and_answers(tmp_path, 8)
        assert analyst.rows("SELECT count(*) FROM invoice_history_daily") == [[8]]  # their session reads the new data
        analyst.close()
        assert_opens_and_answers(tmp_path, 8)

        publish(ledger.con, tmp_path)  # and the next publication finds the path as it left it
    assert_opens_and_answers(tmp_path, 8)


@pytest.mark.slow
def test_own_tables_in_own_file_attaching_the_published_one_from_elsewhere_survive_publication(
    tmp_path, analysts, monkeypatch
):
    """The supported way to keep tables: your own DuckDB file, with analytics.duckdb ATTACHed READ_ONLY."""
    (tmp_path / "home").mkdir()
    (tmp_path / "desk").mkdir()
    monkeypatch.chdir(tmp_path)
    home = Path("home")  # published through a relative path: the views must still work from another directory
    with open_ledger(home / "dunning.duckdb") as ledger:
        ledger.replace_partition("invoice_history_daily", dt.date(2026, 11, 1), day_rows(dt.date(2026, 11, 1), "r1", 3))
        publish(ledger.con, home)
        analyst = analysts("notes.duckdb", tmp_path / "desk")
        analyst.rows("ATTACH '../home/analytics.duckdb' AS dunning (READ_ONLY)")
        analyst.rows("CREATE TABLE my_notes AS SELECT invoice_id, remaining_minor FROM dunning.invoice_history_daily")
        assert analyst.rows("SELECT count(*) FROM dunning.owed_vs_reminded") == [[1]]

        ledger.replace_partition("invoice_history_daily", dt.date(2026, 11, 2), day_rows(dt.date(2026, 11, 2), "r2", 5))
        publish(ledger.con, home)
        assert analyst.rows("SELECT count(*) FROM my_notes") == [[3]]
        assert analyst.rows("SELECT count(*) FROM dunning.invoice_history_daily") == [[8]]  # old views, new Parquet
        analyst.rows("DETACH dunning")
        analyst.rows("ATTACH '../home/analytics.duckdb' AS dunning (READ_ONLY)")
        assert analyst.rows("SELECT count(*) FROM dunning.invoice_history_daily") == [[8]]
        analyst.close()

        publish(ledger.con, home)
    later = analysts("notes.duckdb", tmp_path / "desk")  # a new session on their own file, another day
    assert later.rows("SELECT count(*) FROM my_notes") == [[3]]
    later.rows(f"ATTACH '{tmp_path / 'home' / 'analytics.duckdb'}' AS dunning (READ_ONLY)")
    assert later.rows("SELECT count(*) FROM dunning.invoice_history_daily") == [[8]]
    later.close()
    assert_opens_and_answers(tmp_path / "home", 8)


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_file_that_does_not_open_is_rebuilt_once_and_then_named_in_the_error(tmp_path, monkeypatch):
    checks = []

    def failing_once(path):
        checks.append(path)
        if len(checks) == 1:
            raise duckdb.IOException("Failure while replaying WAL file: WAL does not match database file")

    with open_ledger(tmp_path / "dunning.duckdb") as ledger:
        monkeypatch.setattr(analytics, "_check_opens", failing_once)
        publish(ledger.con, tmp_path)
        assert len(checks) == 2
        monkeypatch.setattr(analytics, "_check_opens", lambda path: (_ for _ in ()).throw(duckdb.IOException("broken")))
        with pytest.raises(RuntimeError, match=r"analytics\.duckdb does not open"):
            publish(ledger.con, tmp_path)


@pytest.mark.slow
def test_a_broken_old_file_and_another_database_s_log_never_stop_publication(tmp_path):
    (tmp_path / "analytics.duckdb").write_bytes(b"not a database" * 500)
    (tmp_path / "other").mkdir()
    dies_mid_session = (
        "import duckdb, os; con = duckdb.connect('other.duckdb'); "
        "con.execute('CREATE TABLE t AS SELECT 1'); os._exit(9)"
    )
    subprocess.run([sys.executable, "-c", dies_mid_session], cwd=tmp_path / "other", check=False)
    (tmp_path / "analytics.duckdb.wal").write_bytes((tmp_path / "other" / "other.duckdb.wal").read_bytes())
    with open_ledger(tmp_path / "dunning.duckdb") as ledger:
        ledger.replace_partition("invoice_history_daily", dt.date(2026, 11, 1), day_rows(dt.date(2026, 11, 1), "r1", 3))
        publish(ledger.con, tmp_path)
    assert_opens_and_answers(tmp_path, 3)


HOSTILE_TEXTS = ['a,"b"\nc\r\nd', "", None, "é ünï 😀\t\\N", "NULL", '""', "x" * 5000]


@pytest.mark.slow
def test_a_postgresql_ledger_publishes_exactly_what_a_duckdb_ledger_does_whatever_the_text(tmp_path, postgres_dsn):
    """The PostgreSQL rows reach the analysts' copy as CSV: quotes, commas, line breaks, empty strings against
    NULLs, the text 'NULL', non-ASCII, long values and microseconds must all arrive as the DuckDB ledger keeps them."""
    from dunning.ledger.backends.pg_ledger import open_postgres_ledger

    n = len(HOSTILE_TEXTS)
    history = day_rows(dt.date(2026, 11, 5), "r1", n).with_columns(
        customer_email=pl.Series(HOSTILE_TEXTS, dtype=pl.String),
        as_of=pl.Series([AS_OF + dt.timedelta(microseconds=i * 123457) for i in range(n)]),
    )

    def fill(ledger) -> None:
        ledger.merge_history_day(dt.date(2026, 11, 5), history)
        for i, text in enumerate(HOSTILE_TEXTS):
            ledger.add_alert(f"kind-{i}", text or "-", AS_OF + dt.timedelta(seconds=i), f"run-{i}", {"text": text})

    homes = {"duckdb": tmp_path / "d", "postgres": tmp_path / "p"}
    with open_ledger(homes["duckdb"] / "dunning.duckdb") as ledger:
        fill(ledger)
        ledger.publish(homes["duckdb"])
    with open_postgres_ledger(postgres_dsn, "$TEST_DSN") as ledger:
        fill(ledger)
        ledger.publish(homes["postgres"])
    assert not list(homes["postgres"].glob(".publication-*")), "the staged CSV files are gone"
    seen = {}
    for kind, home in homes.items():
        con = duckdb.connect(str(home / "analytics.duckdb"), read_only=True)
        try:
            seen[kind] = {
                "history": con.execute("SELECT * FROM invoice_history_daily ORDER BY invoice_id").fetchall(),
                "alerts": con.execute("SELECT * EXCLUDE (alert_id) FROM alerts ORDER BY created_at").fetchall(),
            }
        finally:
            con.close()
    assert [r[5] for r in seen["postgres"]["history"]] == HOSTILE_TEXTS
    assert seen["postgres"] == seen["duckdb"]


@pytest.mark.slow
def test_a_postgresql_ledger_copies_only_the_days_that_changed_and_publishes_them_all(
    tmp_path, postgres_dsn, monkeypatch
):
    """A day's history is copied out of PostgreSQL only when its rows changed: unchanged days keep their files
    and are not read again; a changed, a new and a removed day are published as a DuckDB ledger would."""
    from dunning.ledger.backends.pg_ledger import PostgresLedger, open_postgres_ledger

    days = [dt.date(2026, 11, d) for d in (1, 2, 3)]
    copied_days: list[list[dt.date] | None] = []  # per publication, the history days copied (None: none)
    real_copy = PostgresLedger._copy_table

    def recording(self, copy, table, staged, rows):
        if table == "invoice_history_daily":
            copied_days.append(None if rows.keeps_none else sorted(rows.params[0]))
        return real_copy(self, copy, table, staged, rows)

    monkeypatch.setattr(PostgresLedger, "_copy_table", recording)
    with open_postgres_ledger(postgres_dsn, "$TEST_DSN") as ledger:
        for n, day in enumerate(days):
            ledger.merge_history_day(day, day_rows(day, f"run-{n}", 10 + n))
        ledger.publish(tmp_path)
        first = published_files(tmp_path)
        ledger.publish(tmp_path)  # nothing changed: no history row is copied, no file rewritten
        unchanged = published_files(tmp_path)
        paid = day_rows(days[2], "run-again", 12).with_columns(amount_paid=pl.lit(40), remaining_minor=pl.lit(60))
        ledger.merge_history_day(days[2], paid)  # a payment on day 3
        ledger.merge_history_day(dt.date(2026, 11, 4), day_rows(dt.date(2026, 11, 4), "run-4", 5))
        ledger.con.execute("DELETE FROM invoice_history_daily WHERE business_date = ?", [days[0]])
        counts = ledger.publish(tmp_path)
    second = published_files(tmp_path)
    assert copied_days == [days, None, [days[2], dt.date(2026, 11, 4)]]
    assert unchanged == first
    assert counts["invoice_history_daily"] == 11 + 12 + 5
    assert sorted(second) == ["2026-11-02.parquet", "2026-11-03.parquet", "2026-11-04.parquet"]
    assert second["2026-11-02.parquet"] == first["2026-11-02.parquet"]
    assert second["2026-11-03.parquet"] != first["2026-11-03.parquet"]
    assert view_count(tmp_path, "SELECT count(*) FROM invoice_history_daily") == 28
    assert view_count(tmp_path, "SELECT count(*) FROM invoice_history_daily WHERE amount_paid = 40") == 12


@pytest.mark.slow
def test_a_table_published_whole_is_rewritten_only_when_it_changed(tmp_path):
    """A dry run, or an hour with nothing new, must not rewrite a million-row invoice_cycles for the analysts."""
    with open_ledger(tmp_path / "dunning.duckdb") as ledger:
        ledger.con.execute(
            "INSERT INTO exclusions (exclusion_id, scope, target_id, active_target, excluded_at, excluded_by) "
            "VALUES ('x1', 'customer', 'cus_1', 'customer:cus_1', now(), 'ops')"
        )
        publish(ledger.con, tmp_path)
        target = tmp_path / "analytics" / "exclusions.parquet"
        first = (target.stat().st_ino, target.stat().st_mtime_ns)
        publish(ledger.con, tmp_path)
        assert (target.stat().st_ino, target.stat().st_mtime_ns) == first, "nothing changed: not rewritten"
        ledger.con.execute("UPDATE exclusions SET reason = 'disputed' WHERE exclusion_id = 'x1'")
        publish(ledger.con, tmp_path)
        assert target.stat().st_ino != first[0], "a changed row: rewritten"
        target.unlink()
        publish(ledger.con, tmp_path)
        assert target.exists(), "a file gone is written again"
    assert view_count(tmp_path, "SELECT count(*) FROM exclusions WHERE reason = 'disputed'") == 1


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_the_view_file_is_rebuilt_only_when_its_views_change_or_the_file_was_touched(tmp_path):
    """New days show through the same analytics.duckdb (its views read their files when queried); other views, or a
    file an analyst changed, rebuild it."""
    target = tmp_path / "analytics.duckdb"
    with open_ledger(tmp_path / "dunning.duckdb") as ledger:
        ledger.replace_partition("invoice_history_daily", dt.date(2026, 11, 1), day_rows(dt.date(2026, 11, 1), "r1", 3))
        publish(ledger.con, tmp_path)
        built = target.stat().st_ino
        ledger.replace_partition("invoice_history_daily", dt.date(2026, 11, 2), day_rows(dt.date(2026, 11, 2), "r2", 5))
        publish(ledger.con, tmp_path)
        assert target.stat().st_ino == built, "the same views: the file is left as it was"
        assert_opens_and_answers(tmp_path, 8)  # and the new day is in them

        stamp = tmp_path / "analytics" / analytics.VIEWS_STAMP
        stamp.write_text(json.dumps({**json.loads(stamp.read_text()), "views": "views of another release"}))
        publish(ledger.con, tmp_path)
        assert target.stat().st_ino != built, "other views: rebuilt"
        rebuilt = target.stat().st_ino

        os.utime(target, ns=(1, 1))  # the file changed since it was built (an analyst wrote to it)
        publish(ledger.con, tmp_path)
        assert target.stat().st_ino != rebuilt, "a touched file: rebuilt"
    assert_opens_and_answers(tmp_path, 8)


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_publication_limited_to_some_tables_leaves_the_others_as_published_and_a_new_home_whole(tmp_path):
    """A dry run publishes what it wrote (`DRY_RUN_TABLES`), not the history: the other tables are neither read nor
    rewritten, counted from their last publication; on a home never published every table gets its files."""
    day = dt.date(2026, 11, 1)
    with open_ledger(tmp_path / "dunning.duckdb") as ledger:
        ledger.replace_partition("invoice_history_daily", day, day_rows(day, "r", 3))
        counts = publish(ledger.con, tmp_path, only=analytics.DRY_RUN_TABLES)  # never published: everything
        assert counts["invoice_history_daily"] == 3
        assert view_count(tmp_path, "SELECT count(*) FROM invoice_history_daily") == 3
        first = published_files(tmp_path)
        ledger.replace_partition("invoice_history_daily", day, day_rows(day, "again", 4))
        ledger.con.execute(
            "INSERT INTO alerts (alert_id, created_at, kind, severity, message) VALUES ('a1', now(), 'k', 'page', 'm')"
        )
        counts = publish(ledger.con, tmp_path, only=analytics.DRY_RUN_TABLES)
        assert published_files(tmp_path) == first, "the history a dry run never writes is not rewritten"
        assert counts["invoice_history_daily"] == 3, "counted as last published"
        assert view_count(tmp_path, "SELECT count(*) FROM alerts") == 1, "what a dry run writes is published"
        counts = publish(ledger.con, tmp_path)  # the next live run's: everything again
    assert counts["invoice_history_daily"] == 4
    assert view_count(tmp_path, "SELECT count(*) FROM invoice_history_daily WHERE run_id = 'again'") == 4


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_dry_run_publishes_its_audit_and_reads_no_history(deployment, monkeypatch):
    from tests.conftest import invoice

    rows = [invoice(invoice_id=f"in_{i}", customer_id=f"cus_{i}", customer_email=f"c{i}@example.com") for i in range(3)]
    code, _, err = deployment.run(rows, "2026-11-05T09:00:00Z")
    assert code == 0, err
    looked_at: list[str] = []
    real = analytics._publish_by_day

    def recording(con, table, *args, **kwargs):
        looked_at.append(table)
        return real(con, table, *args, **kwargs)

    monkeypatch.setattr(analytics, "_publish_by_day", recording)
    code, _, err = deployment.run(rows, "2026-11-12T09:00:00Z", "--dry-run")
    assert code == 0, err
    assert looked_at == ["dunning_audit"], "a dry run fingerprints no reminder, invoice or simulated history"
    home = deployment.home
    assert view_count(home, "SELECT count(*) FROM dunning_audit WHERE dry_run") == 3
    assert view_count(home, "SELECT count(*) FROM dunning_runs WHERE dry_run") == 1
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (home / "analytics").rglob("*.parquet")}
    with open_ledger(home / "dunning.duckdb") as ledger:  # a whole publication after it finds nothing to rewrite
        ledger.publish(home)
    after = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (home / "analytics").rglob("*.parquet")}
    assert after == before, "the dry run published everything it wrote"


def test_a_stamp_that_cannot_be_written_leaves_the_guarded_file_and_the_next_publication_rebuilds(
    tmp_path, monkeypatch
):
    """A full disk while recording `views.json` is not a file that failed to open: no unguarded rebuild."""
    with open_ledger(tmp_path / "dunning.duckdb") as ledger:
        ledger.replace_partition("invoice_history_daily", dt.date(2026, 11, 1), day_rows(dt.date(2026, 11, 1), "r1", 3))

        def disk_full(target, directory):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(analytics, "_stamp_views", disk_full)
        publish(ledger.con, tmp_path)
        wal = tmp_path / "analytics.duckdb.wal"
        assert wal.is_symlink() and os.readlink(wal) == analytics.WAL_GUARD_TARGET, "built with its guard"
        assert not (tmp_path / "analytics" / analytics.VIEWS_STAMP).exists()
        built = (tmp_path / "analytics.duckdb").stat().st_ino
        monkeypatch.undo()
        publish(ledger.con, tmp_path)
        assert (tmp_path / "analytics.duckdb").stat().st_ino != built, "no stamp: rebuilt next time"
    assert_opens_and_answers(tmp_path, 3)

"""Publication for analysts costs the new day, not the history: only changed days are rewritten."""

import datetime as dt

import duckdb
import polars as pl

from dunning.analytics import publish
from dunning.ledger.duckdb_ledger import open_ledger

AS_OF = dt.datetime(2026, 11, 5, 9, tzinfo=dt.timezone.utc)


def day_rows(day: dt.date, run_id: str, invoices: int) -> pl.DataFrame:
    return pl.DataFrame({
        "business_date": [day] * invoices, "run_id": [run_id] * invoices, "as_of": [AS_OF] * invoices,
        "invoice_id": [f"in_{i}" for i in range(invoices)], "customer_id": ["cus"] * invoices,
        "customer_email": ["a@example.com"] * invoices, "currency": ["USD"] * invoices, "amount_due": [100] * invoices,
        "amount_paid": [0] * invoices, "remaining_minor": [100] * invoices, "due_date": [dt.date(2026, 10, 1)] * invoices,
        "status": ["open"] * invoices, "days_overdue": pl.Series([30] * invoices, dtype=pl.Int32),
        "cycle": pl.Series([1] * invoices, dtype=pl.Int32),
    })


def published_files(home) -> dict[str, tuple[int, int]]:
    """Day file -> inode and mtime: a rewrite is a new file (written beside the old one, then renamed over it)."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (home / "analytics" / "invoice_history_daily").glob("2026-*.parquet")}


def view_count(home, sql: str) -> int:
    con = duckdb.connect(str(home / "analytics.duckdb"), read_only=True)
    try:
        return con.execute(sql).fetchone()[0]
    finally:
        con.close()


def test_only_changed_days_are_rewritten_and_removed_days_disappear(tmp_path):
    days = [dt.date(2026, 11, d) for d in (1, 2, 3)]
    with open_ledger(tmp_path / "dunning.duckdb") as ledger:
        assert publish(ledger.con, tmp_path)["invoice_history_daily"] == 0  # an empty table publishes and reads as empty
        assert view_count(tmp_path, "SELECT count(*) FROM invoice_history_daily") == 0
        for n, day in enumerate(days):
            ledger.replace_partition("invoice_history_daily", day, day_rows(day, f"run-{n}", 10 + n))
        publish(ledger.con, tmp_path)
        first = published_files(tmp_path)
        assert sorted(first) == ["2026-11-01.parquet", "2026-11-02.parquet", "2026-11-03.parquet"]

        ledger.replace_partition("invoice_history_daily", days[2], day_rows(days[2], "run-again", 12))  # same count, new run
        ledger.replace_partition("invoice_history_daily", dt.date(2026, 11, 4), day_rows(dt.date(2026, 11, 4), "run-4", 5))
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


def test_a_status_change_on_an_old_reminder_republishes_only_its_day(tmp_path):
    rows = [("dunning:a:1:day3", "2026-11-01 09:00:00+00"), ("dunning:b:1:day3", "2026-11-02 09:00:00+00"),
            ("dunning:c:1:day3", "2026-11-02 10:00:00+00"), ("dunning:d:1:day3", None)]
    with open_ledger(tmp_path / "dunning.duckdb") as ledger:
        for key, claimed_at in rows:
            ledger.con.execute("INSERT INTO reminder_ledger (idempotency_key, kind, customer_id, status, claimed_at) "
                               "VALUES (?, 'reminder', 'cus', 'unknown', ?::TIMESTAMPTZ)", [key, claimed_at])
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

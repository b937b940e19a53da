"""Floors per step: a bare polars or DuckDB query doing a step's work on the same data, in the same bench run.

Each floor is the median of `repeat` and validates, decides or writes what its step does, without the step's
bookkeeping (cycles, policies, holds, quarantine records, fingerprints, Dagster):

- `read_validate`: the snapshot read with polars and every row rule of `dunning.ingest.snapshot_rules` checked
  in one pass (ids present, amounts not negative, paid not above due, a known status and currency, no control
  character and no over-long value in the text columns, invoice ids distinct), the valid rows kept;
- `history_write`: the valid rows inserted into a table of a DuckDB file and committed (a live run's history day);
- `newly_due`: the anti-join of the owed invoices' reached stage against the ledger (`bench.steps.floor_query`);
- `audit`: those newly-due keys joined with their snapshot rows, each given an outcome, written to a DuckDB table;
- `claim_record` (a live run's send step, its ledger part): the newly-due keys inserted as claimed, with their
  invoices' earlier stages as skipped, a transaction per chunk, then marked sent;
- `publication`: the home's history tables, as the run left them, copied whole to Parquet files by DuckDB.
"""

from __future__ import annotations

import datetime as dt
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import polars as pl

from bench.steps import NEWLY_DUE_SQL, floor_query
from bench.trash import discard

CONTROL = r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]"  # `dunning.safe_text.CONTROL_CLASS`
TEXT = ("invoice_id", "customer_id", "customer_email", "customer_name", "billing_period", "currency", "status")
LONGEST = {"invoice_id": 200, "customer_id": 200, "customer_email": 254, "customer_name": 256, "billing_period": 64}
AS_OF_DAY = dt.date(2026, 11, 30)  # the business day the floor's history rows carry (`bench.run.AS_OF`'s)
STATUSES = ("draft", "open", "paid", "void", "uncollectible")
CURRENCIES = ("USD", "EUR", "JPY", "GBP", "CHF", "CAD", "AUD", "SEK", "NOK", "DKK", "PLN", "CZK", "BRL", "INR")
# the tables of a home's analysts' copy that hold rows after a cycle (the small ones cost nothing to copy)
PUBLISHED = ("reminder_ledger", "invoice_history_daily", "invoice_cycles", "dunning_audit", "simulated_sends",
             "dunning_runs", "billing_events", "snapshot_quarantine")  # fmt: skip


def _median(work: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times), 3)


def read_validate(snapshot: Path) -> pl.DataFrame:
    frame = pl.read_parquet(snapshot)
    text = [c for c in TEXT if c in frame.columns]
    ok = (
        pl.col("invoice_id").is_not_null() & (pl.col("invoice_id").str.len_chars() > 0)
        & pl.col("customer_id").is_not_null() & (pl.col("customer_id").str.len_chars() > 0)
        & (pl.col("amount_due") >= 0) & (pl.col("amount_paid") >= 0) & (pl.col("amount_paid") <= pl.col("amount_due"))
        & pl.col("due_date").is_not_null() & pl.col("status").is_in(STATUSES) & pl.col("currency").is_in(CURRENCIES)
        & pl.all_horizontal([~pl.col(c).str.contains(CONTROL).fill_null(False) for c in text])
        & pl.all_horizontal([(pl.col(c).str.len_chars() <= n).fill_null(True) for c, n in LONGEST.items()
                             if c in frame.columns])
    )  # fmt: skip
    if frame.get_column("invoice_id").hash().n_unique() != frame.height:
        ok = ok & ~pl.col("invoice_id").is_duplicated()
    return frame.filter(ok)


def history_write_floor(valid: pl.DataFrame, scratch: Path, repeat: int) -> float:
    """The validated rows inserted into a table of a new DuckDB file and committed; the file's checkpoint when it
    closes is not timed (the ledger's happens when it closes, outside the step that wrote)."""
    times = []
    for _ in range(repeat):
        database = scratch / "history-floor.duckdb"
        discard(database)
        con = duckdb.connect(str(database))
        try:
            con.execute("CREATE TABLE history AS SELECT ?::DATE AS business_date, * FROM valid LIMIT 0", [AS_OF_DAY])
            started = time.perf_counter()
            con.execute("INSERT INTO history SELECT ?::DATE, * FROM valid", [AS_OF_DAY])
            times.append(time.perf_counter() - started)
        finally:
            con.close()
        discard(database)
    return round(statistics.median(times), 3)


def audit_floor(ledger_home: Path, snapshot: Path, as_of: dt.datetime, scratch: Path, repeat: int) -> float:
    """The audit rows of the newly-due keys built and written to a DuckDB file (the newly-due set is computed
    first, untimed: it is `newly_due`'s floor)."""
    database = scratch / "audit-floor.duckdb"
    con = duckdb.connect(":memory:")
    try:
        con.execute(f"ATTACH '{ledger_home / 'dunning.duckdb'}' AS ledger (READ_ONLY)")
        con.execute("USE ledger")
        con.execute(
            "CREATE TEMP TABLE due AS " + NEWLY_DUE_SQL + "SELECT * FROM newly_due", [str(snapshot), as_of.date()]
        )

        def write() -> None:
            discard(database)
            con.execute(f"ATTACH '{database}' AS out")
            con.execute(
                "CREATE TABLE out.audit AS SELECT 'dunning:' || d.invoice_id || ':1:day' || d.days AS idempotency_key,"
                " d.invoice_id, s.customer_id, CASE WHEN s.customer_email IS NULL THEN 'held' ELSE 'sent' END AS "
                "outcome, s.amount_due - s.amount_paid AS amount_stated_minor, s.currency, ?::TIMESTAMPTZ AS as_of "
                "FROM temp.due d JOIN read_parquet(?) s USING (invoice_id)",
                [as_of, str(snapshot)],
            )
            con.execute("DETACH out")

        return _median(write, repeat)
    finally:
        con.close()
        discard(database)


def claim_record_floor(
    ledger_home: Path, snapshot: Path, as_of: dt.datetime, scratch: Path, chunk: int = 20_000
) -> dict:
    """The send step's ledger work on a copy of the ledger as the run found it: per chunk of `chunk` newly-due
    keys, one transaction inserting them as `claimed` (ON CONFLICT DO NOTHING, under the table's primary key) with
    the earlier stages of their invoices as `skipped`, then one transaction marking them `sent`."""
    database = scratch / "claim-floor.duckdb"
    discard(database)
    shutil.copy(ledger_home / "dunning.duckdb", database)
    con = duckdb.connect(str(database))
    try:
        con.execute(
            "CREATE TEMP TABLE due AS " + NEWLY_DUE_SQL + "SELECT n.*, row_number() OVER (ORDER BY n.invoice_id) "
            "// ? AS part FROM newly_due n",
            [str(snapshot), as_of.date(), chunk],
        )
        con.execute("CREATE TEMP TABLE who AS SELECT invoice_id, customer_id FROM read_parquet(?)", [str(snapshot)])
        parts = con.execute("SELECT max(part) FROM temp.due").fetchone()[0] or 0
        keys = "'dunning:' || d.invoice_id || ':1:' || st.stage"
        started = time.perf_counter()
        for part in range(parts + 1):
            con.execute("BEGIN")
            con.execute(
                'INSERT INTO reminder_ledger (idempotency_key, kind, invoice_id, customer_id, "cycle", stage, status, '
                f"run_id, claimed_at) SELECT {keys}, 'reminder', d.invoice_id, w.customer_id, 1, st.stage, CASE WHEN "
                "st.days = d.days THEN 'claimed' ELSE 'skipped' END, 'floor', ?::TIMESTAMPTZ FROM temp.due d JOIN "
                "temp.who w USING (invoice_id) JOIN (VALUES ('day3', 3), ('day7', 7), ('day14', 14)) st(stage, days) "
                "ON st.days <= d.days WHERE d.part = ? ORDER BY 1 ON CONFLICT DO NOTHING",
                [as_of, part],
            )
            con.execute("COMMIT")
            con.execute(
                "UPDATE reminder_ledger SET status = 'sent', sent_at = claimed_at WHERE status = 'claimed' AND "
                "idempotency_key IN (SELECT 'dunning:' || invoice_id || ':1:day' || days FROM temp.due WHERE part = ?)",
                [part],
            )
        seconds = time.perf_counter() - started
        rows = con.execute("SELECT count(*) FROM reminder_ledger WHERE run_id = 'floor'").fetchone()[0]
    finally:
        con.close()
        discard(database)
    return {"s": round(seconds, 3), "rows": rows, "chunks": parts + 1}


def publication_floor(home: Path, scratch: Path, repeat: int) -> dict:
    """The home's history tables copied whole to Parquet: seconds, and the rows copied."""
    target = scratch / "publication-floor"
    con = duckdb.connect(str(home / "dunning.duckdb"), read_only=True)
    try:
        present = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        tables = [t for t in PUBLISHED if t in present]
        rows = sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables)

        def copy() -> None:
            discard(target)
            target.mkdir(parents=True)
            for table in tables:
                con.execute(f"COPY {table} TO '{target / table}.parquet' (FORMAT parquet)")

        seconds = _median(copy, repeat)
    finally:
        con.close()
        discard(target)
    return {"s": seconds, "rows": rows}


def floors(ledger_home: Path, snapshot: Path, as_of: dt.datetime, scratch: Path, repeat: int = 3) -> dict:
    """The floors of one snapshot and ledger (`ledger_home`'s dunning.duckdb, as the timed run found it); the
    publication floor reads a home after its run (`publication_floor`)."""
    scratch.mkdir(parents=True, exist_ok=True)
    counted = floor_query(ledger_home, as_of, repeat, snapshot=snapshot)
    return {
        "read_validate": {"s": _median(lambda: read_validate(snapshot), repeat)},
        "history_write": {"s": history_write_floor(read_validate(snapshot), scratch, repeat)},
        "newly_due": {"s": counted["median_s"], "keys": counted["newly_due"]},
        "audit": {"s": audit_floor(ledger_home, snapshot, as_of, scratch, repeat)},
    }

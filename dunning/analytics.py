"""The analysts' read path: Parquet files plus a small `analytics.duckdb` of views over them.

DuckDB lets one process write a database file and a writer blocks every other
opener, so analysts never open `dunning.duckdb`. After each run the pipeline
copies the history tables to `DIR/analytics/` (each file written to a
temporary name and renamed into place, so a reader sees the old file or the new
one, never half of one) and rebuilds `DIR/analytics.duckdb` the same way: a
file holding only views, which an analyst can keep open for as long as they
like without blocking a run, and which shows the new data on their next query.

The tables that grow by the day (`PARTITIONED_TABLES`) are published one file
per day, and a run rewrites only the days whose rows changed since the last
publication (found by a fingerprint per day: its row count and the XOR of its
rows' hashes), so publishing costs the changed days, not the whole history.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import duckdb

# table -> the expression naming a row's day; these are published as DIR/analytics/<table>/<day>.parquet
# (rows without a day, if any, as `undated.parquet`)
PARTITIONED_TABLES = {
    "reminder_ledger": "CAST(timezone('UTC', claimed_at) AS DATE)",
    "invoice_history_daily": "business_date",
    "simulated_sends": "business_date",
    "dunning_audit": "CAST(timezone('UTC', as_of) AS DATE)",
}
UNDATED = "undated"
PUBLISHED_TABLES = (
    "reminder_ledger", "invoice_history_daily", "invoice_cycles", "dunning_audit", "dunning_runs", "alerts",
    "incidents", "snapshot_quarantine", "billing_events", "simulated_sends", "pause_state",
)

ANALYST_VIEWS = {
    "contact_history": """
        SELECT customer_id, any_value(customer_email) AS customer_email, email_id, any_value(message_id) AS message_id,
               any_value(kind) AS kind, string_agg(DISTINCT stage, ',' ORDER BY stage) AS stages,
               count(*) AS keys, string_agg(invoice_id, ',' ORDER BY invoice_id) AS invoices,
               sum(amount_minor) AS amount_minor, any_value(currency) AS currency, count(DISTINCT currency) AS currencies,
               any_value(status) AS outcome, min(claimed_at) AS claimed_at, min(sent_at) AS sent_at
        FROM reminder_ledger WHERE status <> 'skipped'
        GROUP BY customer_id, email_id""",
    "dunning_funnel": """
        WITH reached AS (
            SELECT l.invoice_id, l.cycle, l.stage, min(coalesce(l.sent_at, l.claimed_at)) AS reminded_at
            FROM reminder_ledger l WHERE l.kind = 'reminder' AND l.status IN ('sent', 'unknown') GROUP BY ALL),
        paid AS (
            SELECT invoice_id, min(business_date) AS first_seen_paid FROM invoice_history_daily
            WHERE status = 'paid' OR remaining_minor = 0 GROUP BY invoice_id)
        SELECT r.stage, count(*) AS invoices_reached,
               count(p.first_seen_paid) FILTER (WHERE p.first_seen_paid >= r.reminded_at::DATE) AS paid_after,
               round(count(p.first_seen_paid) FILTER (WHERE p.first_seen_paid >= r.reminded_at::DATE) / count(*), 4) AS paid_rate,
               median(date_diff('day', r.reminded_at::DATE, p.first_seen_paid)) FILTER (WHERE p.first_seen_paid >= r.reminded_at::DATE) AS median_days_to_pay
        FROM reached r LEFT JOIN paid p USING (invoice_id) GROUP BY r.stage""",
    "owed_vs_reminded": """
        WITH owed AS (
            SELECT business_date, currency, count(*) AS owed_invoices, sum(remaining_minor) AS owed_minor
            FROM invoice_history_daily WHERE status = 'open' AND remaining_minor > 0 AND days_overdue > 0 GROUP BY ALL),
        reminded AS (
            SELECT sent_at::DATE AS business_date, currency, count(*) AS reminded_invoices, sum(amount_minor) AS reminded_minor
            FROM reminder_ledger WHERE kind = 'reminder' AND status = 'sent' GROUP BY ALL)
        SELECT business_date, currency, coalesce(owed_invoices, 0) AS owed_invoices, coalesce(owed_minor, 0) AS owed_minor,
               coalesce(reminded_invoices, 0) AS reminded_invoices, coalesce(reminded_minor, 0) AS reminded_minor
        FROM owed FULL JOIN reminded USING (business_date, currency)""",
    "open_problems": """
        SELECT idempotency_key, kind, customer_id, invoice_id, stage, status AS problem, last_error AS detail,
               claimed_at AS since FROM reminder_ledger WHERE status IN ('unknown', 'failed')
        UNION ALL
        SELECT a.idempotency_key, a.kind, a.customer_id, a.invoice_id, a.stage, 'held: ' || a.reason, NULL, a.as_of
        FROM dunning_audit a
        WHERE a.outcome = 'held' AND NOT a.dry_run
          AND a.run_id = (SELECT run_id FROM dunning_runs WHERE NOT dry_run ORDER BY finished_wall_at DESC LIMIT 1)""",
    "breaker_trips_and_incidents": """
        SELECT created_at AS happened_at, 'breaker trip' AS what, run_id AS reference, message AS detail FROM alerts WHERE kind = 'breaker'
        UNION ALL
        SELECT last_recovery_at, 'flood incident', incident_id,
               flooded_customers || ' flooded customer(s), ' || apologies_sent || ' apology(ies) sent' FROM incidents""",
}


def _literal(path: Path) -> str:
    """A file path as a SQL string literal (COPY takes no parameter for its target)."""
    return "'" + str(path).replace("'", "''") + "'"


def _replace_atomically(target: Path, write) -> None:
    temporary = target.with_name(f".{target.name}.tmp")
    temporary.unlink(missing_ok=True)
    write(temporary)
    os.replace(temporary, target)


def publish(con: duckdb.DuckDBPyConnection, home: Path) -> dict[str, int]:
    """Publish the history tables as Parquet and rebuild the analysts' view file. Returns rows per table."""
    directory = home / "analytics"
    directory.mkdir(parents=True, exist_ok=True)
    counts = {}
    for table in PUBLISHED_TABLES:
        if table in PARTITIONED_TABLES:
            counts[table] = _publish_by_day(con, table, PARTITIONED_TABLES[table], directory / table)
            (directory / f"{table}.parquet").unlink(missing_ok=True)  # the single file of earlier versions
            continue
        _replace_atomically(directory / f"{table}.parquet",
                            lambda path, t=table: con.execute(f"COPY {t} TO {_literal(path)} (FORMAT parquet)"))
        counts[table] = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    _replace_atomically(home / "analytics.duckdb", lambda path: _write_views(path, directory))
    return counts


def _publish_by_day(con: duckdb.DuckDBPyConnection, table: str, day: str, target: Path) -> int:
    """Rewrite only the days whose fingerprint changed; remove days that no longer exist. Returns the table's rows."""
    target.mkdir(parents=True, exist_ok=True)
    empty = target / "empty.parquet"  # zero rows with the table's columns, so the view works on an empty table
    if not empty.exists():
        _replace_atomically(empty, lambda path: con.execute(f"COPY (SELECT * FROM {table} LIMIT 0) TO {_literal(path)} (FORMAT parquet)"))
    manifest_path = target / "published.json"
    published = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    # the fingerprint of a day is its row count and the XOR of its rows' hashes: any insert, delete or
    # update (a status change on an old reminder) changes it; one pass over the table, no copying
    current = {
        UNDATED if d is None else str(d): f"{rows}:{content}"
        for d, rows, content in con.execute(
            f"SELECT {day} AS day, count(*), bit_xor(hash(t)) FROM {table} t GROUP BY ALL").fetchall()
    }
    changed = [name for name, fingerprint in current.items()
               if published.get(name) != fingerprint or not (target / f"{name}.parquet").exists()]
    if changed:
        _write_days(con, table, day, target, changed)
    for name in set(published) - set(current):
        (target / f"{name}.parquet").unlink(missing_ok=True)
    _replace_atomically(manifest_path, lambda path: path.write_text(json.dumps(current, sort_keys=True)))
    return sum(int(f.split(":")[0]) for f in current.values())


def _write_days(con: duckdb.DuckDBPyConnection, table: str, day: str, target: Path, days: list[str]) -> None:
    """Write the given days in one pass over the table (PARTITION_BY), then rename each file into place."""
    staging = target / ".staging"
    shutil.rmtree(staging, ignore_errors=True)
    dated = [d for d in days if d != UNDATED]
    con.execute(
        f"COPY (SELECT *, {day} AS __day FROM {table} WHERE list_contains(?::DATE[], {day}) OR ({day} IS NULL AND ?)) "
        f"TO {_literal(staging)} (FORMAT parquet, PARTITION_BY (__day))",
        [dated, UNDATED in days],
    )
    for part in staging.iterdir():
        value = part.name.split("=", 1)[1]
        name = UNDATED if value == "__HIVE_DEFAULT_PARTITION__" else value
        files = list(part.glob("*.parquet"))
        if len(files) == 1:
            os.replace(files[0], target / f"{name}.parquet")
        else:  # DuckDB split a large day into several files: write that day alone, as one file
            _replace_atomically(target / f"{name}.parquet", lambda path: con.execute(
                f"COPY (SELECT * FROM {table} WHERE {day} IS NOT DISTINCT FROM ?::DATE) TO {_literal(path)} (FORMAT parquet)",
                [None if name == UNDATED else name]))
    shutil.rmtree(staging, ignore_errors=True)


def _write_views(path: Path, directory: Path) -> None:
    views = duckdb.connect(str(path))
    try:
        for table in PUBLISHED_TABLES:
            files = directory / table / "*.parquet" if table in PARTITIONED_TABLES else directory / f"{table}.parquet"
            views.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet({_literal(files)})")
        for name, sql in ANALYST_VIEWS.items():
            views.execute(f"CREATE VIEW {name} AS {sql}")
    finally:
        views.close()

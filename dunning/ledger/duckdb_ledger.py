"""The ledger on a DuckDB file.

DuckDB lets one process open a file read-write; a second process gets an
IOException about the lock. `open_ledger` waits for it with backoff and gives
up with a clear message, and always closes the connection (the lock goes with
it). A claim is ours only once its transaction commits: a commit that fails on
the primary key (`TransactionException`/`ConstraintException`) means another
writer won, and nothing of that chunk is sent.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
import uuid
from pathlib import Path
from typing import Iterator

import duckdb
import polars as pl

from dunning.errors import LedgerBusy
from dunning.ledger.schema import DDL, LEDGER_COLUMNS

LOST_CLAIM_ERRORS = (duckdb.TransactionException, duckdb.ConstraintException)
SENDING_STATUSES = ("claimed", "sent", "unknown")


def _connect(path: Path, timeout_seconds: float) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + timeout_seconds
    delay = 0.05
    while True:
        try:
            return duckdb.connect(str(path))
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower() or time.monotonic() >= deadline:
                raise LedgerBusy(
                    f"ledger {path} is held by another process (another dunning run or an open analyst "
                    f"session) and was not released within {timeout_seconds:.0f}s; try again when it finishes"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


@contextlib.contextmanager
def open_ledger(path: str | Path, timeout_seconds: float = 120.0) -> Iterator["DuckDBLedger"]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    con = _connect(path, timeout_seconds)
    try:
        con.execute("SET TimeZone = 'UTC'")
        for statement in DDL:
            con.execute(statement)
        yield DuckDBLedger(con)
    finally:
        con.close()


class DuckDBLedger:
    """Everything the pipeline stores, behind methods a PostgreSQL backend could implement too."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.con = con

    @contextlib.contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        self.con.execute("BEGIN TRANSACTION")
        try:
            yield self.con
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        self.con.execute("COMMIT")

    def frame(self, sql: str, params: list | None = None) -> pl.DataFrame:
        return self.con.sql(sql, params=params or None).pl()

    @contextlib.contextmanager
    def registered(self, name: str, frame: pl.DataFrame) -> Iterator[str]:
        self.con.register(name, frame.to_arrow())
        try:
            yield name
        finally:
            self.con.unregister(name)

    # --- invoice state -------------------------------------------------
    def invoice_state(self) -> pl.DataFrame:
        return self.frame("SELECT invoice_id, cycle, cycle_open, last_stage_days FROM invoice_cycles")

    def record_snapshot(self, run_id: str, as_of: dt.datetime, cycled: pl.DataFrame) -> None:
        """Append the accepted snapshot to history and open/close cycles, in one transaction."""
        history = cycled.select(
            pl.lit(run_id).alias("run_id"), pl.lit(as_of).alias("as_of"), "invoice_id", "customer_id",
            "customer_email", "customer_name", "currency", "amount_due", "amount_paid", "remaining_minor",
            "due_date", "status", "billing_period", "snapshot_at", "days_overdue", "cycle",
        )
        changes = cycled.filter(pl.col("cycle_action").is_not_null()).select("invoice_id", "cycle", "cycle_action")
        with self.transaction() as con, self.registered("history_rows", history), self.registered("cycle_changes", changes):
            con.execute("INSERT INTO invoice_snapshots SELECT * FROM history_rows")
            con.execute(
                """
                INSERT INTO invoice_cycles (invoice_id, cycle, cycle_open, opened_at)
                SELECT invoice_id, cycle, true, ? FROM cycle_changes WHERE cycle_action = 'open'
                ON CONFLICT (invoice_id) DO UPDATE SET cycle = excluded.cycle, cycle_open = true,
                    opened_at = excluded.opened_at, closed_at = NULL, last_stage = NULL, last_stage_days = NULL
                """,
                [as_of],
            )
            con.execute(
                """
                UPDATE invoice_cycles SET cycle_open = false, closed_at = ?
                FROM cycle_changes c
                WHERE c.cycle_action = 'close' AND invoice_cycles.invoice_id = c.invoice_id
                """,
                [as_of],
            )

    def quarantine(self, run_id: str, source: str, rejected: pl.DataFrame, at: dt.datetime) -> None:
        raw_columns = [c for c in rejected.columns if c not in ("rule", "source_row")]
        rows = rejected.select(
            pl.lit(run_id).alias("run_id"), pl.lit(at).alias("quarantined_at"), pl.lit(source).alias("source"),
            "source_row", "invoice_id", "rule",
            pl.struct([pl.col(c).cast(pl.String) for c in raw_columns]).struct.json_encode().alias("raw_row"),
        )
        with self.registered("rejected_rows", rows):
            self.con.execute("INSERT INTO snapshot_quarantine SELECT * FROM rejected_rows")

    # --- claims and outcomes -------------------------------------------
    def expire_stale_claims(self, run_id: str, now: dt.datetime) -> int:
        """Claims left by a run that ended without recording an outcome become `unknown`, never unsent."""
        rows = self.con.execute(
            """
            UPDATE reminder_ledger SET status = 'unknown', last_error = 'no outcome recorded (run ended after claim)',
                outcome_wall_at = ?
            WHERE status = 'claimed' AND run_id <> ? RETURNING idempotency_key
            """,
            [now, run_id],
        ).fetchall()
        return len(rows)

    def claim(self, due: pl.DataFrame, skipped: pl.DataFrame, run_id: str, claimed_at: dt.datetime) -> set[str]:
        """Insert `due` as `claimed` and, for invoices whose claim we won, `skipped` stages; one transaction.

        Returns the keys this run now owns. A lost race returns an empty set.
        """
        columns = ", ".join(LEDGER_COLUMNS)
        due_rows = due.with_columns(pl.lit("claimed").alias("status"), pl.lit(run_id).alias("run_id"), pl.lit(claimed_at).alias("claimed_at")).select(LEDGER_COLUMNS)
        skip_rows = skipped.with_columns(pl.lit("skipped").alias("status"), pl.lit(run_id).alias("run_id"), pl.lit(claimed_at).alias("claimed_at")).select(LEDGER_COLUMNS)
        try:
            with self.transaction() as con, self.registered("due_rows", due_rows), self.registered("skip_rows", skip_rows):
                won = {k for (k,) in con.execute(
                    f"INSERT INTO reminder_ledger ({columns}) SELECT {columns} FROM due_rows "
                    "ON CONFLICT DO NOTHING RETURNING idempotency_key"
                ).fetchall()}
                won_rows = due.filter(pl.col("idempotency_key").is_in(list(won))).select("invoice_id", "cycle", "stage", "stage_days")
                with self.registered("won_rows", won_rows):
                    con.execute(
                        f"INSERT INTO reminder_ledger ({columns}) SELECT {columns} FROM skip_rows "
                        "WHERE invoice_id IN (SELECT invoice_id FROM won_rows) ON CONFLICT DO NOTHING"
                    )
                    self._advance_stage(con)
        except LOST_CLAIM_ERRORS:
            return set()
        return won

    @staticmethod
    def _advance_stage(con: duckdb.DuckDBPyConnection) -> None:
        con.execute(
            """
            UPDATE invoice_cycles SET last_stage = w.stage, last_stage_days = w.stage_days
            FROM won_rows w
            WHERE invoice_cycles.invoice_id = w.invoice_id AND invoice_cycles.cycle = w.cycle
              AND coalesce(invoice_cycles.last_stage_days, -1) < w.stage_days
            """
        )

    def record_outcomes(self, outcomes: pl.DataFrame, sent_at: dt.datetime | None, wall: dt.datetime) -> None:
        """Columns: idempotency_key, status, message_id, error. One UPDATE for the chunk.

        `sent_at` None means "when it was claimed" (an outcome learned later, by lookup).
        """
        with self.registered("outcomes", outcomes):
            self.con.execute(
                """
                UPDATE reminder_ledger SET status = o.status, message_id = coalesce(o.message_id, reminder_ledger.message_id),
                    sent_at = CASE WHEN o.status = 'sent' THEN coalesce(?::TIMESTAMPTZ, reminder_ledger.claimed_at) END,
                    attempts = reminder_ledger.attempts + 1, last_error = o.error, outcome_wall_at = ?
                FROM outcomes o WHERE reminder_ledger.idempotency_key = o.idempotency_key
                """,
                [sent_at, wall],
            )

    def emails_in_window(self, since: dt.datetime, until: dt.datetime) -> pl.DataFrame:
        """Per customer, how many distinct emails may have reached them in (since, until]."""
        return self.frame(
            """
            SELECT customer_id, count(DISTINCT email_id)::BIGINT AS emails
            FROM reminder_ledger
            WHERE status IN ('claimed', 'sent', 'unknown')
              AND coalesce(sent_at, claimed_at) > ? AND coalesce(sent_at, claimed_at) <= ?
            GROUP BY customer_id
            """,
            [since, until],
        )

    # --- alerts, audit, runs -------------------------------------------
    def add_alert(self, kind: str, message: str, at: dt.datetime, run_id: str | None = None,
                  details: str | None = None, severity: str = "critical") -> str:
        alert_id = uuid.uuid4().hex
        self.con.execute(
            "INSERT INTO alerts (alert_id, created_at, kind, severity, message, run_id, details) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [alert_id, at, kind, severity, message, run_id, details],
        )
        return alert_id

    def unknown_with_message_ids(self) -> pl.DataFrame:
        return self.frame(
            "SELECT idempotency_key, message_id FROM reminder_ledger WHERE status = 'unknown' AND message_id IS NOT NULL"
        )

    def open_problems(self) -> pl.DataFrame:
        """Keys whose send failed or whose outcome is unknown: waiting on a retry, a lookup or a human."""
        return self.frame(
            "SELECT idempotency_key, kind, invoice_id, customer_id, cycle, stage, status, currency, message_id "
            "FROM reminder_ledger WHERE status IN ('failed', 'unknown')"
        )

    def write_audit(self, run_id: str, audit: pl.DataFrame, counts: dict[str, int], as_of: dt.datetime,
                    dry_run: bool, snapshot_rows: int) -> None:
        rejected = self.con.execute("SELECT count(*) FROM snapshot_quarantine WHERE run_id = ?", [run_id]).fetchone()[0]
        summary = pl.DataFrame([{
            "run_id": run_id, "as_of": as_of, "dry_run": dry_run, "finished_wall_at": dt.datetime.now(dt.timezone.utc),
            "snapshot_rows": snapshot_rows, "rejected_rows": rejected, "due": counts["due"], "sent": counts["sent"],
            "failed": counts["failed"], "unknown": counts["unknown"], "held": counts["held"],
            "skipped": self.con.execute("SELECT count(*) FROM reminder_ledger WHERE run_id = ? AND status = 'skipped'", [run_id]).fetchone()[0],
            "emails": self.con.execute("SELECT count(DISTINCT email_id) FROM reminder_ledger WHERE run_id = ? AND status = 'sent'", [run_id]).fetchone()[0],
            "not_owed_reminded": counts["not_owed_reminded"], "summary": None,
        }])
        self.replace_run_rows("dunning_audit", run_id, audit)
        self.replace_run_rows("dunning_runs", run_id, summary)

    def replace_run_rows(self, table: str, run_id: str, rows: pl.DataFrame) -> None:
        """Replace one run's rows in `table` (audit or summary), in one transaction, so a retry never doubles them."""
        if table not in ("dunning_audit", "dunning_runs"):
            raise ValueError(f"not a per-run table: {table}")
        with self.transaction() as con, self.registered("run_rows", rows):
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
            con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM run_rows")

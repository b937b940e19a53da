"""The ledger's tables (invoice state and history here, claims and operations in their modules), and the ledger on a
DuckDB file."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import polars as pl

from dunning.ledger.backends.connection import LedgerConnection, connect
from dunning.ledger.backends.publication import publish
from dunning.ledger.stores.charges import ChargeStore
from dunning.ledger.stores.claims import ClaimStore
from dunning.ledger.stores.cursors import CursorStore
from dunning.ledger.stores.desk.customer_store import CustomerStore
from dunning.ledger.stores.desk.promise_store import PromiseStore
from dunning.ledger.stores.desk.reply_store import ReplyStore
from dunning.ledger.stores.escalation_store import EscalationStore
from dunning.ledger.stores.exclusions import ExclusionStore
from dunning.ledger.stores.history import HistoryStore
from dunning.ledger.stores.invoice_email_store import InvoiceEmailStore
from dunning.ledger.stores.message_secret import MessageSecretStore
from dunning.ledger.stores.operations import Operations
from dunning.ledger.stores.payloads import PayloadStore
from dunning.ledger.stores.retention_store import RetentionStore
from dunning.ledger.stores.run_inputs import RunInputStore
from dunning.ledger.stores.schedule_store import ScheduleStore
from dunning.ledger.stores.suppressions import SuppressionStore


@contextlib.contextmanager
def open_ledger(path: str | Path, timeout_seconds: float = 120.0) -> Iterator[DuckDBLedger]:
    """The ledger at `path` (created if new), waiting up to `timeout_seconds` for another process's lock."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with connect(path, timeout_seconds) as con:
        LedgerConnection.prepare(con, str(path))
        ledger = DuckDBLedger(con)
        ledger.label = f"ledger {path}"
        yield ledger


QUARANTINE_MAX_CHARS = 1000


def _kept(column: str) -> pl.Expr:
    """A rejected value as given, cut to QUARANTINE_MAX_CHARS: a 50 MB name is evidence enough at 1,000 characters."""
    text = pl.col(column).cast(pl.String)
    return (
        pl.when(text.str.len_chars() > QUARANTINE_MAX_CHARS)
        .then(text.str.slice(0, QUARANTINE_MAX_CHARS) + pl.lit("…"))
        .otherwise(text)
        .alias(column)
    )


class LedgerTables(
    ClaimStore,
    Operations,
    ExclusionStore,
    PayloadStore,
    CursorStore,
    InvoiceEmailStore,
    RunInputStore,
    HistoryStore,
    ScheduleStore,
    SuppressionStore,
    EscalationStore,
    RetentionStore,
    MessageSecretStore,
    ChargeStore,
    PromiseStore,
    ReplyStore,
    CustomerStore,
):
    """Everything the pipeline stores, written once for both databases: `DuckDBLedger` below and
    `pg_ledger.PostgresLedger` add only their connection (`connection`, `pg_connection`)."""

    def invoice_state(self) -> pl.DataFrame:
        return self.frame(
            "SELECT invoice_id, cycle, cycle_open, last_stage_days, changed_snapshot_at FROM invoice_cycles"
        )

    def latest_applied_snapshot(self) -> dict[str, Any] | None:
        """The newest snapshot a live run applied (by when it was taken): `run_id`, `snapshot_taken_at`, the run's
        clock `as_of`, the wall clock `applied_wall_at` it was applied at, and its `invoice_count` (none before
        migration 19 for a run without a summary)."""
        rows = self.frame(
            "SELECT run_id, snapshot_taken_at, as_of, applied_wall_at, invoice_count FROM applied_snapshots "
            "ORDER BY snapshot_taken_at DESC, applied_wall_at DESC LIMIT 1"
        ).to_dicts()
        return rows[0] if rows else None

    def applied_snapshot_path(self, run_id: str) -> str | None:
        """The snapshot file the live run `run_id` applied (a pulled one when it pulled), if it recorded one."""
        row = self.con.execute("SELECT snapshot_path FROM applied_snapshots WHERE run_id = ?", [run_id]).fetchall()
        return row[0][0] if row else None

    def record_applied_snapshot(
        self,
        run_id: str,
        taken_at: dt.datetime,
        as_of: dt.datetime,
        path: str | None,
        stale_allowed: bool,
        wall: dt.datetime,
        invoices: int | None = None,
    ) -> None:
        """`invoices`: the whole snapshot's accepted invoices (a shard's part: the ingest's whole count)."""
        self.con.execute(
            "INSERT INTO applied_snapshots (run_id, snapshot_taken_at, as_of, snapshot_path, stale_allowed, "
            "applied_wall_at, invoice_count) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            [run_id, taken_at, as_of, path, stale_allowed, wall, invoices],
        )

    def record_cycle_changes(
        self, as_of: dt.datetime, cycled: pl.DataFrame, snapshot_taken_at: dt.datetime | None = None
    ) -> None:
        """Open and close the cycles this snapshot changes, in one transaction.

        Only the changed invoices are written; the snapshot itself is kept once
        per business day in `invoice_history_daily`, not once per run. Each
        change records when its snapshot was taken, so an older one cannot undo it.
        """
        taken = snapshot_taken_at or as_of
        changes = cycled.filter(pl.col("cycle_action").is_not_null()).select(
            "invoice_id", "cycle", pl.col("cycle_action").cast(pl.String)
        )
        with self.transaction() as con, self.registered("cycle_changes", changes):
            con.execute(
                """
                INSERT INTO invoice_cycles (invoice_id, cycle, cycle_open, opened_at, changed_snapshot_at)
                SELECT invoice_id, cycle, true, ?, ? FROM cycle_changes WHERE cycle_action = 'open' ORDER BY invoice_id
                ON CONFLICT (invoice_id) DO UPDATE SET cycle = excluded.cycle, cycle_open = true,
                    opened_at = excluded.opened_at, closed_at = NULL, last_stage = NULL, last_stage_days = NULL,
                    changed_snapshot_at = excluded.changed_snapshot_at
                """,
                [as_of, taken],
            )
            con.execute(
                """
                UPDATE invoice_cycles SET cycle_open = false, closed_at = ?, changed_snapshot_at = ?
                FROM cycle_changes c
                WHERE c.cycle_action = 'close' AND invoice_cycles.invoice_id = c.invoice_id
                """,
                [as_of, taken],
            )

    def quarantine(self, run_id: str, source: str, rejected: pl.DataFrame, at: dt.datetime) -> None:
        raw_columns = [c for c in rejected.columns if c not in ("rule", "source_row")]
        rows = rejected.select(
            pl.lit(run_id).alias("run_id"),
            pl.lit(at).alias("quarantined_at"),
            pl.lit(source).alias("source"),
            "source_row",
            _kept("invoice_id"),
            "rule",
            pl.struct([_kept(c) for c in raw_columns]).struct.json_encode().alias("raw_row"),
        )
        with self.registered("rejected_rows", rows):
            self.insert_by_name("snapshot_quarantine", "rejected_rows")

    def state_as_of(self, as_of: dt.datetime, stages: pl.DataFrame) -> pl.DataFrame:
        """Invoice state as the ledger stood at `as_of`: for a past day's simulation (backfill).

        Cycles are taken as open (a payment between then and now is not in the ledger).
        """
        with self.registered("stage_days", stages.select("stage", "stage_days")):
            return self.frame(
                """
                WITH r AS (SELECT invoice_id, cycle, stage FROM reminder_ledger
                           WHERE kind = 'reminder' AND claimed_at <= ?),
                     c AS (SELECT invoice_id, max(cycle) AS cycle FROM r GROUP BY invoice_id)
                SELECT c.invoice_id, c.cycle, true AS cycle_open, max(s.stage_days)::INTEGER AS last_stage_days
                FROM c JOIN r USING (invoice_id, cycle) LEFT JOIN stage_days s ON s.stage = r.stage
                GROUP BY c.invoice_id, c.cycle
                """,
                [as_of],
            )


class DuckDBLedger(LedgerTables, LedgerConnection):
    """The ledger on a DuckDB file."""

    def publish(self, home: Path, only: Collection[str] | None = None) -> dict[str, int]:
        """The analysts' copy under `home` (`dunning.ledger.backends.publication`), straight from the ledger file;
        `only`: of those tables (and any never published)."""
        return publish(self.con, home, only=only)

"""The ledger's tables (invoice state and history here, claims and operations in their modules), and the ledger on a
DuckDB file."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from dunning.analytics import publish
from dunning.ledger.claims import ClaimStore
from dunning.ledger.connection import LedgerConnection, connect
from dunning.ledger.cursors import CursorStore
from dunning.ledger.exclusions import ExclusionStore
from dunning.ledger.invoice_email_store import InvoiceEmailStore
from dunning.ledger.operations import Operations
from dunning.ledger.payloads import PayloadStore
from dunning.ledger.run_inputs import RunInputStore
from dunning.ledger.sql import Executes, quote_identifier
from dunning.sharding import EVERYONE, Shard


@contextlib.contextmanager
def open_ledger(path: str | Path, timeout_seconds: float = 120.0) -> Iterator[DuckDBLedger]:
    """The ledger at `path` (created if new), waiting up to `timeout_seconds` for another process's lock."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    con = connect(path, timeout_seconds)
    try:
        LedgerConnection.prepare(con, str(path))
        yield DuckDBLedger(con)
    finally:
        con.close()


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


class LedgerTables(ClaimStore, Operations, ExclusionStore, PayloadStore, CursorStore, InvoiceEmailStore, RunInputStore):
    """Everything the pipeline stores, written once for both databases: `DuckDBLedger` below and
    `pg_ledger.PostgresLedger` add only their connection (`connection`, `pg_connection`)."""

    def invoice_state(self) -> pl.DataFrame:
        return self.frame(
            "SELECT invoice_id, cycle, cycle_open, last_stage_days, changed_snapshot_at FROM invoice_cycles"
        )

    def latest_applied_snapshot(self) -> tuple[dt.datetime, str] | None:
        """When the newest snapshot a live run applied was taken, and by which run."""
        row = self.con.execute(
            "SELECT snapshot_taken_at, run_id FROM applied_snapshots ORDER BY snapshot_taken_at DESC LIMIT 1"
        ).fetchall()
        return (row[0][0], row[0][1]) if row else None

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
    ) -> None:
        self.con.execute(
            "INSERT INTO applied_snapshots VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            [run_id, taken_at, as_of, path, stale_allowed, wall],
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

    def merge_history_day(self, business_date: dt.date, rows: pl.DataFrame, shard: Shard = EVERYONE) -> None:
        """Bring one day of `invoice_history_daily` to `rows` (one per invoice) by change: rows whose values
        changed are replaced, new invoices added, and invoices of this shard's customers no longer in `rows`
        removed; an unchanged invoice keeps its row (and the run that wrote it). The hourly runs of a day
        rewrite what changed, not a million rows."""
        values = [c for c in rows.columns if c not in ("business_date", "run_id", "as_of", "invoice_id")]
        owned = None
        if not shard.everyone:
            day = self.frame(
                "SELECT DISTINCT customer_id FROM invoice_history_daily WHERE business_date = ?", [business_date]
            )
            owned = shard.owned_ids(day).to_frame("customer_id")
        with contextlib.ExitStack() as stack:
            con = stack.enter_context(self.transaction())
            stack.enter_context(self.registered("history_rows", rows))
            gone_scope = ""
            if owned is not None:
                stack.enter_context(self.registered("history_owned", owned))
                gone_scope = "AND h.customer_id IN (SELECT customer_id FROM history_owned)"
            # NOT EXISTS, not NOT IN: PostgreSQL plans it as an anti-join whatever the size of the day
            con.execute(
                f"""
                DELETE FROM invoice_history_daily h WHERE h.business_date = ? {gone_scope}
                  AND NOT EXISTS (SELECT 1 FROM history_rows r WHERE r.invoice_id = h.invoice_id)
                """,
                [business_date],
            )
            if self.history_keyed:
                self._upsert_history(con, rows.columns, values)
            else:
                self._replace_changed_history(con, business_date, rows.columns, values)

    @staticmethod
    def _replace_changed_history(con: Executes, business_date: dt.date, columns: list[str], values: list[str]) -> None:
        """One writer (DuckDB): delete the day's changed rows, then insert the invoices the day lacks."""
        changed = " OR ".join(f"r.{quote_identifier(c)} IS DISTINCT FROM h.{quote_identifier(c)}" for c in values)
        names = ", ".join(quote_identifier(c) for c in columns)
        con.execute(
            f"""
            DELETE FROM invoice_history_daily h USING history_rows r
            WHERE h.business_date = ? AND r.invoice_id = h.invoice_id AND ({changed})
            """,
            [business_date],
        )
        con.execute(
            f"""
            INSERT INTO invoice_history_daily ({names})
            SELECT {names} FROM history_rows r WHERE NOT EXISTS (
                SELECT 1 FROM invoice_history_daily h WHERE h.business_date = ? AND h.invoice_id = r.invoice_id)
            """,
            [business_date],
        )

    @staticmethod
    def _upsert_history(con: Executes, columns: list[str], values: list[str]) -> None:
        """Several writers (PostgreSQL): one upsert on the day's unique index, in invoice order, so two runs of one
        shard merging the same day at once wait for each other's rows instead of both inserting them (and an
        anti-join against rows this statement is inserting, which PostgreSQL ran as a nested loop, is gone)."""
        names = ", ".join(quote_identifier(c) for c in columns)
        kept = [c for c in columns if c not in ("business_date", "invoice_id")]
        updates = ", ".join(f"{quote_identifier(c)} = excluded.{quote_identifier(c)}" for c in kept)
        changed = " OR ".join(
            f"invoice_history_daily.{quote_identifier(c)} IS DISTINCT FROM excluded.{quote_identifier(c)}"
            for c in values
        )
        con.execute(
            f"""
            INSERT INTO invoice_history_daily ({names})
            SELECT {names} FROM history_rows ORDER BY invoice_id
            ON CONFLICT (business_date, invoice_id) DO UPDATE SET {updates} WHERE {changed}
            """,
            [],
        )

    def replace_partition(
        self,
        table: str,
        business_date: dt.date,
        rows: pl.DataFrame,
        policy_id: str | None = None,
        shard: Shard = EVERYONE,
    ) -> None:
        """Replace one day's rows of a daily table (and policy, for simulations) in one transaction.

        A shard replaces only the day's rows of the customers it owns, whether or not they are still in `rows`:
        the other shards' rows of the day stay, so N shards leave the day as one unsharded run would."""
        if table not in ("invoice_history_daily", "simulated_sends"):
            raise ValueError(f"not a daily table: {table}")
        where = "business_date = ?"
        params: list[object] = [business_date]
        if policy_id is not None:
            where += " AND policy_id = ?"
            params.append(policy_id)
        with self.transaction() as con, self.registered("partition_rows", rows):
            if shard.everyone:
                con.execute(f"DELETE FROM {table} WHERE {where}", params)
            else:
                day = self.frame(f"SELECT DISTINCT customer_id FROM {table} WHERE {where}", params)
                with self.registered("shard_customers", shard.owned_ids(day).to_frame("customer_id")):
                    mine = "customer_id IN (SELECT customer_id FROM shard_customers)"
                    con.execute(f"DELETE FROM {table} WHERE {where} AND {mine}", params)
            self.insert_by_name(table, "partition_rows")


class DuckDBLedger(LedgerTables, LedgerConnection):
    """The ledger on a DuckDB file."""

    def publish(self, home: Path) -> dict[str, int]:
        """The analysts' copy under `home` (`dunning.analytics`), straight from the ledger file."""
        return publish(self.con, home)

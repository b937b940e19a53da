"""What the invoice-email planner asks the ledger (`dunning.plan.invoice_emails`): keys on record, the day the feature
was turned on, the invoices seen by then; and the skipped keys it records."""

from __future__ import annotations

import datetime as dt

import polars as pl

from dunning.ledger.schema.tables import LEDGER_COLUMNS
from dunning.ledger.sql import SqlConnection
from dunning.vocabulary import LedgerStatus


class InvoiceEmailStore(SqlConnection):
    def invoice_keys_on_record(self, keys: pl.DataFrame) -> pl.DataFrame:
        """Of `keys` (`idempotency_key`), those already in the ledger, in any status: one join, not a key list."""
        with self.registered("asked_invoice_keys", keys.select("idempotency_key")):
            return self.frame(
                "SELECT l.idempotency_key FROM reminder_ledger l "
                "JOIN asked_invoice_keys a ON a.idempotency_key = l.idempotency_key"
            )

    def feature_enabled_on(self, feature: str) -> dt.date | None:
        value = self.scalar("SELECT max(enabled_on) FROM feature_state WHERE feature = ?", [feature])
        return value if isinstance(value, dt.date) else None

    def set_feature(self, feature: str, enabled: bool, business_date: dt.date, at: dt.datetime, run_id: str) -> None:
        """Turned on: remember the first day (kept while it stays on). Turned off: forget it."""
        if enabled:
            self.con.execute(
                "INSERT INTO feature_state VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                [feature, business_date, at, run_id],
            )
        else:
            self.con.execute("DELETE FROM feature_state WHERE feature = ?", [feature])

    def seen_on_or_before(self, invoice_ids: pl.DataFrame, day: dt.date) -> pl.DataFrame:
        """Of `invoice_ids` (`invoice_id`), those some live run saw on or before `day` (the daily history)."""
        with self.registered("asked_invoices", invoice_ids.select("invoice_id").unique()):
            return self.frame(
                "SELECT a.invoice_id FROM asked_invoices a WHERE EXISTS (SELECT 1 FROM invoice_history_daily h "
                "WHERE h.invoice_id = a.invoice_id AND h.business_date <= ?)",
                [day],
            )

    def record_skipped(self, rows: pl.DataFrame, run_id: str, at: dt.datetime) -> int:
        """Record keys that will never be sent (`skipped`), e.g. invoice emails of invoices already open or overdue;
        a key already on record keeps its row. Returns the keys recorded now."""
        if rows.is_empty():
            return 0
        skipped = rows.with_columns(
            pl.lit(LedgerStatus.SKIPPED).alias("status"), pl.lit(run_id).alias("run_id"), pl.lit(at).alias("claimed_at")
        ).select(LEDGER_COLUMNS)
        with self.transaction(), self.registered("skipped_rows", skipped):
            return len(
                self.insert_by_name(
                    "reminder_ledger",
                    "skipped_rows",
                    on_conflict_do_nothing=True,
                    returning="idempotency_key",
                    order_by="idempotency_key",
                )
            )

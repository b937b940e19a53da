"""The `promises` and `promise_invoices` tables: who promised to pay what by when, which invoices each promise
covers (with what they owed when it was made), and how it ended.

A promise is never deleted: `cancel` and the run that judges it (`dunning.desk.promises`) stamp `status` and
`resolved_at`, each only from `active`, so two runs judging one promise at once resolve it once (the second
finds it resolved and raises no alert). Importing one CSV row twice inserts nothing the second time: its
`promise_id` is the row's own or a digest of it (`ON CONFLICT DO NOTHING`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import polars as pl

from dunning.ledger.sql import SqlConnection

PROMISE_COLUMNS = (
    "promise_id, customer_id, invoice_id, until, amount_minor, currency, status, created_at, created_by, note, "
    "resolved_at, owed_minor, source"
)
# the latest row of each invoice in the day-by-day history: what the last applied snapshot said of it
_LATEST = """
    SELECT invoice_id, customer_id, currency, remaining_minor, status, cycle, due_date, days_overdue, business_date
    FROM (SELECT h.*, row_number() OVER (PARTITION BY invoice_id ORDER BY business_date DESC, as_of DESC) AS n
          FROM invoice_history_daily h WHERE {where}) latest
    WHERE n = 1 ORDER BY invoice_id
"""


class PromiseStore(SqlConnection):
    """Promises to pay on the ledger's connection."""

    def latest_invoices(self, *, customer_id: str | None = None, invoice_id: str | None = None) -> pl.DataFrame:
        """What the last snapshot that showed them said of one invoice, or of every invoice of one customer
        (`invoice_id`, `customer_id`, `currency`, `remaining_minor`, `status`, `cycle`, `due_date`, `days_overdue`,
        `business_date`); empty when no snapshot ever did."""
        if invoice_id is not None:
            return self.frame(_LATEST.format(where="invoice_id = ?"), [invoice_id])
        return self.frame(_LATEST.format(where="customer_id = ?"), [customer_id])

    def add_promise(self, promise: dict[str, Any], covered: Sequence[tuple[str, int | None, int]]) -> bool:
        """Record one promise and the invoices it covers (`invoice_id`, `cycle`, `remaining_minor` now), in one
        transaction; False, with nothing written, when its `promise_id` is on record already."""
        with self.transaction() as con:
            rows = con.execute(
                f"INSERT INTO promises ({PROMISE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, 'active', ?, ?, ?, NULL, ?, ?) "
                "ON CONFLICT DO NOTHING RETURNING promise_id",
                [
                    promise["promise_id"],
                    promise["customer_id"],
                    promise["invoice_id"],
                    promise["until"],
                    promise["amount_minor"],
                    promise["currency"],
                    promise["created_at"],
                    promise["created_by"],
                    promise["note"],
                    promise["owed_minor"],
                    promise["source"],
                ],  # fmt: skip
            ).fetchall()
            if not rows:
                return False
            for invoice_id, cycle, remaining in covered:
                con.execute(
                    "INSERT INTO promise_invoices (promise_id, invoice_id, cycle, remaining_minor) VALUES (?, ?, ?, ?)",
                    [promise["promise_id"], invoice_id, cycle, remaining],
                )
        return True

    def promise_ids_on_record(self, ids: Sequence[str]) -> set[str]:
        """Which of `ids` are promises on record already (any status)."""
        if not ids:
            return set()
        frame = pl.DataFrame({"promise_id": list(ids)}, schema={"promise_id": pl.String})
        with self.registered("asked_promises", frame):
            rows = self.con.execute(
                "SELECT p.promise_id FROM promises p JOIN asked_promises a USING (promise_id)"
            ).fetchall()
        return {str(r[0]) for r in rows}

    def promise(self, promise_id: str) -> dict[str, Any] | None:
        rows = self.frame(f"SELECT {PROMISE_COLUMNS} FROM promises WHERE promise_id = ?", [promise_id])
        return rows.row(0, named=True) if rows.height else None

    def cancel_promise(self, promise_id: str, by: str, at: dt.datetime) -> bool:
        """End an active promise (`cancelled`); False when it is not active (or not on record)."""
        rows = self.con.execute(
            "UPDATE promises SET status = 'cancelled', resolved_at = ?, resolved_by = ? "
            "WHERE promise_id = ? AND status = 'active' RETURNING promise_id",
            [at, by, promise_id],
        ).fetchall()
        return bool(rows)

    def promises_listed(self, broken_since: dt.datetime) -> pl.DataFrame:
        """`dunning promises`: the active ones, and those broken at or after `broken_since`, by `until`, with the
        invoices each covers (comma-separated)."""
        return self.frame(
            f"""
            SELECT {", ".join("p." + c.strip() for c in PROMISE_COLUMNS.split(","))},
                   (SELECT string_agg(i.invoice_id, ',' ORDER BY i.invoice_id) FROM promise_invoices i
                    WHERE i.promise_id = p.promise_id) AS invoices
            FROM promises p
            WHERE p.status = 'active' OR (p.status = 'broken' AND p.resolved_at >= ?)
            ORDER BY p.until, p.created_at, p.promise_id
            """,
            [broken_since],
        )

    def promise_coverage(self, statuses: Sequence[str] = ("active",)) -> pl.DataFrame:
        """One row per promise of `statuses` and invoice it covers: `promise_id`, `customer_id`, `invoice_id`, `cycle`,
        `remaining_minor` (when it was made), `until`, `amount_minor`, `currency`, `owed_minor`, `created_at`,
        `status`, `resolved_at`."""
        frame = pl.DataFrame({"status": list(statuses)}, schema={"status": pl.String})
        with self.registered("asked_statuses", frame):
            return self.frame(
                """
                SELECT p.promise_id, p.customer_id, i.invoice_id, i.cycle, i.remaining_minor, p.until,
                       p.amount_minor, p.currency, p.owed_minor, p.created_at, p.status, p.resolved_at
                FROM promises p JOIN promise_invoices i USING (promise_id)
                WHERE p.status IN (SELECT status FROM asked_statuses)
                ORDER BY p.promise_id, i.invoice_id
                """
            )

    def resolve_promise(self, promise_id: str, status: str, at: dt.datetime) -> bool:
        """Judge an active promise `kept` or `broken`; False when another run judged (or someone cancelled) it
        first."""
        rows = self.con.execute(
            "UPDATE promises SET status = ?, resolved_at = ?, resolved_by = 'dunning' "
            "WHERE promise_id = ? AND status = 'active' RETURNING promise_id",
            [status, at, promise_id],
        ).fetchall()
        return bool(rows)

    def note_promise_alert(self, promise_id: str, alert_id: str) -> None:
        self.con.execute("UPDATE promises SET alert_id = ? WHERE promise_id = ?", [alert_id, promise_id])

    def customer_promises(self, customer_id: str) -> pl.DataFrame:
        """Every promise of one customer, oldest first, with the invoices it covers."""
        return self.frame(
            f"""
            SELECT {", ".join("p." + c.strip() for c in PROMISE_COLUMNS.split(","))},
                   (SELECT string_agg(i.invoice_id, ',' ORDER BY i.invoice_id) FROM promise_invoices i
                    WHERE i.promise_id = p.promise_id) AS invoices
            FROM promises p WHERE p.customer_id = ? ORDER BY p.created_at, p.promise_id
            """,
            [customer_id],
        )

    def broken_promises_unanswered(self) -> pl.DataFrame:
        """The broken promises of each invoice's current cycle that no reminder claimed since followed
        (`promise_id`, `invoice_id`, `until`, `amount_minor`)."""
        return self.frame(
            """
            SELECT p.promise_id, i.invoice_id, p.until, p.amount_minor
            FROM promises p JOIN promise_invoices i USING (promise_id)
            JOIN invoice_cycles c ON c.invoice_id = i.invoice_id AND c.cycle = i.cycle
            WHERE p.status = 'broken' AND NOT EXISTS (
                SELECT 1 FROM reminder_ledger l WHERE l.invoice_id = i.invoice_id AND l.kind = 'reminder'
                  AND l.status IN ('claimed', 'sent', 'unknown') AND l.claimed_at >= p.resolved_at)
            ORDER BY p.promise_id, i.invoice_id
            """
        )

    def broken_promise_counts(self) -> pl.DataFrame:
        """Per invoice and cycle, the promises covering it that were broken (`invoice_id`, `cycle`, `broken`)."""
        return self.frame(
            """
            SELECT i.invoice_id, i.cycle, count(*)::INTEGER AS broken
            FROM promises p JOIN promise_invoices i USING (promise_id)
            WHERE p.status = 'broken' AND i.cycle IS NOT NULL GROUP BY i.invoice_id, i.cycle
            """
        )

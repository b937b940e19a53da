"""The daily tables: `invoice_history_daily` merged by change, and whole-day replacement for simulations.

Every live run brings its business day's history to the snapshot it applied,
writing only what changed (an unchanged invoice keeps the row, and the run,
that first wrote it), so the hourly runs of a day cost their changes, not a
million rows. Sharded runs touch only their own customers' rows of the day.

The two databases merge differently. DuckDB has one writer process: it deletes
the changed rows and inserts what the day lacks, with two hash joins.
PostgreSQL may have several runs of one shard merging a day at once: the day
has a unique index on (business_date, invoice_id) and the merge is one upsert
in invoice order, so a second run waits for the first's rows instead of
inserting them again. A shard's first write of a day (nothing of it there
yet: the first run after midnight) is a plain COPY into the table, under a
savepoint that falls back to the upsert if a racing run wrote first; at a
million rows that is about half the time of staging them and upserting.

Every write that changes a day is logged in `history_writes` (day, run, shard,
rows changed), in the same transaction: the hourly no-op hashes that small
table instead of the history, which grows by a day of rows every day (thirty
days of a million invoices: about 8 s to hash on PostgreSQL, every hour).
"""

from __future__ import annotations

import contextlib
import datetime as dt

import polars as pl

from dunning.ledger.sql import SqlConnection, quote_identifier
from dunning.sharding import EVERYONE, Shard

HISTORY = "invoice_history_daily"
# Recovery by stage (the analysts' view `recovery_by_stage`, and the audit's metadata through `recovery_by_stage`):
# per policy, stage and currency, the reminders sent and how many of them were followed by payment (a later
# snapshot shows the invoice paid or with nothing left), and the late fees that stage's reminders claimed (not
# waived) and collected (posted on a fee invoice a later snapshot shows paid); SQL both DuckDB and PostgreSQL run
# as written
RECOVERY_BY_STAGE = """
    WITH sent AS (
        SELECT idempotency_key, invoice_id, policy, stage, currency, amount_minor, sent_at,
               CAST(sent_at AS DATE) AS sent_on
        FROM reminder_ledger WHERE kind = 'reminder' AND status = 'sent' AND sent_at IS NOT NULL),
    paid AS (
        SELECT invoice_id, business_date FROM invoice_history_daily WHERE status = 'paid' OR remaining_minor = 0),
    outcome AS (
        SELECT s.idempotency_key, s.policy, s.stage, s.currency, s.amount_minor, s.sent_on,
               min(p.business_date) AS paid_on
        FROM sent s LEFT JOIN paid p ON p.invoice_id = s.invoice_id AND p.business_date >= s.sent_on
        GROUP BY s.idempotency_key, s.policy, s.stage, s.currency, s.amount_minor, s.sent_on),
    fee_invoices_paid AS (SELECT DISTINCT invoice_id FROM paid),
    fees AS (
        SELECT c.policy, c.stage, c.currency, CAST(sum(c.amount_minor) AS BIGINT) AS fees_claimed_minor,
               CAST(sum(CASE WHEN c.status = 'posted' AND f.invoice_id IS NOT NULL THEN c.amount_minor ELSE 0 END)
                    AS BIGINT) AS fees_collected_minor
        FROM charges c LEFT JOIN fee_invoices_paid f ON f.invoice_id = c.external_id
        WHERE c.status <> 'waived' GROUP BY c.policy, c.stage, c.currency),
    -- a promise to pay judged kept or broken counts for the last reminder its invoice had before it was made
    promised AS (
        SELECT idempotency_key, status FROM (
            SELECT s.idempotency_key, p.status,
                   row_number() OVER (PARTITION BY p.promise_id, i.invoice_id ORDER BY s.sent_at DESC) AS n
            FROM promises p JOIN promise_invoices i ON i.promise_id = p.promise_id
            JOIN sent s ON s.invoice_id = i.invoice_id AND s.sent_at <= p.created_at
            WHERE p.status IN ('kept', 'broken')) ranked
        WHERE n = 1),
    promise_counts AS (
        SELECT idempotency_key, count(*) FILTER (WHERE status = 'kept') AS kept,
               count(*) FILTER (WHERE status = 'broken') AS broken
        FROM promised GROUP BY idempotency_key)
    SELECT o.policy, o.stage, o.currency, count(*) AS reminders_sent,
           count(*) FILTER (WHERE o.paid_on <= o.sent_on + 7) AS paid_within_7d,
           count(*) FILTER (WHERE o.paid_on <= o.sent_on + 30) AS paid_within_30d,
           coalesce(sum(o.amount_minor) FILTER (WHERE o.paid_on IS NOT NULL), 0) AS amount_recovered_minor,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY o.paid_on - o.sent_on) AS median_days_to_pay,
           coalesce(max(fees.fees_claimed_minor), 0) AS fees_claimed_minor,
           coalesce(max(fees.fees_collected_minor), 0) AS fees_collected_minor,
           CAST(coalesce(sum(c.kept), 0) AS BIGINT) AS promises_kept,
           CAST(coalesce(sum(c.broken), 0) AS BIGINT) AS promises_broken
    FROM outcome o
    LEFT JOIN fees ON fees.policy = o.policy AND fees.stage = o.stage AND fees.currency = o.currency
    LEFT JOIN promise_counts c ON c.idempotency_key = o.idempotency_key
    GROUP BY o.policy, o.stage, o.currency ORDER BY o.policy, o.stage, o.currency"""


class HistoryStore(SqlConnection):
    def recovery_by_stage(self) -> pl.DataFrame:
        """Recovery per policy, stage and currency (`RECOVERY_BY_STAGE`)."""
        return self.frame(RECOVERY_BY_STAGE)

    def merge_history_day(self, business_date: dt.date, rows: pl.DataFrame, shard: Shard = EVERYONE) -> None:
        """Bring one day of `invoice_history_daily` to `rows` (one per invoice) by change: rows whose values
        changed are replaced, new invoices added, and invoices of this shard's customers no longer in `rows`
        removed; an unchanged invoice keeps its row (and the run that wrote it). The hourly runs of a day
        rewrite what changed, not a million rows."""
        values = [c for c in rows.columns if c not in ("business_date", "run_id", "as_of", "invoice_id")]
        owned = None if shard.everyone else self._owned_customers(HISTORY, "business_date = ?", [business_date], shard)
        first = self.history_keyed and self._first_write_of_day(business_date, owned)
        with self.transaction():
            if first and self.copy_new_rows(HISTORY, rows.sort("invoice_id")):  # in invoice order, as upserts lock
                self._log_write(business_date, rows, shard, rows.height)
                return
            changed = self._merge(business_date, rows, owned, values)
            self._log_write(business_date, rows, shard, changed)

    def _owned_customers(self, table: str, where: str, params: list[object], shard: Shard) -> pl.DataFrame:
        """The customers of `table`'s rows meeting `where` that `shard` owns (one `customer_id` column)."""
        day = self.frame(f"SELECT DISTINCT customer_id FROM {quote_identifier(table)} WHERE {where}", params)
        return shard.owned_ids(day).to_frame("customer_id")

    def _log_write(self, business_date: dt.date, rows: pl.DataFrame, shard: Shard, changed: int) -> None:
        """One row in `history_writes` for a merge that changed the day (the no-op's digest reads these)."""
        if not changed:
            return
        run_id = rows.get_column("run_id")[0] if rows.height and "run_id" in rows.columns else None
        self.con.execute(
            "INSERT INTO history_writes VALUES (?, ?, ?, ?, ?, ?)",
            [business_date, run_id, shard.index, shard.count, changed, dt.datetime.now(dt.UTC)],
        )

    def _merge(self, business_date: dt.date, rows: pl.DataFrame, owned: pl.DataFrame | None, values: list[str]) -> int:
        """The merge's statements; returns the rows they changed."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(self.registered("history_rows", rows))
            gone_scope = ""
            if owned is not None:
                stack.enter_context(self.registered("history_owned", owned))
                gone_scope = "AND h.customer_id IN (SELECT customer_id FROM history_owned)"
            # NOT EXISTS, not NOT IN: PostgreSQL plans it as an anti-join whatever the size of the day
            gone = self.changed_rows(
                f"""
                DELETE FROM invoice_history_daily h WHERE h.business_date = ? {gone_scope}
                  AND NOT EXISTS (SELECT 1 FROM history_rows r WHERE r.invoice_id = h.invoice_id)
                """,
                [business_date],
            )
            if self.history_keyed:
                return gone + self._upsert_history(rows.columns, values)
            return gone + self._replace_changed_history(business_date, rows.columns, values)

    def _first_write_of_day(self, business_date: dt.date, owned: pl.DataFrame | None) -> bool:
        """Whether the day holds nothing of this shard yet (`owned`: its customers among the day's rows)."""
        if owned is not None:
            return owned.is_empty()
        sql = "SELECT count(*) FROM (SELECT 1 FROM invoice_history_daily WHERE business_date = ? LIMIT 1) AS d"
        return not self.scalar(sql, [business_date])

    def _replace_changed_history(self, business_date: dt.date, columns: list[str], values: list[str]) -> int:
        """One writer (DuckDB): delete the day's changed rows, then insert the invoices the day lacks."""
        changed = " OR ".join(f"r.{quote_identifier(c)} IS DISTINCT FROM h.{quote_identifier(c)}" for c in values)
        names = ", ".join(quote_identifier(c) for c in columns)
        replaced = self.changed_rows(
            f"""
            DELETE FROM invoice_history_daily h USING history_rows r
            WHERE h.business_date = ? AND r.invoice_id = h.invoice_id AND ({changed})
            """,
            [business_date],
        )
        return replaced + self.changed_rows(
            f"""
            INSERT INTO invoice_history_daily ({names})
            SELECT {names} FROM history_rows r WHERE NOT EXISTS (
                SELECT 1 FROM invoice_history_daily h WHERE h.business_date = ? AND h.invoice_id = r.invoice_id)
            """,
            [business_date],
        )

    def _upsert_history(self, columns: list[str], values: list[str]) -> int:
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
        return self.changed_rows(
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
                with self.registered("shard_customers", self._owned_customers(table, where, params, shard)):
                    mine = "customer_id IN (SELECT customer_id FROM shard_customers)"
                    con.execute(f"DELETE FROM {table} WHERE {where} AND {mine}", params)
            self.insert_by_name(table, "partition_rows")
            if table == HISTORY:
                self._log_write(business_date, rows, shard, max(rows.height, 1))

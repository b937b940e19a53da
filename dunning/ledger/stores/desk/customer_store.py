"""One customer's whole story, read from every table that has a part of it (`dunning customer`, `dunning report
--customer`), and the `customer_notes` table.

Each read is one query over one table group, the customer's own rows only; `dunning.desk.story` puts them in one
chronological list. The same events, for every customer, are the analysts' view `customer_timeline`
(`CUSTOMER_TIMELINE`, over the published copies of these tables).
"""

from __future__ import annotations

import datetime as dt
import uuid

import polars as pl

from dunning.ledger.sql import SqlConnection

# what the analysts' view lists: one row per event of a customer (`at`, `event`, `detail`), DuckDB SQL
CUSTOMER_TIMELINE = """
    SELECT customer_id, min(coalesce(sent_at, claimed_at)) AS at, 'email_' || any_value(kind) AS event,
           string_agg(idempotency_key, ',' ORDER BY idempotency_key) || ' ' || any_value(status)
               || coalesce(' to ' || any_value(recipients), '') AS detail
    FROM reminder_ledger WHERE status <> 'skipped' AND kind <> 'escalation' AND claimed_at IS NOT NULL
    GROUP BY customer_id, email_id
    UNION ALL
    SELECT customer_id, claimed_at, 'skipped', idempotency_key FROM reminder_ledger
    WHERE status = 'skipped' AND claimed_at IS NOT NULL
    UNION ALL
    SELECT customer_id, coalesce(sent_at, claimed_at), 'escalation', idempotency_key || ' ' || status
    FROM reminder_ledger WHERE kind = 'escalation' AND claimed_at IS NOT NULL
    UNION ALL
    SELECT customer_id, created_at, 'promise', promise_id || ' until ' || CAST(until AS VARCHAR)
           || coalesce(' amount ' || CAST(amount_minor AS VARCHAR), '') FROM promises
    UNION ALL
    SELECT customer_id, resolved_at, 'promise_' || status, promise_id FROM promises WHERE resolved_at IS NOT NULL
    UNION ALL
    SELECT customer_id, received_at, CASE WHEN automatic THEN 'automatic_reply' ELSE 'reply' END,
           coalesce("from", '') || ': ' || coalesce(subject, '') FROM customer_replies WHERE customer_id IS NOT NULL
    UNION ALL
    SELECT customer_id, acked_at, 'reply_answered', acked_by || coalesce(': ' || note, '') FROM reply_acks
    UNION ALL
    SELECT customer_id, noted_at, 'note', noted_by || ': ' || text FROM customer_notes
    UNION ALL
    SELECT target_id, excluded_at, 'excluded', coalesce(reason, '') FROM exclusions WHERE scope = 'customer'
    UNION ALL
    SELECT customer_id, alerted_at, 'contact_suppressed', email FROM suppression_alerts
"""


class CustomerStore(SqlConnection):
    """What the ledger knows of one customer, and the notes about them."""

    def add_note(self, customer_id: str, text: str, by: str, at: dt.datetime) -> str:
        note_id = f"note_{uuid.uuid4().hex[:16]}"
        self.con.execute(
            "INSERT INTO customer_notes (note_id, customer_id, noted_at, noted_by, text) VALUES (?, ?, ?, ?, ?)",
            [note_id, customer_id, at, by, text],
        )
        return note_id

    def customer_notes_of(self, customer_id: str) -> pl.DataFrame:
        return self.frame(
            "SELECT note_id, noted_at, noted_by, text FROM customer_notes WHERE customer_id = ? ORDER BY noted_at",
            [customer_id],
        )

    def customer_known(self, customer_id: str) -> bool:
        """Whether any snapshot showed the customer, or anything was ever sent to them."""
        return bool(
            self.scalar(
                "SELECT EXISTS (SELECT 1 FROM invoice_history_daily WHERE customer_id = ?) "
                "OR EXISTS (SELECT 1 FROM reminder_ledger WHERE customer_id = ?)",
                [customer_id, customer_id],
            )
        )

    def customer_invoices(self, customer_id: str) -> pl.DataFrame:
        """The customer's invoices as the last snapshot that showed each said, with the cycle's last stage and the
        policy of its latest key (`invoice_id`, `currency`, `amount_due`, `remaining_minor`, `status`, `due_date`,
        `days_overdue`, `business_date`, `cycle`, `stage`, `policy`, `customer_email`)."""
        return self.frame(
            """
            SELECT h.invoice_id, h.currency, h.amount_due, h.remaining_minor, h.status, h.due_date, h.days_overdue,
                   h.business_date, h.cycle, c.last_stage AS stage, h.customer_email,
                   (SELECT l.policy FROM reminder_ledger l WHERE l.invoice_id = h.invoice_id
                    ORDER BY l.claimed_at DESC NULLS LAST LIMIT 1) AS policy
            FROM (SELECT *, row_number() OVER (PARTITION BY invoice_id ORDER BY business_date DESC, as_of DESC) AS n
                  FROM invoice_history_daily WHERE customer_id = ?) h
            LEFT JOIN invoice_cycles c ON c.invoice_id = h.invoice_id
            WHERE h.n = 1 ORDER BY h.due_date, h.invoice_id
            """,
            [customer_id],
        )

    def customer_keys(self, customer_id: str) -> pl.DataFrame:
        """Every key on record for the customer (emails, escalations, skipped stages), oldest first."""
        return self.frame(
            """
            SELECT idempotency_key, kind, invoice_id, cycle, stage, status, email_id, message_id, recipients,
                   customer_email, amount_minor, currency, claimed_at, sent_at, policy, skip_reason, last_error
            FROM reminder_ledger WHERE customer_id = ? ORDER BY coalesce(sent_at, claimed_at), idempotency_key
            """,
            [customer_id],
        )

    def customer_waiting(self, customer_id: str) -> pl.DataFrame:
        """The keys the customer's latest live run held, and why (`idempotency_key`, `reason`, `waits_until`,
        `as_of`)."""
        return self.frame(
            """
            SELECT a.idempotency_key, a.stage, a.reason, a.waits_until, a.as_of FROM dunning_audit a
            WHERE a.customer_id = ? AND a.outcome = 'held' AND NOT a.dry_run
              AND a.run_id = (SELECT b.run_id FROM dunning_audit b WHERE b.customer_id = ? AND NOT b.dry_run
                              ORDER BY b.as_of DESC LIMIT 1)
            ORDER BY a.idempotency_key
            """,
            [customer_id, customer_id],
        )

    def customer_suppressions(self, customer_id: str) -> pl.DataFrame:
        """Suppressions of any address the customer was sent to or listed with, and of the customer's own."""
        return self.frame(
            """
            SELECT s.email, s.reason, s.source, s.created_at, s.until, s.lifted_at, s.lifted_by FROM suppressions s
            WHERE s.customer_id = ? OR s.email IN (
                SELECT lower(customer_email) FROM invoice_history_daily WHERE customer_id = ?
                UNION SELECT lower(customer_email) FROM reminder_ledger WHERE customer_id = ?)
            ORDER BY s.created_at
            """,
            [customer_id, customer_id, customer_id],
        )

    def customer_exclusions(self, customer_id: str) -> pl.DataFrame:
        return self.frame(
            """
            SELECT scope, target_id, reason, excluded_at, excluded_by, until_date, included_at, included_by
            FROM exclusions WHERE (scope = 'customer' AND target_id = ?) OR (scope = 'invoice' AND target_id IN (
                SELECT invoice_id FROM invoice_history_daily WHERE customer_id = ?))
            ORDER BY excluded_at
            """,
            [customer_id, customer_id],
        )

    def customer_signals(self, customer_id: str) -> pl.DataFrame:
        """Billing events about the customer's invoices (payments, payment attempts, disputes, failed payments)."""
        return self.frame(
            """
            SELECT event_id, type, created_at, invoice_id FROM billing_events
            WHERE customer_id = ? OR invoice_id IN (SELECT invoice_id FROM invoice_history_daily WHERE customer_id = ?)
            ORDER BY created_at, event_id
            """,
            [customer_id, customer_id],
        )

"""What the collections schedule reads from the ledger (`dunning.plan.schedule`, `dunning.plan.escalation`): when each
customer last had a reminder, how many reminders each invoice had earlier in its cycle, and the escalation keys on
record. Each query is narrowed to the rows it is asked about, never the whole history."""

from __future__ import annotations

import datetime as dt

import polars as pl

from dunning.ledger.sql import SqlConnection

# a reminder that may have reached the customer; and, going live after another system, one it sent (`dunning adopt`)
_MAY_HAVE_REACHED = "status IN ('claimed', 'sent', 'unknown')"
_SENT_BEFORE = "l.kind = 'reminder' AND (l.status IN ('claimed', 'sent', 'unknown') OR l.skip_reason = 'adopted')"


REMINDERS_SENT_SCHEMA = pl.Schema({"invoice_id": pl.String, "cycle": pl.Int32, "reminders_sent_before": pl.Int32})


class ScheduleStore(SqlConnection):
    """The collections schedule's reads, on the ledger's connection."""

    def last_reminders(self, since: dt.datetime, until: dt.datetime, customers: pl.DataFrame) -> pl.DataFrame:
        """Per customer of `customers` (a frame with `customer_id`): the latest reminder that may have reached them
        in (since, until] (`last_reminder_at`: sent, else claimed); customers without one are left out."""
        with self.registered("spaced_customers", customers.select("customer_id").unique()):
            return self.frame(
                f"""
                SELECT customer_id, max(coalesce(sent_at, claimed_at)) AS last_reminder_at FROM reminder_ledger
                WHERE kind = 'reminder' AND {_MAY_HAVE_REACHED}
                  AND coalesce(sent_at, claimed_at) > ? AND coalesce(sent_at, claimed_at) <= ?
                  AND customer_id IN (SELECT customer_id FROM spaced_customers)
                GROUP BY customer_id
                """,
                [since, until],
            )

    def reminders_sent(self, invoices: pl.DataFrame) -> pl.DataFrame:
        """Per (invoice_id, cycle) of `invoices`: the reminders that may have reached the customer earlier in that
        cycle (`reminders_sent_before`), adopted ones included; invoices without one are left out."""
        if not self.scalar(f"SELECT EXISTS (SELECT 1 FROM reminder_ledger l WHERE {_SENT_BEFORE})"):
            # a new deployment: none to count, and none of a million invoices made distinct and registered to ask
            return pl.DataFrame(schema=REMINDERS_SENT_SCHEMA)
        with self.registered("counted_invoices", invoices.select("invoice_id", "cycle").unique()):
            return self.frame(
                f"""
                SELECT l.invoice_id, l.cycle, count(*)::INTEGER AS reminders_sent_before
                FROM reminder_ledger l JOIN counted_invoices c ON l.invoice_id = c.invoice_id AND l.cycle = c.cycle
                WHERE {_SENT_BEFORE}
                GROUP BY l.invoice_id, l.cycle
                """
            )

    def reminders_of(self, invoices: pl.DataFrame) -> pl.DataFrame:
        """The reminders on record of each (invoice_id, cycle) of `invoices` that may have reached the customer:
        `invoice_id`, `cycle`, `stage`, `sent_at` (sent, else claimed), for an escalation's body."""
        with self.registered("escalated_invoices", invoices.select("invoice_id", "cycle").unique()):
            return self.frame(
                f"""
                SELECT l.invoice_id, l.cycle, l.stage, coalesce(l.sent_at, l.claimed_at) AS sent_at
                FROM reminder_ledger l JOIN escalated_invoices e ON l.invoice_id = e.invoice_id AND l.cycle = e.cycle
                WHERE {_SENT_BEFORE}
                ORDER BY l.invoice_id, sent_at, l.stage
                """
            )

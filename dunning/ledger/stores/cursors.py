"""Where each billing source's polling stands: the newest event id seen, advanced only once its notices are claimed.

A run that polls stages the newest event id it received (`stage_cursor`, in
the transaction that stores the events); the send step, once the run's notices
are claimed, moves it to `cursor` (`commit_cursor`). A run that fails or halts
in between leaves `cursor` where it was, so the next run polls the same events
again; the notice key `event:{event_id}` keeps that to one notice per event. Two
runs staging at once: the later stage wins and only its run can commit it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import polars as pl

from dunning.ledger.sql import SqlConnection


class CursorStore(SqlConnection):
    def source_cursor(self, source: str) -> str | None:
        """The committed cursor of `source` (None before its first committed poll)."""
        rows = self.con.execute("SELECT cursor FROM source_cursors WHERE source = ?", [source]).fetchall()
        return rows[0][0] if rows else None

    def stage_cursor(self, source: str, cursor: str, run_id: str, at: dt.datetime) -> None:
        """Remember `cursor` as what `run_id` polled up to; `commit_cursor` makes it the cursor."""
        self.con.execute(
            "INSERT INTO source_cursors (source, pending_cursor, pending_run_id, pending_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (source) DO UPDATE SET pending_cursor = excluded.pending_cursor, "
            "pending_run_id = excluded.pending_run_id, pending_at = excluded.pending_at",
            [source, cursor, run_id, at],
        )

    def commit_cursor(self, run_id: str, at: dt.datetime) -> list[str]:
        """Advance every source whose pending cursor `run_id` staged; returns those sources."""
        rows = self.con.execute(
            "UPDATE source_cursors SET cursor = pending_cursor, updated_at = ?, pending_cursor = NULL, "
            "pending_run_id = NULL, pending_at = NULL WHERE pending_run_id = ? RETURNING source",
            [at, run_id],
        ).fetchall()
        return sorted(r[0] for r in rows)

    def pending_notice_events(self, since: dt.datetime) -> pl.DataFrame:
        """The stored `invoice.payment_failed` events created at or after `since` whose notice is not on record yet:
        a shard that did not poll sends its customers' notices from these, and a notice that waited (paused, over
        the cap) is found again. Columns as `dunning.ingest.events.EVENTS_SCHEMA`."""
        return self.frame(
            "SELECT event_id, type, created_at, invoice_id, customer_id, customer_email, currency, amount_remaining, "
            "payload FROM billing_events AS b WHERE type = 'invoice.payment_failed' AND created_at >= ? "
            "AND NOT EXISTS (SELECT 1 FROM reminder_ledger AS r WHERE r.idempotency_key = 'event:' || b.event_id) "
            "ORDER BY created_at, event_id",
            [since],
        )

    def signal_events(self, types: Sequence[str], since: dt.datetime, until: dt.datetime) -> pl.DataFrame:
        """The stored events of `types` about an invoice, created in [since, until], oldest first (`invoice_id`,
        `type`, `created_at`, `event_id`, `payload`): the payment signals (`dunning.plan.payment_signals`)."""
        marks = ", ".join("?" for _ in types)
        return self.frame(
            f"SELECT invoice_id, type, created_at, event_id, payload FROM billing_events WHERE invoice_id IS NOT NULL "
            f"AND created_at IS NOT NULL AND created_at >= ? AND created_at <= ? AND type IN ({marks}) "
            "ORDER BY created_at, event_id",
            [since, until, *types],
        )

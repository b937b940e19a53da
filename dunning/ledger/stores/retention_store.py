"""What the ledger sets aside and what it lets go: billing events that yield nothing, and old delivery reports.

- Set aside (`event_quarantine`, beside the events validation rejected): a stored payment-failed event past
  `source.events_lookback_days` without its notice (`expired`), and a payment signal whose customer is not the
  invoice's (`payment signal of another customer`). Each event once per reason, however many runs find it again, so
  the run that found it counts it in its summary and `dunning status` counts them all.
- Let go (`dunning.run.retention`): `delivery_events` rows recorded more than `retention.delivery_events_days`
  ago, except a report that was allowed to suppress (`suppressed`: the one a suppression names, in force or lifted,
  one waiting behind an operator's date, and a second report about an address suppressed already): it stays, so
  importing that old report again is still recognised and never restores a lifted suppression. Nothing else in the
  ledger is ever deleted: keys, outcomes, the audit, alerts and suppressions are the record.
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from dunning.ledger.sql import SqlConnection
from dunning.vocabulary import SetAside

# a report older than the cutoff that suppressed nothing: one that was allowed to (`suppressed`) stays, also when no
# suppression names it (a second bounce of an address, or one kept behind an operator's date as `pending_event_key`):
# imported again after a human lifted the suppression, it must still be a repeat
_UNREFERENCED = (
    "d.recorded_at < ? AND NOT coalesce(d.suppressed, false) AND NOT EXISTS (SELECT 1 FROM suppressions AS s "
    "WHERE s.event_key = d.event_key OR s.pending_event_key = d.event_key)"
)


class RetentionStore(SqlConnection):
    def set_aside_events(self, frame: pl.DataFrame, run_id: str, at: dt.datetime) -> int:
        """Keep events that were stored but yield nothing (`event_id`, `type`, `reason`, `payload`) in
        `event_quarantine`, each event with the same reason once; returns how many were new."""
        rows = (
            frame.select("event_id", "type", "reason", "payload")
            .unique(["event_id", "reason"], keep="first", maintain_order=True)
            .with_columns(
                pl.lit(run_id).alias("run_id"), pl.lit(at, dtype=pl.Datetime("us", "UTC")).alias("set_aside_at")
            )
        )
        if rows.is_empty():
            return 0
        with self.registered("set_aside_rows", rows):
            inserted = self.con.execute(
                "INSERT INTO event_quarantine (event_id, type, reason, run_id, received_at, payload) "
                "SELECT s.event_id, s.type, s.reason, s.run_id, s.set_aside_at, s.payload FROM set_aside_rows AS s "
                "WHERE NOT EXISTS (SELECT 1 FROM event_quarantine AS q WHERE q.event_id = s.event_id "
                "AND q.reason = s.reason) ORDER BY s.event_id RETURNING event_id"
            ).fetchall()
        return len(inserted)

    def expired_notice_events(self, before: dt.datetime) -> pl.DataFrame:
        """The stored `invoice.payment_failed` events created before `before` whose notice is not on record and
        that are not set aside as expired yet (`event_id`, `type`, `created_at`, `payload`)."""
        return self.frame(
            "SELECT event_id, type, created_at, payload FROM billing_events AS b "
            "WHERE type = 'invoice.payment_failed' AND created_at < ? "
            "AND NOT EXISTS (SELECT 1 FROM reminder_ledger AS r WHERE r.idempotency_key = 'event:' || b.event_id) "
            "AND NOT EXISTS (SELECT 1 FROM event_quarantine AS q WHERE q.event_id = b.event_id AND q.reason LIKE ?) "
            "ORDER BY created_at, event_id",
            [before, f"{SetAside.EXPIRED}:%"],
        )

    def set_aside_counts(self, run_id: str | None = None) -> dict[str, int]:
        """Events set aside, by kind (`SetAside`): by `run_id`, or all of them."""
        counts = {}
        for kind in SetAside:
            where, params = "reason LIKE ?", [f"{kind}:%"]
            if run_id is not None:
                where, params = where + " AND run_id = ?", [*params, run_id]
            counts[str(kind)] = int(str(self.scalar(f"SELECT count(*) FROM event_quarantine WHERE {where}", params)))
        return counts

    def delivery_events_before(self, before: dt.datetime) -> int:
        """How many `delivery_events` rows recorded before `before` no suppression refers to."""
        return int(str(self.scalar(f"SELECT count(*) FROM delivery_events AS d WHERE {_UNREFERENCED}", [before])))

    def delete_delivery_events(self, before: dt.datetime) -> int:
        """Delete the rows `delivery_events_before` counts (module docstring); returns how many."""
        deleted = self.con.execute(
            f"DELETE FROM delivery_events AS d WHERE {_UNREFERENCED} RETURNING event_key", [before]
        )
        return len(deleted.fetchall())

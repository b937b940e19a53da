"""The `customer_replies`, `reply_acks` and `imap_cursors` tables: what customers answered, who answered them,
and where each IMAP folder was read up to.

A reply is recorded once, unique on its `reply_key` (its Message-ID, else a digest of the message), so importing
a mailbox again changes nothing. An acknowledgement (`dunning ack`) is a row of its own: it answers every reply of
its customer received at or before its `acked_at`, for every run whose clock is at or after it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

import polars as pl

from dunning.ledger.sql import SqlConnection

REPLY_COLUMNS = (
    "reply_key", "customer_id", "from", "subject", "received_at", "matched_by", "automatic", "pauses", "message_id",
    "in_reply_to", "excerpt", "source", "recorded_at",
)  # fmt: skip
_QUOTED = ", ".join(f'"{c}"' for c in REPLY_COLUMNS)
# a pausing reply of the customer not answered by an ack at or before the clock `?`, received at or before it; an
# ack answers the replies on record when it was made (a reply imported later, dated before it, is not answered)
_UNANSWERED = """
    SELECT r.reply_key, r.customer_id, r.received_at, r.subject, r.unanswered_alert_id
    FROM customer_replies r
    WHERE r.pauses AND NOT r.automatic AND r.customer_id IS NOT NULL AND r.received_at <= ?
      AND NOT EXISTS (SELECT 1 FROM reply_acks a WHERE a.customer_id = r.customer_id
                      AND a.acked_at >= r.received_at AND a.acked_at <= ?
                      AND (a.recorded_wall_at IS NULL OR r.recorded_at <= a.recorded_wall_at))
    ORDER BY r.received_at, r.reply_key
"""


class ReplyStore(SqlConnection):
    """Replies, acknowledgements and IMAP cursors on the ledger's connection."""

    def record_replies(self, rows: Sequence[dict[str, Any]]) -> set[str]:
        """Insert each reply not on record yet; returns the `reply_key`s inserted now."""
        new: set[str] = set()
        placeholders = ", ".join("?" for _ in REPLY_COLUMNS)
        with self.transaction() as con:
            for row in rows:
                inserted = con.execute(
                    f"INSERT INTO customer_replies ({_QUOTED}) VALUES ({placeholders}) ON CONFLICT DO NOTHING "
                    "RETURNING reply_key",
                    [row[c] for c in REPLY_COLUMNS],
                ).fetchall()
                new |= {str(r[0]) for r in inserted}
        return new

    def claim_unanswered_alert(self, reply_key: str, claim: str) -> bool:
        """Take the page for a reply whose pause ran out: False when another run (a shard) took it first."""
        return bool(self.con.execute(
            "UPDATE customer_replies SET unanswered_alert_id = ? WHERE reply_key = ? AND unanswered_alert_id IS NULL "
            "RETURNING reply_key", [claim, reply_key]).fetchall())  # fmt: skip

    def note_reply_alert(self, reply_key: str, alert_id: str, *, unanswered: bool = False) -> None:
        column = "unanswered_alert_id" if unanswered else "alert_id"
        self.con.execute(f"UPDATE customer_replies SET {column} = ? WHERE reply_key = ?", [alert_id, reply_key])

    def unanswered_replies(self, at: dt.datetime) -> pl.DataFrame:
        """The human replies that pause someone, received at or before `at` and not acknowledged by then, oldest
        first (`reply_key`, `customer_id`, `received_at`, `subject`, `unanswered_alert_id`)."""
        return self.frame(_UNANSWERED, [at, at])

    def acknowledge(
        self, customer_id: str, at: dt.datetime, by: str, note: str | None, wall: dt.datetime | None = None
    ) -> int:
        """`dunning ack`: answer the customer's replies received at or before `at` and on record now (`wall`, the
        wall clock); returns how many were waiting."""
        waiting = self.unanswered_replies(at).filter(pl.col("customer_id") == customer_id).height
        self.con.execute(
            "INSERT INTO reply_acks (ack_id, customer_id, acked_at, acked_by, note, recorded_wall_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [uuid.uuid4().hex, customer_id, at, by, note, wall or dt.datetime.now(dt.UTC)],
        )
        return waiting

    def customer_replies_of(self, customer_id: str) -> pl.DataFrame:
        """Every reply recorded for one customer, oldest first."""
        return self.frame(f"SELECT {_QUOTED} FROM customer_replies WHERE customer_id = ? ORDER BY received_at",
                          [customer_id])  # fmt: skip

    def customer_acks_of(self, customer_id: str) -> pl.DataFrame:
        return self.frame(
            "SELECT acked_at, acked_by, note FROM reply_acks WHERE customer_id = ? ORDER BY acked_at", [customer_id]
        )

    def customers_by_address(self, addresses: Sequence[str]) -> pl.DataFrame:
        """The customers whose address (lower-case) in the last snapshot that showed them is one of `addresses`
        (`email`, `customer_id`)."""
        asked = pl.DataFrame({"email": sorted(set(addresses))}, schema={"email": pl.String})
        with self.registered("asked_senders", asked):
            return self.frame(
                """
                SELECT DISTINCT a.email, h.customer_id
                FROM asked_senders a JOIN (
                    SELECT customer_id, customer_email FROM (
                        SELECT customer_id, customer_email,
                               row_number() OVER (PARTITION BY invoice_id ORDER BY business_date DESC) AS n
                        FROM invoice_history_daily) latest WHERE n = 1) h
                  ON lower(h.customer_email) = a.email
                ORDER BY a.email, h.customer_id
                """
            )

    def imap_cursor(self, mailbox: str) -> tuple[int, int] | None:
        """(UIDVALIDITY, last UID read) of `mailbox`, or None before its first import."""
        rows = self.con.execute(
            "SELECT uidvalidity, last_uid FROM imap_cursors WHERE mailbox = ?", [mailbox]
        ).fetchall()
        return (int(rows[0][0]), int(rows[0][1])) if rows else None

    def set_imap_cursor(self, mailbox: str, uidvalidity: int, last_uid: int, at: dt.datetime) -> None:
        self.con.execute(
            "INSERT INTO imap_cursors (mailbox, uidvalidity, last_uid, updated_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (mailbox) DO UPDATE SET uidvalidity = excluded.uidvalidity, last_uid = excluded.last_uid, "
            "updated_at = excluded.updated_at",
            [mailbox, uidvalidity, last_uid, at],
        )

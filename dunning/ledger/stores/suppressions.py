"""The `suppressions` and `delivery_events` tables: who must not be emailed, and the reports that said so.

An address is suppressed by a hard bounce, a complaint (`dunning feedback`, `dunning serve-webhooks`) or an
operator (`dunning suppress`). Rows are never deleted: `unsuppress` stamps `lifted_at` and clears `active_email`,
whose UNIQUE constraint keeps at most one suppression in force per address, as for exclusions. Addresses are
stored lower-case; every comparison is on the lower-case address.

A suppression is checked twice: by the plan (its keys wait with reason `suppressed`, `dunning.plan.exclusions`)
and inside the claim's transaction (`ClaimStore.claim`), so an address suppressed while a run is sending gets
nothing from that run either.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

import polars as pl

from dunning.ledger.sql import SqlConnection

IN_FORCE = "active_email IS NOT NULL AND (until IS NULL OR until >= ?)"
SUPPRESSION_COLUMNS = "email, reason, source, note, customer_id, created_at, until"
DELIVERY_EVENT_SCHEMA = pl.Schema(
    {  # type: ignore[arg-type]  # polars' stubs reject a dict literal mixing String and Datetime
        "event_key": pl.String,
        "kind": pl.String,
        "source": pl.String,
        "email": pl.String,
        "message_id": pl.String,
        "idempotency_keys": pl.String,
        "customer_id": pl.String,
        "status_code": pl.String,
        "detail": pl.String,
        "reported_at": pl.Datetime("us", "UTC"),
        "recorded_at": pl.Datetime("us", "UTC"),
        "matched": pl.Boolean,
        "suppressed": pl.Boolean,
    }
)


@dataclass(frozen=True)
class Suppressed:
    """What `suppress` did: a new suppression, or the one in force kept (updated when an operator gave one)."""

    suppression_id: str
    new: bool


class SuppressionStore(SqlConnection):
    """Suppressions and delivery events on the ledger's connection."""

    def suppress(
        self,
        email: str,
        reason: str,
        source: str,
        at: dt.datetime,
        *,
        note: str | None = None,
        until: dt.date | None = None,
        customer_id: str | None = None,
        event_key: str | None = None,
    ) -> Suppressed:
        """Suppress `email`. An address already suppressed keeps its row; an operator's `manual` suppression sets its
        `until` and `note` (a bounce or complaint never shortens one)."""
        email = email.strip().lower()
        new_id = uuid.uuid4().hex
        manual = reason == "manual"
        rows = self.con.execute(
            """
            INSERT INTO suppressions (suppression_id, email, active_email, reason, source, note, customer_id,
                                      event_key, created_at, until)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (active_email) DO UPDATE SET
                until = CASE WHEN ? AND suppressions.reason = 'manual' THEN excluded.until ELSE suppressions.until END,
                note = CASE WHEN ? THEN coalesce(excluded.note, suppressions.note) ELSE suppressions.note END
            RETURNING suppression_id
            """,
            [new_id, email, email, reason, source, note, customer_id, event_key, at, until, manual, manual],
        ).fetchall()
        suppression_id = str(rows[0][0])
        return Suppressed(suppression_id, suppression_id == new_id)

    def suppress_many(self, rows: pl.DataFrame, at: dt.datetime) -> list[str]:
        """Suppress each address of `rows` (`email`, `reason`, `source`, `customer_id`, `event_key`) for good: a new
        row, or an operator's temporary suppression made permanent (a bounce outlasts any `until`); the addresses
        whose suppression this made or lengthened. The first row of an address wins."""
        if rows.is_empty():
            return []
        batch = (
            rows.with_columns(pl.col("email").str.strip_chars().str.to_lowercase())
            .unique("email", keep="first", maintain_order=True)
            .select(
                pl.concat_str(pl.lit("s-"), pl.col("event_key")).alias("suppression_id"), "email",
                pl.col("email").alias("active_email"), "reason", "source", pl.lit(None, pl.String).alias("note"),
                pl.col("customer_id").cast(pl.String), "event_key", pl.lit(at).alias("created_at"),
                pl.lit(None, pl.Date).alias("until"),
            )
        )  # fmt: skip
        with self.registered("suppress_rows", batch):
            # an operator's suppression whose `until` has passed no longer holds: it ends, so the bounce takes its place
            self.con.execute(
                "UPDATE suppressions SET active_email = NULL, lifted_at = ?, lifted_by = 'until passed' "
                "WHERE active_email IN (SELECT email FROM suppress_rows) AND until IS NOT NULL AND until < ?",
                [at, at.date()],
            )
            inserted = self.con.execute(
                """
                INSERT INTO suppressions (suppression_id, email, active_email, reason, source, note, customer_id,
                                          event_key, created_at, until)
                SELECT * FROM suppress_rows ORDER BY email
                ON CONFLICT (active_email) DO UPDATE SET
                    until = NULL, reason = excluded.reason, source = excluded.source, event_key = excluded.event_key
                WHERE suppressions.until IS NOT NULL
                RETURNING email
                """
            ).fetchall()
        return sorted(e for (e,) in inserted)

    def unsuppress(self, email: str, by: str, at: dt.datetime) -> bool:
        """Lift the suppression in force for `email` (any case); False when there is none."""
        rows = self.con.execute(
            "UPDATE suppressions SET active_email = NULL, lifted_at = ?, lifted_by = ? WHERE active_email = ? "
            "RETURNING suppression_id",
            [at, by, email.strip().lower()],
        ).fetchall()
        return bool(rows)

    def suppressed_emails(self, on: dt.date) -> pl.DataFrame:
        """The addresses suppressed on `on` (lower-case `email`, `reason`): an `until` before that day has ended."""
        return self.frame(f"SELECT email, reason FROM suppressions WHERE {IN_FORCE} ORDER BY email", [on])

    def open_suppressions(self, on: dt.date) -> pl.DataFrame:
        """Every suppression in force on `on`, newest first, for `dunning status`."""
        return self.frame(
            f"SELECT {SUPPRESSION_COLUMNS} FROM suppressions WHERE {IN_FORCE} ORDER BY created_at DESC, email", [on]
        )

    def contacts_to_fix(self, on: dt.date) -> pl.DataFrame:
        """The customers who need a new address: a run held their keys for an address still suppressed on `on`
        (`customer_id`, `email`, `reason`, `since`: when it was suppressed)."""
        return self.frame(
            """
            SELECT a.customer_id, a.email, s.reason, s.created_at AS since
            FROM suppression_alerts a JOIN suppressions s ON s.active_email = a.email
            WHERE s.until IS NULL OR s.until >= ?
            ORDER BY a.customer_id, a.email
            """,
            [on],
        )

    def new_suppression_alerts(self, held: pl.DataFrame, at: dt.datetime) -> pl.DataFrame:
        """Of `held` (customer_id, email: keys this run held as suppressed), the pairs never alerted before, recorded
        as alerted now: one `contact_suppressed` alert per customer and address, ever."""
        pairs = held.select("email", "customer_id").unique().sort("email", "customer_id")
        if pairs.is_empty():
            return pairs
        with self.registered("suppressed_pairs", pairs):
            rows = self.con.execute(
                """
                INSERT INTO suppression_alerts SELECT email, customer_id, ? FROM suppressed_pairs
                ORDER BY email, customer_id
                ON CONFLICT (email, customer_id) DO NOTHING
                RETURNING email, customer_id
                """,
                [at],
            ).fetchall()
        return pl.DataFrame(rows, schema={"email": pl.String, "customer_id": pl.String}, orient="row")

    def record_delivery_events(self, events: pl.DataFrame) -> set[str]:
        """Insert `events` (DELIVERY_EVENT_SCHEMA) unique on `event_key`; the keys that were new."""
        if events.is_empty():
            return set()
        rows = events.select(list(DELIVERY_EVENT_SCHEMA)).cast(DELIVERY_EVENT_SCHEMA)
        with self.registered("delivery_rows", rows.unique("event_key", keep="first")):
            inserted = self.insert_by_name(
                "delivery_events",
                "delivery_rows",
                on_conflict_do_nothing=True,
                returning="event_key",
                order_by="event_key",
            )
        return {k for (k,) in inserted}

    def emails_by_id(self, ids: list[str], column: str) -> pl.DataFrame:
        """Our keys of each id in `ids`, looked up in `column`: `message_id` (the Message-ID as sent, angle brackets
        included) or `provider_message_id` (Resend's id). Columns: `id`, `idempotency_keys` (comma-joined),
        `customer_id`, `customer_email`."""
        if column not in ("message_id", "provider_message_id"):
            raise ValueError(f"not an id column of reminder_ledger: {column}")
        asked = pl.DataFrame({"id": sorted(set(ids))}, schema={"id": pl.String})
        with self.registered("asked_ids", asked):
            return self.frame(
                f"""
                SELECT a.id, string_agg(l.idempotency_key, ',' ORDER BY l.idempotency_key) AS idempotency_keys,
                       min(l.customer_id) AS customer_id, min(l.customer_email) AS customer_email
                FROM reminder_ledger l JOIN asked_ids a ON l.{column} = a.id
                WHERE l.status IN ('sent', 'unknown', 'claimed')
                GROUP BY a.id
                """
            )

    def ever_emailed(self, emails: list[str]) -> set[str]:
        """Of `emails` (lower-case), those some key on record was addressed to."""
        asked = pl.DataFrame({"email": sorted(set(emails))}, schema={"email": pl.String})
        with self.registered("asked_emails", asked):
            rows = self.con.execute(
                "SELECT DISTINCT a.email FROM asked_emails a "
                "JOIN reminder_ledger l ON lower(l.customer_email) = a.email"
            ).fetchall()
        return {r[0] for r in rows}

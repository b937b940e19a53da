"""The `suppressions` and `delivery_events` tables: who must not be emailed, and the reports that said so.

An address is suppressed by a hard bounce, a complaint (`dunning feedback`, `dunning serve-webhooks`) or an
operator (`dunning suppress`). Rows are never deleted: `unsuppress` stamps `lifted_at` and clears `active_email`,
whose UNIQUE constraint keeps at most one suppression in force per address, as for exclusions. Addresses are
stored lower-case; every comparison is on the lower-case address.

A suppression is checked twice: by the plan (its keys wait with reason `suppressed`, `dunning.plan.exclusions`)
and inside the claim's transaction (`ClaimStore.claim`), so an address suppressed while a run is sending gets
nothing from that run either.

A report never lengthens an operator's suppression: a hard bounce or complaint about an address an operator
suppressed until a date is kept on that row (`pending_reason`, `pending_source`, `pending_event_key`,
`pending_at`), the operator's `until` untouched, and the address stays suppressed for good from the day after it
(`HOLDS`): nothing has to run on that day for the bounce to take effect.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

import polars as pl

from dunning.ledger.sql import SqlConnection

# whether the suppression row `s` holds its address on the day `?`: an operator's date not passed, or for good (no
# date, or a bounce or complaint waiting behind the operator's date)
HOLDS = "(s.until IS NULL OR s.until >= ? OR s.pending_reason IS NOT NULL)"
IN_FORCE = f"s.active_email IS NOT NULL AND {HOLDS}"
# what holds the address on the day `?`: the bounce or complaint behind an operator's date once that date has passed
EFFECTIVE_REASON = "CASE WHEN s.pending_reason IS NOT NULL AND s.until < ? THEN s.pending_reason ELSE s.reason END"
SUPPRESSION_COLUMNS = (
    "s.email, s.reason, s.source, s.note, s.customer_id, s.created_at, s.until, s.pending_reason, s.pending_source"
)
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
        "verdict": pl.String,
    }
)


@dataclass(frozen=True)
class Suppressed:
    """What `suppress` did: a new suppression, or the one in force kept (updated when an operator gave one)."""

    suppression_id: str
    new: bool


@dataclass(frozen=True)
class Condemned:
    """What `suppress_many` did: the addresses it suppressed now, and those already suppressed by an operator until a
    date, which its bounce or complaint holds for good after that date (`pending_reason`)."""

    suppressed: list[str]
    after_operator: list[str]


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

    def suppress_many(self, rows: pl.DataFrame, at: dt.datetime) -> Condemned:
        """Suppress each address of `rows` (`email`, `reason`, `source`, `customer_id`, `event_key`) for good, never
        lengthening an operator's suppression: a new row, or, for an address an operator suppressed until a date that
        has not passed, the report kept on that row to hold the address once the date has passed (module docstring).
        The first row of an address wins; an address suppressed for good already is left as it is."""
        if rows.is_empty():
            return Condemned([], [])
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
                "WHERE active_email IN (SELECT email FROM suppress_rows) AND until IS NOT NULL AND until < ? "
                "AND pending_reason IS NULL",
                [at, at.date()],
            )
            waiting = self.con.execute(
                """
                UPDATE suppressions SET pending_reason = r.reason, pending_source = r.source,
                                        pending_event_key = r.event_key, pending_at = ?
                FROM suppress_rows r
                WHERE suppressions.active_email = r.email AND suppressions.until IS NOT NULL
                  AND suppressions.pending_reason IS NULL
                RETURNING suppressions.email
                """,
                [at],
            ).fetchall()
            inserted = self.con.execute(
                """
                INSERT INTO suppressions (suppression_id, email, active_email, reason, source, note, customer_id,
                                          event_key, created_at, until)
                SELECT * FROM suppress_rows ORDER BY email
                ON CONFLICT (active_email) DO NOTHING
                RETURNING email
                """
            ).fetchall()
        return Condemned(sorted(e for (e,) in inserted), sorted(e for (e,) in waiting))

    def unsuppress(self, email: str, by: str, at: dt.datetime) -> bool:
        """Lift the suppression in force for `email` (any case); False when there is none."""
        rows = self.con.execute(
            "UPDATE suppressions SET active_email = NULL, lifted_at = ?, lifted_by = ? WHERE active_email = ? "
            "RETURNING suppression_id",
            [at, by, email.strip().lower()],
        ).fetchall()
        return bool(rows)

    def suppressed_emails(self, on: dt.date) -> pl.DataFrame:
        """The addresses suppressed on `on` (lower-case `email`, `reason`): an operator's `until` before that day has
        ended, unless a bounce or complaint waits behind it (then that is the reason)."""
        return self.frame(
            f"SELECT s.email, {EFFECTIVE_REASON} AS reason FROM suppressions s WHERE {IN_FORCE} ORDER BY s.email",
            [on, on],
        )

    def open_suppressions(self, on: dt.date) -> pl.DataFrame:
        """Every suppression in force on `on`, newest first, for `dunning status` (`pending_reason`: a bounce or
        complaint that holds the address for good after an operator's `until`)."""
        return self.frame(
            f"SELECT {SUPPRESSION_COLUMNS} FROM suppressions s WHERE {IN_FORCE} ORDER BY s.created_at DESC, s.email",
            [on],
        )

    def contacts_to_fix(self, on: dt.date) -> pl.DataFrame:
        """The customers who need a new address: a run held their keys for an address still suppressed on `on`
        (`customer_id`, `email`, `reason`, `since`: when it was suppressed)."""
        return self.frame(
            f"""
            SELECT a.customer_id, a.email, {EFFECTIVE_REASON} AS reason, s.created_at AS since
            FROM suppression_alerts a JOIN suppressions s ON s.active_email = a.email
            WHERE {HOLDS}
            ORDER BY a.customer_id, a.email
            """,
            [on, on],
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
        """The keys on record under each id in `ids`, looked up in `column`: `message_id` (the Message-ID as sent,
        angle brackets included) or `provider_message_id` (Resend's id). One row per key the email was minted for
        (a key that failed for good keeps its row and its Message-ID, which is signed over all of them): `id`,
        `idempotency_key`, `status`, `customer_id`, `customer_email`."""
        if column not in ("message_id", "provider_message_id"):
            raise ValueError(f"not an id column of reminder_ledger: {column}")
        asked = pl.DataFrame({"id": sorted(set(ids))}, schema={"id": pl.String})
        with self.registered("asked_ids", asked):
            return self.frame(
                f"""
                SELECT a.id, l.idempotency_key, l.status, l.customer_id, l.customer_email, l.recipients
                FROM reminder_ledger l JOIN asked_ids a ON l.{column} = a.id
                ORDER BY a.id, l.idempotency_key
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

    def reports_to_confirm(self, since: dt.datetime, on: dt.date) -> pl.DataFrame:
        """Hard bounces and complaints recorded since `since` that suppressed nothing because nothing proves they are
        about our email, although they may be genuine: a mailbox report that quotes no Message-ID, or a legacy one
        (`verdict` `no_message_id`, `legacy`), about an address not suppressed on `on`. The newest per address, for a
        human to confirm with `dunning suppress` (`dunning status`)."""
        return self.frame(
            f"""
            SELECT email, kind, source, verdict, message_id, customer_id, recorded_at FROM (
                SELECT d.*, row_number() OVER (PARTITION BY d.email ORDER BY d.recorded_at DESC, d.event_key) AS n
                FROM delivery_events d
                WHERE d.kind IN ('hard_bounce', 'complaint') AND NOT d.suppressed AND d.email IS NOT NULL
                  AND d.verdict IN ('no_message_id', 'legacy') AND d.recorded_at >= ?
                  AND NOT EXISTS (SELECT 1 FROM suppressions s WHERE s.active_email = d.email AND {IN_FORCE})
            ) newest WHERE n = 1
            ORDER BY recorded_at DESC, email
            """,
            [since, on],
        )

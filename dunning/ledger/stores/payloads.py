"""The exact request of each `unknown` send to an idempotent provider, kept so a later cycle resubmits it.

A provider with an idempotency contract answers a repeated key with the first
result for a while, but only when the request is the same. So the request is
kept byte for byte (`payload`, text: JSON for an HTTP API, base64 of the bytes
for SMTP) with the wall-clock time of its first attempt, and resubmitted as
is, never re-rendered from a newer snapshot. A definite answer (sent or
failed) drops it: a later retry of a failed email is a new request.
"""

from __future__ import annotations

import polars as pl

from dunning.ledger.sql import SqlConnection
from dunning.safe_text import redact

PAYLOAD_SCHEMA = pl.Schema(
    {
        "email_id": pl.String(),
        "idempotency_key": pl.String(),
        "provider": pl.String(),
        "payload": pl.String(),
        "first_attempt_wall_at": pl.Datetime("us", "UTC"),
    }
)  # `held_reason` starts null: a kept request may be resubmitted


class PayloadStore(SqlConnection):
    def keep_payloads(self, payloads: pl.DataFrame) -> None:
        """Keep one payload per email (PAYLOAD_SCHEMA); an email already kept keeps its first attempt's."""
        if payloads.is_empty():
            return
        with self.transaction(), self.registered("kept_payloads", payloads.cast(PAYLOAD_SCHEMA)):
            self.insert_by_name("provider_payloads", "kept_payloads", on_conflict_do_nothing=True)

    def drop_payloads(self, email_ids: list[str]) -> None:
        if not email_ids:
            return
        frame = pl.DataFrame({"email_id": sorted(set(email_ids))}, schema={"email_id": pl.String})
        with self.transaction(), self.registered("settled_emails", frame):
            self.con.execute(
                "DELETE FROM provider_payloads WHERE email_id IN (SELECT email_id FROM settled_emails)", []
            )

    def unknown_sends(self, include_claimed: bool = False) -> pl.DataFrame:
        """Every `unknown` key with what may settle it: its message ids and, when kept, its email's payload; and
        what the present is checked against before a resubmission (`dunning.send.resubmission`). With
        `include_claimed`, claimed keys too: those of a dead run become `unknown` in the send step, after the plan
        has judged the present for them."""
        statuses = "('unknown', 'claimed')" if include_claimed else "('unknown')"
        return self.frame(
            f"""
            SELECT l.idempotency_key, l.email_id, l.message_id, l.provider_message_id,
                   l.kind, l.invoice_id, l.customer_id, l.customer_email, l.amount_minor, l.last_error,
                   p.idempotency_key AS provider_key, p.provider, p.payload, p.first_attempt_wall_at, p.held_reason
            FROM reminder_ledger l LEFT JOIN provider_payloads p ON p.email_id = l.email_id
            WHERE l.status IN {statuses} AND l.message_id IS NOT NULL
            ORDER BY l.email_id, l.idempotency_key
            """
        )

    def hold_unknown(self, held: pl.DataFrame) -> int:
        """Note why each email's kept request is not resubmitted now (`email_id`, `held_reason`, `note`; a null
        reason: it may be again). Only what changed is written, so an hour that holds the same emails for the same
        reasons leaves the ledger as it was (the hourly no-op compares its state). The key's `outcome_wall_at` stays:
        it is how long the outcome has waited for a human (`dunning.send.liveness`)."""
        if held.is_empty():
            return 0
        rows = held.select(
            "email_id", "held_reason", pl.col("note").map_elements(redact, return_dtype=pl.String)
        ).unique("email_id", keep="first")
        with self.transaction() as con, self.registered("held_emails", rows):
            changed = con.execute(
                """
                UPDATE provider_payloads SET held_reason = h.held_reason FROM held_emails h
                WHERE provider_payloads.email_id = h.email_id
                  AND provider_payloads.held_reason IS DISTINCT FROM h.held_reason
                RETURNING provider_payloads.email_id
                """
            ).fetchall()
            con.execute(
                """
                UPDATE reminder_ledger SET last_error = h.note FROM held_emails h
                WHERE reminder_ledger.email_id = h.email_id AND reminder_ledger.status = 'unknown'
                  AND h.note IS NOT NULL AND reminder_ledger.last_error IS DISTINCT FROM h.note
                """
            )
        return len(changed)

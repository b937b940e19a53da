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

PAYLOAD_SCHEMA = pl.Schema(
    {
        "email_id": pl.String(),
        "idempotency_key": pl.String(),
        "provider": pl.String(),
        "payload": pl.String(),
        "first_attempt_wall_at": pl.Datetime("us", "UTC"),
    }
)


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

    def unknown_sends(self) -> pl.DataFrame:
        """Every `unknown` key with what may settle it: its message ids and, when kept, its email's payload."""
        return self.frame(
            """
            SELECT l.idempotency_key, l.email_id, l.message_id, l.provider_message_id,
                   p.idempotency_key AS provider_key, p.provider, p.payload, p.first_attempt_wall_at
            FROM reminder_ledger l LEFT JOIN provider_payloads p ON p.email_id = l.email_id
            WHERE l.status = 'unknown' AND l.message_id IS NOT NULL
            ORDER BY l.email_id, l.idempotency_key
            """
        )

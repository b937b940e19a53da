"""Escalations a human answers, and the failed keys an operator puts back in line (`dunning retry`).

An escalation whose receiver refused it for good (a 4xx, not retried, or a retried failure whose attempts are used
up: `retry.max_attempts`) stays `failed` with `refused_at` set: the invoice waits for a human, listed by
`dunning status`, its reminders held (`escalation_refused`), and one alert of kind `escalation_refused` is raised for
it, its id kept in `refusal_alert_id` so that no run raises a second one for the same refusal. A human then
answers: `dunning retry` (the cause is fixed: back in line, a new refusal pages again), `dunning resolve --sent` (it
was handed over another way), or `dunning resolve --not-sent` (it will not be: the key is recorded `skipped`,
reason `not_escalated`, and the invoice goes back to its reminders for the rest of the cycle).

A `failed` key whose body is kept (`provider_payloads`) was released without an answer: its run ended before the
request left (the hand-over journal, `dunning.send.handover`), or its lease ran out first. A later run posts that
body again under the same key (`dunning.send.escalating`).
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from dunning.ledger.sql import SqlConnection
from dunning.vocabulary import EmailKind, LedgerStatus

NOT_ESCALATED = "not_escalated"  # `skip_reason` of a refused escalation a human gave back to the reminders
# a refusal's `next_attempt_at` is a century after its claim (`send.escalation.NO_RETRY_SECONDS`): past this margin,
# it is not a backoff but "never"
NEVER_AFTER = dt.timedelta(days=50 * 365)
REFUSED_COLUMNS = (
    "idempotency_key", "invoice_id", "customer_id", "cycle", "policy", "amount_minor", "currency", "attempts",
    "last_error", "refused_at", "refusal_alert_id",
)  # fmt: skip


def _keys(keys: list[str] | set[str]) -> pl.DataFrame:
    return pl.DataFrame({"idempotency_key": sorted(set(keys))}, schema={"idempotency_key": pl.String})


class EscalationStore(SqlConnection):
    """Refused escalations, released hand-overs and keys put back in line, on the ledger's connection."""

    def key_states(self, keys: list[str]) -> pl.DataFrame:
        """`idempotency_key`, `kind`, `status`, `refused_at` of the keys of `keys` on record (the others are not)."""
        with self.registered("asked_keys", _keys(keys)):
            return self.frame(
                "SELECT idempotency_key, kind, status, refused_at FROM reminder_ledger "
                "WHERE idempotency_key IN (SELECT idempotency_key FROM asked_keys) ORDER BY idempotency_key"
            )

    def released_escalations(self, keys: list[str]) -> pl.DataFrame:
        """Of `keys`, the `failed` escalations whose body is kept: released without an answer, to post again as they
        were claimed (`idempotency_key`, `message_id`, `payload`)."""
        with self.registered("asked_keys", _keys(keys)):
            return self.frame(
                """
                SELECT l.idempotency_key, l.message_id, p.payload FROM reminder_ledger l
                JOIN provider_payloads p ON p.email_id = l.email_id AND p.provider = 'escalation'
                WHERE l.kind = 'escalation' AND l.status = 'failed'
                  AND l.idempotency_key IN (SELECT idempotency_key FROM asked_keys)
                ORDER BY l.idempotency_key
                """
            )

    def retake_released(
        self, keys: list[str], run_id: str, claimed_at: dt.datetime, lease_until: dt.datetime
    ) -> set[str]:
        """Claim released escalations for this run (only rows still `failed`: a retry is taken once)."""
        if not keys:
            return set()
        with self.transaction() as con, self.registered("retaken_keys", _keys(keys)):
            return {
                k
                for (k,) in con.execute(
                    """
                    UPDATE reminder_ledger SET status = 'claimed', run_id = ?, claimed_at = ?, lease_expires_at = ?
                    WHERE kind = 'escalation' AND status = 'failed'
                      AND idempotency_key IN (SELECT idempotency_key FROM retaken_keys)
                    RETURNING idempotency_key
                    """,
                    [run_id, claimed_at, lease_until],
                ).fetchall()
            }

    def mark_refused_escalations(self, max_attempts: int, at: dt.datetime) -> int:
        """Failed escalations that will not be retried (a refusal, or attempts used up) get `refused_at`; returns how
        many became refused now."""
        return self.changed_rows(
            """
            UPDATE reminder_ledger SET refused_at = ?
            WHERE kind = 'escalation' AND status = 'failed' AND refused_at IS NULL
              AND (attempts >= ? OR next_attempt_at >= ?)
            """,
            [at, max_attempts, at + NEVER_AFTER],
        )

    def refusals_to_page(self) -> pl.DataFrame:
        """Refused escalations no alert was raised for yet (REFUSED_COLUMNS)."""
        return self.frame(
            f"SELECT {', '.join(REFUSED_COLUMNS)} FROM reminder_ledger "
            "WHERE kind = 'escalation' AND status = 'failed' AND refused_at IS NOT NULL AND refusal_alert_id IS NULL "
            "ORDER BY idempotency_key"
        )

    def take_refusal_alert(self, key: str, alert_id: str) -> bool:
        """Name `alert_id` as the one alert of this refusal; False when another run named one first."""
        return bool(
            self.con.execute(
                "UPDATE reminder_ledger SET refusal_alert_id = ? WHERE idempotency_key = ? AND status = 'failed' "
                "AND refused_at IS NOT NULL AND refusal_alert_id IS NULL RETURNING idempotency_key",
                [alert_id, key],
            ).fetchall()
        )

    def refused_escalations(self) -> pl.DataFrame:
        """Every escalation refused for good and not answered by a human yet (REFUSED_COLUMNS), for `status`."""
        return self.frame(
            f"SELECT {', '.join(REFUSED_COLUMNS)} FROM reminder_ledger "
            "WHERE kind = 'escalation' AND status = 'failed' AND refused_at IS NOT NULL ORDER BY refused_at, "
            "idempotency_key"
        )

    def escalation_states(self, keys: list[str]) -> pl.DataFrame:
        """`idempotency_key`, `status`, `refused` (bool) of the escalation keys of `keys` on record."""
        with self.registered("asked_keys", _keys(keys)):
            return self.frame(
                "SELECT idempotency_key, status, refused_at IS NOT NULL AND status = 'failed' AS refused "
                "FROM reminder_ledger WHERE idempotency_key IN (SELECT idempotency_key FROM asked_keys)"
            )

    def put_back_failed(self, keys: list[str], kinds: tuple[str, ...], note: str, wall: dt.datetime) -> list[str]:
        """`dunning retry`: each `failed` key of `keys` whose kind a run retries (`kinds`) gets its attempts back, no
        backoff and no refusal, and `note` (who, when) before its last error; the alert of a refusal is resolved.
        Returns the keys put back."""
        with self.transaction() as con, self.registered("retried_keys", _keys(keys)):
            found = con.execute(
                "SELECT idempotency_key, kind, refusal_alert_id FROM reminder_ledger WHERE status = 'failed' "
                "AND idempotency_key IN (SELECT idempotency_key FROM retried_keys)"
            ).fetchall()
            taken = [(k, alert) for k, kind, alert in found if kind in kinds]
            if not taken:
                return []
            with self.registered("put_back", _keys([k for k, _ in taken])):
                con.execute(
                    """
                    UPDATE reminder_ledger SET attempts = 0, next_attempt_at = NULL, refused_at = NULL,
                        refusal_alert_id = NULL, outcome_wall_at = ?,
                        last_error = substr(? || coalesce(' (was: ' || last_error || ')', ''), 1, 1000)
                    WHERE status = 'failed' AND idempotency_key IN (SELECT idempotency_key FROM put_back)
                    """,
                    [wall, note],
                )
            self._resolve_alerts([a for _, a in taken if a], wall)
        return sorted(k for k, _ in taken)

    def resolve_refused(self, keys: list[str], sent: bool, note: str, wall: dt.datetime) -> list[str]:
        """A human's answer for refused escalations: handed over another way (`sent`), or not to be (recorded
        `skipped`, reason `not_escalated`: the invoice's reminders go on). Their alerts are resolved, their kept
        bodies dropped. Returns the keys answered."""
        status, reason = (LedgerStatus.SENT, None) if sent else (LedgerStatus.SKIPPED, NOT_ESCALATED)
        with self.transaction() as con, self.registered("resolved_keys", _keys(keys)):
            found = con.execute(
                "SELECT idempotency_key, refusal_alert_id FROM reminder_ledger WHERE kind = ? AND status = 'failed' "
                "AND refused_at IS NOT NULL AND idempotency_key IN (SELECT idempotency_key FROM resolved_keys)",
                [EmailKind.ESCALATION],
            ).fetchall()
            if not found:
                return []
            with self.registered("answered_keys", _keys([k for k, _ in found])):
                con.execute(
                    """
                    UPDATE reminder_ledger SET status = ?, skip_reason = ?, sent_at = CASE WHEN ? THEN claimed_at END,
                        last_error = ?, outcome_wall_at = ?, next_attempt_at = NULL, refused_at = NULL,
                        refusal_alert_id = NULL
                    WHERE status = 'failed' AND idempotency_key IN (SELECT idempotency_key FROM answered_keys)
                    """,
                    [status, reason, sent, note, wall],
                )
            self._resolve_alerts([a for _, a in found if a], wall)
            self.drop_escalation_bodies([k for k, _ in found])
        return sorted(k for k, _ in found)

    def drop_escalation_bodies(self, keys: list[str]) -> None:
        """Escalations settled for good (sent, or answered by a human): their kept bodies are never posted again."""
        if len(keys) == 1:  # the loop's one answer at a time: a frame to register would cost more than the delete
            self.con.execute("DELETE FROM provider_payloads WHERE provider = 'escalation' AND email_id = ?", keys)
            return
        if not keys:
            return
        with self.transaction() as con, self.registered("settled_keys", _keys(keys)):
            con.execute(
                "DELETE FROM provider_payloads WHERE provider = 'escalation' "
                "AND email_id IN (SELECT idempotency_key FROM settled_keys)",
                [],
            )

    def _resolve_alerts(self, alert_ids: list[str], wall: dt.datetime) -> None:
        if not alert_ids:
            return
        frame = pl.DataFrame({"alert_id": sorted(set(alert_ids))}, schema={"alert_id": pl.String})
        with self.registered("answered_alerts", frame):
            self.con.execute(
                "UPDATE alerts SET resolved_at = ? WHERE resolved_at IS NULL "
                "AND alert_id IN (SELECT alert_id FROM answered_alerts)",
                [wall],
            )

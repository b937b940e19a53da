"""Claims and outcomes: the part of the ledger that decides what may be sent.

A claim is ours only once its transaction commits; a commit (or write) that
fails on a conflict (the backend's `lost_claim_errors`: DuckDB's
`TransactionException`/`ConstraintException`, PostgreSQL's deadlock and
serialization failures) means another writer won, and nothing of that chunk is
sent. The per-customer cap is
enforced a second time here, inside the claim transaction: every claim first
writes the customer's row in `customer_claim_locks`, so two transactions that
claim for the same customer conflict and one of them loses, instead of both
counting the window, both seeing room, and both sending (write skew).

On PostgreSQL (READ COMMITTED) the lock rows are taken in customer_id order and
the ledger rows inserted in idempotency_key order, so racing workers wait for
each other instead of deadlocking; the window is counted by a later statement
than the one that took the locks, so it sees what the previous holder committed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import polars as pl

from dunning.ledger.schema.tables import LEDGER_COLUMNS
from dunning.ledger.sql import Executes, SqlConnection
from dunning.ledger.stores.payloads import PAYLOAD_SCHEMA
from dunning.ledger.stores.suppressions import HOLDS
from dunning.safe_text import redact
from dunning.secret_env import holding_any, scrub
from dunning.vocabulary import PROVIDER_STATUSES, EmailKind, LedgerStatus, PlanRole, plain


@dataclass(frozen=True)
class ClaimCap:
    max_emails: int
    window_start: dt.datetime
    window_end: dt.datetime


@dataclass
class ClaimResult:
    won: set[str] = field(default_factory=set)
    throttled: set[str] = field(default_factory=set)
    suppressed: set[str] = field(default_factory=set)  # addressed to a suppressed address when claimed: not claimed
    lost: bool = False


def within_cap(due: pl.DataFrame, recent: pl.DataFrame, cap: ClaimCap) -> pl.DataFrame:
    """The rows of `due` whose email still fits under the customer's cap, emails in group order."""
    emails = (
        due.select("customer_id", "email_group")
        .unique()
        .sort("customer_id", "email_group")
        .with_columns(pl.int_range(1, pl.len() + 1).over("customer_id").alias("nth"))
        .join(recent, on="customer_id", how="left")
        .with_columns(pl.col("emails").fill_null(0))
    )
    allowed = emails.filter(pl.col("emails") + pl.col("nth") <= cap.max_emails).select("email_group")
    return due.join(allowed, on="email_group", how="semi")


# a failed key's backoff: `backoff_minutes` (the parameter) doubled per attempt already made
BACKOFF_MICROSECONDS = """CAST(? * 60000000 * pow(2, greatest(reminder_ledger.attempts
    - CASE WHEN o.status = 'released' THEN 1 ELSE 0 END, 0)) AS BIGINT)"""
# and no sooner than the provider asked (a 429's Retry-After)
RETRY_DELAY_MICROSECONDS = f"greatest({BACKOFF_MICROSECONDS}, coalesce(o.retry_after_us, 0))"


def _recordable(error: str) -> str:
    return redact(scrub(error) if holding_any() else error)


def _policy(rows: pl.DataFrame) -> pl.Expr:
    """`reminder_ledger.policy`: the policy that governed the key (`dunning.plan.policies`), `default` without one."""
    return (pl.col("policy").fill_null("default") if "policy" in rows.columns else pl.lit("default")).alias("policy")


class ClaimStore(SqlConnection):
    """Claims and outcomes, on the ledger's connection."""

    def claim_owners(self, run_id: str) -> list[str]:
        """Runs other than `run_id` that hold claims (the caller knows which of them are dead)."""
        return [
            r
            for (r,) in self.con.execute(
                "SELECT DISTINCT run_id FROM reminder_ledger WHERE status = 'claimed' AND run_id IS DISTINCT FROM ?",
                [run_id],
            ).fetchall()
        ]

    def expire_stale_claims(
        self,
        run_id: str,
        now: dt.datetime,
        dead_runs: Sequence[str] = (),
        handed_over: Callable[[str], set[str] | None] | None = None,
    ) -> int:
        """Claims whose owner is gone become `unknown`, never unsent; a live run's claims are left alone.

        A claim is stale when its lease (wall clock) ran out, when its run is
        known dead (`dead_runs`, e.g. failed in the Dagster instance), or when
        it has no lease at all (written by a release before leases). With
        `handed_over` (a run's hand-over journal, `dunning.send.handover`: the
        Message-IDs it may have handed over, or None when its journal cannot
        be trusted), a claim whose email is not in its run's journal was never
        handed over: it becomes `failed` without counting an attempt, retried
        like any failure. Returns how many claims were expired.
        """
        with self.registered("dead_runs", pl.DataFrame({"run_id": list(dead_runs)}, schema={"run_id": pl.String})):
            stale = self.frame(
                """
                SELECT run_id, idempotency_key, message_id FROM reminder_ledger
                WHERE status = 'claimed' AND run_id IS DISTINCT FROM ?
                  AND (lease_expires_at IS NULL OR lease_expires_at <= ? OR run_id IN (SELECT run_id FROM dead_runs))
                """,
                [run_id, now],
            )
        if stale.is_empty():
            return 0
        never: list[str] = []
        if handed_over is not None:
            for (owner,), rows in stale.group_by("run_id"):
                journal = handed_over(str(owner)) if owner is not None else None
                if journal is not None:
                    never += (
                        rows.filter(~pl.col("message_id").is_in(list(journal))).get_column("idempotency_key").to_list()
                    )
        released = pl.DataFrame({"idempotency_key": never}, schema={"idempotency_key": pl.String})
        keys = stale.select("idempotency_key")
        with self.transaction() as con, self.registered("stale_keys", keys), self.registered("never_sent", released):
            con.execute(
                """
                UPDATE reminder_ledger SET status = 'failed', outcome_wall_at = ?, next_attempt_at = NULL,
                    last_error = 'never handed over: its run ended after the claim, before the hand-over (journal)'
                WHERE status = 'claimed' AND idempotency_key IN (SELECT idempotency_key FROM never_sent)
                """,
                [now],
            )
            con.execute(
                """
                UPDATE reminder_ledger SET status = 'unknown',
                    last_error = 'no outcome recorded (run ended after claim)', outcome_wall_at = ?
                WHERE status = 'claimed' AND idempotency_key IN (SELECT idempotency_key FROM stale_keys)
                """,
                [now],
            )
        return stale.height

    def renew_leases(self, run_id: str, lease_until: dt.datetime) -> int:
        """Extend this run's claims while it is still sending them."""
        return self.changed_rows(
            "UPDATE reminder_ledger SET lease_expires_at = ? WHERE status = 'claimed' AND run_id = ?",
            [lease_until, run_id],
        )

    def claim(
        self,
        due: pl.DataFrame,
        skipped: pl.DataFrame,
        run_id: str,
        claimed_at: dt.datetime,
        cap: ClaimCap | None = None,
        lease_until: dt.datetime | None = None,
        bodies: pl.DataFrame | None = None,
    ) -> ClaimResult:
        """Insert `due` as `claimed` and, for invoices whose claim we won, `skipped` stages; one transaction.

        `bodies` (PAYLOAD_SCHEMA rows, one per key): the request each key's hand-over will make, kept in the same
        transaction for the keys this claim wins, in place of any kept before (`dunning.send.escalating`): what a
        run that dies mid-request leaves is resubmitted exactly as it may have left."""
        stamp = [pl.lit(run_id).alias("run_id"), pl.lit(claimed_at).alias("claimed_at")]
        customers = due.select("customer_id").unique()
        result = ClaimResult()
        try:
            with self.transaction() as con, self.registered("claim_customers", customers):
                con.execute(
                    "INSERT INTO customer_claim_locks SELECT customer_id, ? FROM claim_customers ORDER BY customer_id "
                    "ON CONFLICT (customer_id) DO UPDATE SET touched_at = excluded.touched_at",
                    [claimed_at],
                )
                if cap is None:
                    allowed = due
                else:
                    recent = self.emails_in_window(cap.window_start, cap.window_end, only_customers=customers)
                    allowed = within_cap(due, recent, cap)
                result.throttled = set(due.get_column("idempotency_key")) - set(allowed.get_column("idempotency_key"))
                result.suppressed = self._suppressed_keys(con, allowed, claimed_at)
                if result.suppressed:
                    allowed = allowed.filter(~pl.col("idempotency_key").is_in(sorted(result.suppressed)))
                is_retry = pl.col("role") == PlanRole.RETRY if "role" in allowed.columns else pl.lit(False)
                lease = pl.lit(lease_until, dtype=pl.Datetime("us", "UTC")).alias("lease_expires_at")
                rows = (
                    allowed.filter(~is_retry)
                    .with_columns(pl.lit(LedgerStatus.CLAIMED).alias("status"), *stamp)
                    .select(*LEDGER_COLUMNS, lease, _policy(allowed))
                )
                retries = allowed.filter(is_retry).select(  # the guard as a join condition: see record_outcomes
                    "idempotency_key", "amount_minor", "customer_email", _policy(allowed),
                    pl.lit("failed").alias("expected_status"),
                )  # fmt: skip
                with self.registered("due_rows", rows), self.registered("retry_rows", retries):
                    inserted = self.insert_by_name(
                        "reminder_ledger",
                        "due_rows",
                        new_keys_only="idempotency_key",
                        returning="idempotency_key",
                        order_by="idempotency_key",
                    )
                    result.won = {k for (k,) in inserted}
                    result.won |= self._retake_failed(con, run_id, claimed_at, lease_until)
                won = allowed.filter(pl.col("idempotency_key").is_in(list(result.won)))
                self._record_skipped_and_advance(con, won, skipped, stamp)
                if bodies is not None and result.won:
                    self._keep_bodies(con, bodies.filter(pl.col("idempotency_key").is_in(list(result.won))))
        except self.lost_claim_errors:
            return ClaimResult(lost=True)
        return result

    def _keep_bodies(self, con: Executes, bodies: pl.DataFrame) -> None:
        with self.registered("claimed_bodies", bodies.cast(PAYLOAD_SCHEMA)):
            con.execute("DELETE FROM provider_payloads WHERE email_id IN (SELECT email_id FROM claimed_bodies)")
            self.insert_by_name("provider_payloads", "claimed_bodies")

    def _suppressed_keys(self, con: Executes, rows: pl.DataFrame, claimed_at: dt.datetime) -> set[str]:
        """The keys of `rows` whose email goes to an address suppressed now (`ledger.stores.suppressions`), read in
        the claim's transaction: a suppression recorded while the run was sending holds what it has not claimed.
        An escalation is not an email and is never held by one."""
        emails = rows.filter(pl.col("kind") != EmailKind.ESCALATION).select(
            "idempotency_key", pl.col("customer_email").str.to_lowercase().alias("email")
        )
        if emails.is_empty():
            return set()
        with self.registered("claim_addresses", emails.drop_nulls("email")):
            found = con.execute(
                f"""
                SELECT c.idempotency_key FROM claim_addresses c JOIN suppressions s ON s.active_email = c.email
                WHERE {HOLDS}
                """,
                [claimed_at.date()],
            ).fetchall()
        return {k for (k,) in found}

    @staticmethod
    def _retake_failed(
        con: Executes, run_id: str, claimed_at: dt.datetime, lease_until: dt.datetime | None
    ) -> set[str]:
        """Re-claim failed keys for a retry: the UPDATE only matches rows still `failed`, so a retry is taken once."""
        return {
            k
            for (k,) in con.execute(
                """
            UPDATE reminder_ledger SET status = 'claimed', run_id = ?, claimed_at = ?, amount_minor = r.amount_minor,
                customer_email = r.customer_email, lease_expires_at = ?, policy = r.policy
            FROM retry_rows r
            WHERE reminder_ledger.idempotency_key = r.idempotency_key AND reminder_ledger.status = r.expected_status
            RETURNING reminder_ledger.idempotency_key
            """,
                [run_id, claimed_at, lease_until],
            ).fetchall()
        }

    def resolve_by_hand(self, keys: list[str], sent: bool, note: str, wall: dt.datetime) -> list[str]:
        """An operator's answer for `unknown` keys: sent (never resend) or not sent (retry like a failure)."""
        with self.registered(
            "resolved_keys", pl.DataFrame({"idempotency_key": keys}, schema={"idempotency_key": pl.String})
        ):
            return [
                k
                for (k,) in self.con.execute(
                    """
                UPDATE reminder_ledger SET status = ?, sent_at = CASE WHEN ? THEN claimed_at END,
                    last_error = ?, outcome_wall_at = ?, next_attempt_at = NULL
                WHERE status = 'unknown' AND idempotency_key IN (SELECT idempotency_key FROM resolved_keys)
                RETURNING idempotency_key
                """,
                    [LedgerStatus.SENT if sent else LedgerStatus.FAILED, sent, note, wall],
                ).fetchall()
            ]

    def retryable_failures(
        self, as_of: dt.datetime, max_attempts: int, kind: EmailKind = EmailKind.REMINDER
    ) -> pl.DataFrame:
        """Failed keys of `kind` whose backoff is over and whose attempts are not used up."""
        return self.frame(
            """
            SELECT idempotency_key, invoice_id, cycle, stage, email_id, message_id, attempts FROM reminder_ledger
            WHERE status = 'failed' AND kind = ? AND attempts < ?
              AND (next_attempt_at IS NULL OR next_attempt_at <= ?)
            """,
            [kind, max_attempts, as_of],
        )

    def _record_skipped_and_advance(
        self, con: Executes, won: pl.DataFrame, skipped: pl.DataFrame, stamp: list[pl.Expr]
    ) -> None:
        reminders = won.filter(pl.col("kind") == EmailKind.REMINDER)
        if reminders.is_empty():
            return
        skip_rows = (
            skipped.join(reminders.select("invoice_id"), on="invoice_id", how="semi")
            .with_columns(pl.lit(LedgerStatus.SKIPPED).alias("status"), *stamp)
            .select(*LEDGER_COLUMNS, _policy(skipped))
            .unique("idempotency_key", maintain_order=True)  # `new_keys_only`: each key once
        )
        advanced = reminders.select("invoice_id", "cycle", "stage", "stage_days")
        with self.registered("skip_rows", skip_rows), self.registered("won_rows", advanced):
            self.insert_by_name(
                "reminder_ledger", "skip_rows", new_keys_only="idempotency_key", order_by="idempotency_key"
            )
            con.execute(  # -10000: no stage on record (`plan.policies.NO_STAGE`; stages go down to -60 days)
                """
                UPDATE invoice_cycles SET last_stage = w.stage, last_stage_days = w.stage_days
                FROM won_rows w
                WHERE invoice_cycles.invoice_id = w.invoice_id AND invoice_cycles.cycle = w.cycle
                  AND coalesce(invoice_cycles.last_stage_days, -10000) < w.stage_days
                """
            )

    def record_outcomes(
        self,
        outcomes: pl.DataFrame,
        sent_at: dt.datetime | None,
        wall: dt.datetime,
        backoff_minutes: float,
        *,
        expected_status: LedgerStatus = LedgerStatus.CLAIMED,
        run_id: str | None = None,
        settled_by: str | None = None,
    ) -> int:
        """Columns: idempotency_key, status, message_id, error, optionally provider_message_id. One UPDATE for the
        chunk; returns rows updated. `settled_by`: the run that settled these `unknown` keys (lookup, resubmission).

        Every update is guarded by the status it expects: a send's outcome
        only moves `claimed` keys (of `run_id`, when given) and a lookup's only
        `unknown` ones, so a late or repeated outcome can never turn a `sent`
        into a `failed` that would be resent. `released` (never handed over)
        is written as `failed` without counting an attempt. `sent_at` None
        means "when it was claimed" (an outcome learned later, by lookup). A
        `failed` key may be retried after `backoff_minutes * 2^(attempts-1)`, or after its
        `retry_after_seconds` (optional column: the provider's Retry-After) when that is later.
        """
        recorded = outcomes.filter(pl.col("status").is_in(plain(PROVIDER_STATUSES)))
        if "provider_message_id" not in recorded.columns:
            recorded = recorded.with_columns(pl.lit(None, dtype=pl.String).alias("provider_message_id"))
        # a provider's error text may quote a secret (a header) or a URL whose path or query holds a token: never
        # stored as it is (secrets masked, URLs cut to their host: `safe_text.redact`, the alerts' rule)
        recorded = recorded.with_columns(pl.col("error").map_elements(_recordable, return_dtype=pl.String))
        if "retry_after_seconds" not in recorded.columns:
            recorded = recorded.with_columns(pl.lit(None, dtype=pl.Float64).alias("retry_after_seconds"))
        recorded = recorded.with_columns(
            (pl.col("retry_after_seconds") * 1_000_000).cast(pl.Int64).alias("retry_after_us")
        ).drop("retry_after_seconds")
        # the guard travels with each row and is a join condition, not a filter on the ledger: PostgreSQL planned a
        # filter on `status = 'claimed'` from statistics taken before the run claimed anything (about one row), so
        # it scanned the whole chunk once per claimed key (10,000 outcomes: 13 s a chunk, 0.1 s with this)
        recorded = recorded.with_columns(
            pl.lit(str(expected_status), dtype=pl.String).alias("expected_status"),
            pl.lit(run_id, dtype=pl.String).alias("expected_run"),
        )
        with self.registered("outcomes", recorded):
            return self.changed_rows(
                f"""
                UPDATE reminder_ledger SET
                    status = CASE WHEN o.status = 'released' THEN 'failed' ELSE o.status END,
                    message_id = coalesce(o.message_id, reminder_ledger.message_id),
                    provider_message_id = coalesce(o.provider_message_id, reminder_ledger.provider_message_id),
                    sent_at = CASE WHEN o.status = 'sent' THEN coalesce(?::TIMESTAMPTZ, reminder_ledger.claimed_at) END,
                    attempts = reminder_ledger.attempts + CASE WHEN o.status = 'released' THEN 0 ELSE 1 END,
                    last_error = o.error, outcome_wall_at = ?,
                    settled_run_id = coalesce(?, reminder_ledger.settled_run_id),
                    next_attempt_at = CASE WHEN o.status IN ('failed', 'released')
                        THEN coalesce(?::TIMESTAMPTZ, reminder_ledger.claimed_at)
                        + {self.interval_of_microseconds(RETRY_DELAY_MICROSECONDS)} END
                FROM outcomes o
                WHERE reminder_ledger.idempotency_key = o.idempotency_key
                  AND reminder_ledger.status = o.expected_status
                  AND (o.expected_run IS NULL OR reminder_ledger.run_id = o.expected_run)
                """,
                [sent_at, wall, settled_by, sent_at, backoff_minutes],
            )

    def emails_in_window(
        self, since: dt.datetime, until: dt.datetime, only_customers: pl.DataFrame | None = None
    ) -> pl.DataFrame:
        """Per customer, how many distinct emails may have reached them in (since, until].

        The one count both the breaker check and the claim-time cap use; `only_customers` (a frame with
        `customer_id`) narrows it to the customers being claimed for.
        """
        customers = only_customers if only_customers is not None else pl.DataFrame(schema={"customer_id": pl.String})
        # two statements rather than `(? OR customer_id IN ...)`: a parameter in an OR hides the customer filter
        # from PostgreSQL's planner, which then scanned the whole ledger once per claimed chunk
        narrowed = "AND customer_id IN (SELECT customer_id FROM window_customers)" if only_customers is not None else ""
        with self.registered("window_customers", customers.select("customer_id")):
            return self.frame(
                f"""
                SELECT customer_id, count(DISTINCT email_id)::BIGINT AS emails FROM reminder_ledger
                WHERE status IN ('claimed', 'sent', 'unknown') AND kind <> 'escalation'  -- not an email
                  AND coalesce(sent_at, claimed_at) > ? AND coalesce(sent_at, claimed_at) <= ?
                  {narrowed}
                GROUP BY customer_id
                """,
                [since, until],
            )

    def open_problems(self) -> pl.DataFrame:
        """Keys whose send failed or whose outcome is unknown: waiting on a retry, a lookup or a human."""
        return self.frame(
            "SELECT idempotency_key, kind, invoice_id, customer_id, cycle, stage, status, currency, message_id, policy "
            "FROM reminder_ledger WHERE status IN ('failed', 'unknown')"
        )

    def invoices_on_record(self, invoice_ids: pl.Series) -> set[str]:
        """Which of `invoice_ids` have any row in the ledger (a key of any status, of any cycle)."""
        frame = invoice_ids.to_frame("invoice_id").unique()
        with self.registered("asked_invoices", frame):
            return {
                str(i)
                for (i,) in self.con.execute(
                    "SELECT DISTINCT invoice_id FROM reminder_ledger "
                    "WHERE invoice_id IN (SELECT invoice_id FROM asked_invoices)"
                ).fetchall()
            }

    def record_adopted(self, rows: pl.DataFrame, opened: pl.DataFrame, at: dt.datetime) -> int:
        """Going live after another system (`dunning adopt`): in one transaction, the cycles of `opened` (invoice_id,
        cycle) opened at `at`, and `rows` (LEDGER_COLUMNS) recorded `skipped` with reason `adopted`, each invoice's
        cycle advanced to its highest stage; a key already on record is left alone. Returns the rows recorded."""
        stamped = rows.with_columns(
            pl.lit(LedgerStatus.SKIPPED).alias("status"), pl.lit("adopted").alias("skip_reason")
        )
        advanced = rows.group_by("invoice_id", "cycle").agg(
            pl.col("stage").sort_by("stage_days").last(), pl.col("stage_days").max()
        )
        with (
            self.transaction() as con,
            self.registered("adopted_cycles", opened.select("invoice_id", "cycle")),
            self.registered("adopted_rows", stamped.select(*LEDGER_COLUMNS, "skip_reason", _policy(stamped))),
            self.registered("adopted_stages", advanced),
        ):
            con.execute(
                "INSERT INTO invoice_cycles (invoice_id, cycle, cycle_open, opened_at, changed_snapshot_at) "
                "SELECT invoice_id, cycle, true, ?, ? FROM adopted_cycles ORDER BY invoice_id "
                "ON CONFLICT (invoice_id) DO NOTHING",
                [at, at],
            )
            recorded = self.insert_by_name(
                "reminder_ledger", "adopted_rows", on_conflict_do_nothing=True, returning="idempotency_key",
                order_by="idempotency_key",
            )  # fmt: skip
            con.execute(
                """
                UPDATE invoice_cycles SET last_stage = a.stage, last_stage_days = a.stage_days
                FROM adopted_stages a
                WHERE invoice_cycles.invoice_id = a.invoice_id AND invoice_cycles.cycle = a.cycle
                  AND coalesce(invoice_cycles.last_stage_days, -10000) < a.stage_days
                """
            )
        return len(recorded)

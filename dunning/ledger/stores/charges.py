"""Charges: late fees and statutory interest, one row per `fee:{invoice_id}:{cycle}:{kind}` under its primary key.

A charge is inserted by the claim of its reminder, in that claim's transaction (`claims.ClaimStore.claim` calls
`insert_won_charges`), so the two are on record together or not at all. Its amount never changes afterwards. A
decision moves it `proposed` -> `approved` (or `waived`); a post is ledger first: the charges of one invoice and
cycle move to `unknown` (the claim of the post) before the billing system is called, then to `posted` or `failed`;
an `unknown` is settled by looking in the billing system, never by posting blindly. Every update is guarded by the
status it expects, so a late or repeated outcome never moves a `posted` charge.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import polars as pl

from dunning.ledger.sql import SqlConnection

CHARGE_COLUMNS = (
    "charge_key", "invoice_id", "customer_id", "cycle", "kind", "amount_minor", "currency", "basis", "status",
    "policy", "stage", "customer_type", "balance_minor", "reminder_key", "run_id", "claimed_at",
)  # fmt: skip
WAIT_COLUMNS = ("charge_key", "invoice_id", "cycle", "kind", "reason", "reference", "reminder_key", "since")
LISTED = (
    "charge_key, invoice_id, customer_id, cycle, kind, amount_minor, currency, basis, status, policy, stage, "
    "external_id, claimed_at, decided_at, decided_by, note, posted_at, attempts, last_error, customer_type, "
    "balance_minor, run_id, reminder_key"
)


def insert_won_charges(
    store: SqlConnection, charges: pl.DataFrame, waits: pl.DataFrame | None, won: set[str],
    run_id: str, at: dt.datetime,
) -> set[str]:  # fmt: skip
    """In the claim's transaction: the charges (and waits) whose reminder this claim won; returns the charge keys
    inserted (a key already on record is left as it is: never claimed twice in a cycle)."""
    mine = charges.filter(pl.col("reminder_key").is_in(sorted(won)))
    inserted: set[str] = set()
    if mine.height:
        rows = mine.with_columns(pl.lit(run_id).alias("run_id"), pl.lit(at).alias("claimed_at")).select(CHARGE_COLUMNS)
        with store.registered("won_charges", rows):
            inserted = {
                k for (k,) in store.insert_by_name("charges", "won_charges", on_conflict_do_nothing=True,
                                                   returning="charge_key", order_by="charge_key")
            }  # fmt: skip
    if waits is not None and waits.height:
        waiting = waits.filter(pl.col("reminder_key").is_in(sorted(won)))
        if waiting.height:
            rows = waiting.with_columns(pl.lit(at).alias("since")).select(WAIT_COLUMNS)
            with store.registered("won_waits", rows):
                store.insert_by_name("charge_waits", "won_waits", on_conflict_do_nothing=True, order_by="charge_key")
    return inserted


class ChargeStore(SqlConnection):
    """The `charges` table, on the ledger's connection."""

    def charges(self, statuses: tuple[str, ...] = ()) -> pl.DataFrame:
        """Every charge (or those of `statuses`), oldest first."""
        if not statuses:
            return self.frame(f"SELECT {LISTED} FROM charges ORDER BY claimed_at, charge_key")
        marks = ", ".join("?" for _ in statuses)
        return self.frame(
            f"SELECT {LISTED} FROM charges WHERE status IN ({marks}) ORDER BY claimed_at, charge_key", list(statuses)
        )

    def charge_keys_on_record(self, invoice_ids: list[str]) -> set[str]:
        """The charge keys (any status, any cycle) of these invoices, and those waiting for the rate table."""
        rows = self._of_invoices(
            invoice_ids,
            "SELECT charge_key FROM charges WHERE invoice_id IN (SELECT invoice_id FROM invoices_asked) UNION "
            "SELECT charge_key FROM charge_waits WHERE invoice_id IN (SELECT invoice_id FROM invoices_asked)",
        )
        return {str(k) for (k,) in rows}

    def interest_on_record(self, invoice_ids: list[str]) -> list[tuple[str, int, dt.datetime]]:
        """(invoice_id, cycle, claimed_at) of each interest charge of these invoices, whatever its status: the days
        up to a claim's business day are charged (or waived) once, never again by a later cycle."""
        rows = self._of_invoices(
            invoice_ids,
            "SELECT invoice_id, cycle, claimed_at FROM charges WHERE kind = 'interest' "
            "AND invoice_id IN (SELECT invoice_id FROM invoices_asked)",
        )
        return [(str(i), int(c), at) for i, c, at in rows]

    def _of_invoices(self, invoice_ids: list[str], sql: str) -> list[tuple[Any, ...]]:
        """`sql`'s rows, with the invoice ids asked registered as the table `invoices_asked`."""
        frame = pl.DataFrame({"invoice_id": invoice_ids}, schema={"invoice_id": pl.String}).unique()
        with self.registered("invoices_asked", frame):
            return list(self.con.execute(sql).fetchall())

    def fee_invoice_ids(self) -> set[str]:
        """The billing system's ids of the fee invoices we posted: dunned like any invoice, never charged a fee."""
        return {str(k) for (k,) in self.con.execute(
            "SELECT DISTINCT external_id FROM charges WHERE external_id IS NOT NULL").fetchall()}  # fmt: skip

    def charge_waits(self) -> pl.DataFrame:
        return self.frame("SELECT charge_key, invoice_id, cycle, kind, reason, reference, reminder_key, since "
                          "FROM charge_waits ORDER BY charge_key")  # fmt: skip

    def claim_waited(self, charges: pl.DataFrame, dropped: list[str], run_id: str, at: dt.datetime) -> set[str]:
        """Claim the waiting charges whose rate is now known (CHARGE_COLUMNS less run_id, claimed_at) and forget the
        waits in `dropped` (their invoice was paid or its cycle ended); one transaction. Returns the keys claimed."""
        done = sorted(set(charges.get_column("charge_key").to_list()) | set(dropped)) if charges.height else dropped
        with self.transaction() as con:
            inserted: set[str] = set()
            if charges.height:
                rows = charges.with_columns(pl.lit(run_id).alias("run_id"), pl.lit(at).alias("claimed_at")).select(
                    CHARGE_COLUMNS
                )
                with self.registered("waited_charges", rows):
                    inserted = {
                        k for (k,) in self.insert_by_name("charges", "waited_charges", on_conflict_do_nothing=True,
                                                          returning="charge_key", order_by="charge_key")
                    }  # fmt: skip
            keys = pl.DataFrame({"charge_key": done}, schema={"charge_key": pl.String})
            with self.registered("waits_done", keys):
                con.execute("DELETE FROM charge_waits WHERE charge_key IN (SELECT charge_key FROM waits_done)")
        return inserted

    def decide_charges(
        self, *, approve: bool, invoice_id: str | None, by: str, at: dt.datetime, note: str | None = None
    ) -> list[str]:
        """`dunning fees approve` (proposed -> approved) or `waive` (proposed, approved or failed -> waived), for one
        invoice or (approve only) all. Returns the charge keys decided. A failed charge whose item is on a fee
        invoice already (Stripe holds it: it is credited there) is not waived."""
        to, frm = ("approved", ("proposed",)) if approve else ("waived", ("proposed", "approved", "failed"))
        marks = ", ".join("?" for _ in frm)
        where = f"status IN ({marks})" + (" AND invoice_id = ?" if invoice_id is not None else "")
        if not approve:
            where += " AND NOT (status = 'failed' AND external_item_id IS NOT NULL)"
        params: list[object] = [to, at, by, note, at, *frm] + ([invoice_id] if invoice_id is not None else [])
        return [
            str(k)
            for (k,) in self.con.execute(
                f"UPDATE charges SET status = ?, decided_at = ?, decided_by = ?, note = coalesce(?, note), "
                f"updated_at = ? WHERE {where} RETURNING charge_key",
                params,
            ).fetchall()
        ]

    def charges_to_post(self, as_of: dt.datetime, max_attempts: int) -> pl.DataFrame:
        """Approved charges, failed ones whose backoff is over, and unknown ones (to settle by lookup)."""
        return self.frame(
            f"SELECT {LISTED}, external_item_id, next_attempt_at, updated_at FROM charges "
            "WHERE status IN ('approved', 'unknown') OR (status = 'failed' AND attempts < ? "
            "AND (next_attempt_at IS NULL OR next_attempt_at <= ?)) "
            "ORDER BY invoice_id, cycle, charge_key",
            [max_attempts, as_of],
        )

    def claim_post(self, keys: list[str], run_id: str, at: dt.datetime) -> set[str]:
        """Ledger first: approved or failed charges become `unknown` before the billing system is called; returns
        the keys this run took (another run's are left to it)."""
        frame = pl.DataFrame({"charge_key": keys}, schema={"charge_key": pl.String})
        with self.registered("posting_keys", frame):
            return {
                str(k)
                for (k,) in self.con.execute(
                    "UPDATE charges SET status = 'unknown', updated_at = ?, attempts = attempts + 1 "
                    "WHERE status IN ('approved', 'failed') AND charge_key IN (SELECT charge_key FROM posting_keys) "
                    "RETURNING charge_key",
                    [at],
                ).fetchall()
            }

    def note_external(self, keys: list[str], external_id: str, item_ids: dict[str, str], at: dt.datetime) -> None:
        """The fee invoice (and items) the billing system made for these `unknown` charges, kept as soon as known."""
        for key in keys:
            self.con.execute(
                "UPDATE charges SET external_id = ?, external_item_id = coalesce(?, external_item_id), updated_at = ? "
                "WHERE charge_key = ? AND status = 'unknown'",
                [external_id, item_ids.get(key), at, key],
            )

    def record_post(
        self, keys: list[str], status: str, *, at: dt.datetime, error: str | None = None,
        retry_at: dt.datetime | None = None,
    ) -> int:  # fmt: skip
        """The outcome of a post for `unknown` charges: `posted`, `failed` (retried from `retry_at`) or `unknown`."""
        frame = pl.DataFrame({"charge_key": keys}, schema={"charge_key": pl.String})
        with self.registered("posted_keys", frame):
            return self.changed_rows(
                "UPDATE charges SET status = ?, posted_at = CASE WHEN ? = 'posted' THEN ? ELSE posted_at END, "
                "last_error = ?, next_attempt_at = ?, updated_at = ? "
                "WHERE status = 'unknown' AND charge_key IN (SELECT charge_key FROM posted_keys)",
                [status, status, at, error, retry_at, at],
            )

"""The `exclusions` table: who held which customer or invoice out of dunning, why, since when, until when.

Rows are never deleted: `include` ends an exclusion by stamping `included_at`
and `included_by` and clearing `active_target`, the column whose UNIQUE
constraint keeps at most one exclusion in force per scope and target (a NULL
collides with nothing, on DuckDB and PostgreSQL alike). Excluding a target
that is already excluded updates that row (`updated_at`/`updated_by`) instead
of adding one, also when two operators race: the constraint decides.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

import polars as pl

from dunning.ledger.sql import SqlConnection
from dunning.vocabulary import ExclusionScope

OPEN_COLUMNS = "scope, target_id, reason, excluded_at, excluded_by, until_date, updated_at, updated_by"


@dataclass(frozen=True)
class Excluded:
    """What `exclude` did: a new exclusion, or the one in force updated."""

    exclusion_id: str
    new: bool


def _active(scope: ExclusionScope, target_id: str) -> str:
    return f"{scope}:{target_id}"


class ExclusionStore(SqlConnection):
    """Exclusions on the ledger's connection."""

    def exclude(
        self,
        scope: ExclusionScope,
        target_id: str,
        reason: str | None,
        until: dt.date | None,
        by: str,
        at: dt.datetime,
    ) -> Excluded:
        """Exclude `target_id` (a new row), or update the exclusion in force: its `until_date` becomes `until`, its
        reason `reason` when one is given (else the one on record stays)."""
        new_id = uuid.uuid4().hex
        rows = self.con.execute(
            """
            INSERT INTO exclusions (exclusion_id, scope, target_id, active_target, reason, excluded_at, excluded_by,
                                    until_date)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (active_target) DO UPDATE SET
                reason = coalesce(excluded.reason, exclusions.reason), until_date = excluded.until_date,
                updated_at = excluded.excluded_at, updated_by = excluded.excluded_by
            RETURNING exclusion_id
            """,
            [new_id, str(scope), target_id, _active(scope, target_id), reason, at, by, until],
        ).fetchall()
        exclusion_id = str(rows[0][0])
        return Excluded(exclusion_id, exclusion_id == new_id)

    def include(self, scope: ExclusionScope, target_id: str, by: str, at: dt.datetime) -> bool:
        """End the exclusion in force for `target_id`; False when there is none."""
        rows = self.con.execute(
            "UPDATE exclusions SET active_target = NULL, included_at = ?, included_by = ? WHERE active_target = ? "
            "RETURNING exclusion_id",
            [at, by, _active(scope, target_id)],
        ).fetchall()
        return bool(rows)

    def open_exclusions(self) -> pl.DataFrame:
        """Every exclusion not ended by `include` (whether or not its `until_date` has passed), oldest first."""
        return self.frame(
            f"SELECT {OPEN_COLUMNS} FROM exclusions WHERE active_target IS NOT NULL "
            "ORDER BY excluded_at, scope, target_id"
        )

    def ever_seen(self, scope: ExclusionScope, target_id: str) -> bool:
        """Whether any snapshot a run applied, or any key on record, has shown this customer or invoice."""
        column = "customer_id" if scope == ExclusionScope.CUSTOMER else "invoice_id"
        for table in ("reminder_ledger", "invoice_history_daily"):
            row = self.con.execute(f"SELECT 1 FROM {table} WHERE {column} = ? LIMIT 1", [target_id]).fetchall()
            if row:
                return True
        return False

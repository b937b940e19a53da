"""What each live run was given, and what the ledger held when it ended: what lets an unchanged hour be skipped
(`dunning.plan.unchanged`).

`state_digest` summarizes every table a cycle's decisions read, each as its
row count and an order-independent hash of its rows (a full scan: tens of
milliseconds at a million rows in DuckDB; PostgreSQL hashes its row versions'
transaction ids instead, see `PgConnection.table_digest_sql`). Tables a run
only writes for the record (audit, run summaries, quarantines, alerts,
simulations) are left out: every run adds to them, and nothing is decided from
them. The daily history is summarized by its write log (`history_writes`, one
row per merge that changed a day), which changes with every write to it and
stays small where the history grows by a day of rows every day.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from dataclasses import dataclass
from typing import Any

import polars as pl

from dunning.ledger.schema.tables import DDL
from dunning.ledger.sql import SqlConnection, quote_identifier
from dunning.sharding import EVERYONE, Shard
from dunning.vocabulary import RunOutcome

# written for the record by every run and never read to decide a send; run_inputs is this module's own
RECORD_TABLES = frozenset(
    {
        "alerts",
        "applied_snapshots",
        "customer_claim_locks",  # touched only by claims, which write reminder_ledger in the same transaction
        "dunning_audit",
        "dunning_runs",
        "event_quarantine",
        "incidents",
        "invoice_history_daily",  # its writes are hashed from `history_writes`, not its rows
        "run_inputs",
        "run_scopes",  # which invoices bound a sharded run's state: rewritten by each of them
        "simulated_sends",
        "snapshot_quarantine",
    }
)
# a sharded run's state: these tables' rows of the invoices its snapshot held (rows of no invoice, such as
# apologies, are every shard's), the history writes of runs that may have touched them (the shard's own, and any
# other shard count's, the unsharded runs' among them), and every other table whole
_IN_SCOPE = "invoice_id IN (SELECT invoice_id FROM run_scopes WHERE run_id = ?)"
_SCOPED = {
    "reminder_ledger": f"invoice_id IS NULL OR {_IN_SCOPE}",
    "invoice_cycles": _IN_SCOPE,
    "history_writes": "NOT (shard_count = ? AND shard_index <> ?)",
}


@dataclass(frozen=True)
class UnknownSettling:
    """Which `unknown` keys a run could settle with this provider: every one (a lookup that always answers, the
    file outbox), those with the provider's own id (a lookup by id), and those whose kept request it may still
    resubmit (`resubmits_for`: its name; kept since `remembered_since`, and not held by the present)."""

    every_unknown: bool = True
    by_provider_id: bool = False
    resubmits_for: str | None = None
    remembered_since: dt.datetime = dt.datetime.max.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class StateScope:
    """A sharded run's part of the ledger's state: the invoices its snapshot held (`run_scopes` under `run_id`)
    and its shard."""

    run_id: str
    shard: Shard

    def where(self, table: str) -> tuple[str, list[object]]:
        if table not in _SCOPED:
            return "TRUE", []
        params: list[object] = [self.shard.count, self.shard.index] if table == "history_writes" else [self.run_id]
        return _SCOPED[table], params


def state_tables() -> list[str]:
    """Every table of the schema a decision may read: a table added later is in it unless listed as a record."""
    names = (re.search(r"CREATE TABLE IF NOT EXISTS (\w+)", s) for s in DDL)
    return sorted(m.group(1) for m in names if m and m.group(1) not in RECORD_TABLES)


class RunInputStore(SqlConnection):
    def state_digest(self, scope: StateScope | None = None) -> str:
        """One hash of every decision-relevant table's rows (see the module docstring); with `scope`, a sharded
        run whose invoices were recorded (`end_run_inputs`), only the rows its shard's decisions read."""
        tables = state_tables()
        selects, params = [], []
        for position, table in enumerate(tables):  # one statement: a query each was 21 round trips, ~1 ms each
            where, table_params = scope.where(table) if scope is not None else ("TRUE", [])
            selects.append(f"SELECT {position} AS position, d.* FROM ({self.table_digest_sql(table, where)}) AS d")
            params.extend(table_params)
        rows = self.con.execute(" UNION ALL ".join(selects) + " ORDER BY position", params).fetchall()
        parts = [f"{tables[position]}:{count}:{digest}" for position, count, digest in rows]
        return hashlib.sha256("|".join(parts).encode()).hexdigest()

    def begin_run_inputs(
        self,
        run_id: str,
        *,
        shard: str,
        as_of: dt.datetime,
        business_date: dt.date,
        snapshot_path: str,
        snapshot_sha256: str,
        config_sha256: str,
        wall: dt.datetime,
    ) -> None:
        """A live run's inputs, at its start; `end_run_inputs` adds the ledger's state when it ends."""
        with self.transaction() as con:
            con.execute("DELETE FROM run_inputs WHERE run_id = ?", [run_id])  # a re-executed step starts again
            con.execute(
                "INSERT INTO run_inputs (run_id, shard, as_of, business_date, snapshot_path, snapshot_sha256, "
                "config_sha256, recorded_wall_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [run_id, shard, as_of, business_date, snapshot_path, snapshot_sha256, config_sha256, wall],
            )

    def end_run_inputs(
        self, run_id: str, settled: bool, scope: pl.Series | None = None, shard: Shard = EVERYONE
    ) -> None:
        """The ledger's state as the run leaves it, and whether the run left nothing for a later hour to redo.

        `scope`: a sharded run's invoice ids (and `shard` its shard). The state is then hashed over their rows,
        so the other shards' runs of the same hour, which write only their own customers' rows, leave this
        shard's state as it was; the scopes of the shard's earlier ended runs go (a skipped run's reference is
        the shard's last)."""
        with self.transaction() as con:
            if scope is not None:
                rows = (
                    scope.drop_nulls()
                    .unique()
                    .sort()
                    .to_frame("invoice_id")
                    .select(pl.lit(run_id).alias("run_id"), "invoice_id")
                )
                con.execute(
                    "DELETE FROM run_scopes WHERE run_id = ? OR run_id IN (SELECT e.run_id FROM run_inputs e "
                    "JOIN run_inputs r ON r.shard = e.shard WHERE r.run_id = ? AND e.ledger_state IS NOT NULL)",
                    [run_id, run_id],
                )
                with self.registered("scope_rows", rows):
                    self.insert_by_name("run_scopes", "scope_rows")
            state = self.state_digest(StateScope(run_id, shard) if scope is not None else None)
            sql = "UPDATE run_inputs SET ledger_state = ?, settled = ? WHERE run_id = ?"
            con.execute(sql, [state, settled, run_id])

    def last_ended_inputs(self, shard: str) -> dict[str, Any] | None:
        """The inputs of the shard's last live run that ended, with `since`: the clock of the last run that did the
        work (itself, or the run an unchanged run was skipped against), `since_wall`: when that run began (wall
        clock), and that run's snapshot row count."""
        rows = self.records(
            """
            SELECT i.*, coalesce(r.as_of, i.as_of) AS since,
                   coalesce(r.recorded_wall_at, i.recorded_wall_at) AS since_wall, d.snapshot_rows
            FROM run_inputs i
            LEFT JOIN run_inputs r ON r.run_id = i.reference_run_id
            LEFT JOIN dunning_runs d ON d.run_id = coalesce(i.reference_run_id, i.run_id)
            WHERE i.shard = ? AND i.ledger_state IS NOT NULL
            ORDER BY i.recorded_wall_at DESC LIMIT 1
            """,
            [shard],
        )
        return rows[0] if rows else None

    def unchanged_run(self, run_id: str) -> dict[str, Any] | None:
        """For a run skipped as unchanged: its inputs, the run it matched (`reference_run_id`) and that run's clock
        (`reference_as_of`); None for any other run."""
        rows = self.records(
            "SELECT i.*, r.as_of AS reference_as_of FROM run_inputs i "
            "LEFT JOIN run_inputs r ON r.run_id = i.reference_run_id "
            "WHERE i.run_id = ? AND i.reference_run_id IS NOT NULL",
            [run_id],
        )
        return rows[0] if rows else None

    def open_work(
        self,
        since: dt.datetime,
        until: dt.datetime,
        max_attempts: int,
        *,
        reference_began: dt.datetime | None = None,
        settles: UnknownSettling | None = None,
    ) -> dict[str, int]:
        """What time alone can turn into work: claims still open (a crashed run's, to expire), `unknown` outcomes a
        run may settle (`settles`: all of them when not given), and failed keys whose retry is due by `until` and
        that the reference run's plan did not see due: their backoff ended after its clock (`since`), or they
        became `failed` while it ran or after (`reference_began`, wall clock: a lookup or a dead run's release in
        its send step, after its plan was made)."""
        settles = settles or UnknownSettling()
        row = self.con.execute(
            """
            SELECT count(*) FILTER (WHERE l.status = 'claimed'),
                   count(*) FILTER (WHERE l.status = 'unknown' AND (
                       ? OR (? AND l.provider_message_id IS NOT NULL)
                       OR (p.provider = ? AND p.held_reason IS NULL AND p.first_attempt_wall_at > ?)
                       OR (p.provider = 'escalation' AND p.held_reason IS NULL))),
                   count(*) FILTER (WHERE l.status = 'failed' AND l.attempts < ?
                       AND coalesce(l.next_attempt_at, l.claimed_at) <= ?
                       AND (l.next_attempt_at > ? OR l.outcome_wall_at >= ?))
            FROM reminder_ledger l LEFT JOIN provider_payloads p ON p.email_id = l.email_id
            WHERE l.status IN ('claimed', 'unknown', 'failed')
            """,
            [
                settles.every_unknown,
                settles.by_provider_id,
                settles.resubmits_for or "",
                settles.remembered_since,
                max_attempts,
                until,
                since,
                reference_began or until,
            ],
        ).fetchall()[0]
        return {"claimed": int(row[0] or 0), "unknown": int(row[1] or 0), "retries_due": int(row[2] or 0)}

    def record_unchanged_run(
        self,
        run_id: str,
        reference: dict[str, Any],
        *,
        as_of: dt.datetime,
        snapshot_path: str,
        ledger_state: str,
        wall: dt.datetime,
    ) -> None:
        """A skipped run: its inputs (the reference's, which they matched) and its run summary, outcome `unchanged`,
        nothing counted: every key stands as the reference run left it."""
        with self.transaction() as con:
            con.execute("DELETE FROM run_inputs WHERE run_id = ?", [run_id])
            con.execute(
                "INSERT INTO run_inputs (run_id, shard, as_of, business_date, snapshot_path, snapshot_sha256, "
                "config_sha256, ledger_state, settled, reference_run_id, recorded_wall_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, TRUE, ?, ?)",
                [
                    run_id, reference["shard"], as_of, reference["business_date"], snapshot_path,
                    reference["snapshot_sha256"], reference["config_sha256"], ledger_state,
                    reference["reference_run_id"] or reference["run_id"], wall,
                ],
            )  # fmt: skip
            summary = {
                "run_id": run_id,
                "as_of": as_of,
                "dry_run": False,
                "finished_wall_at": wall,
                "snapshot_path": snapshot_path,
                "snapshot_rows": reference.get("snapshot_rows"),
                "rejected_rows": 0,
                "due": 0,
                "sent": 0,
                "failed": 0,
                "unknown": 0,
                "held": 0,
                "skipped": 0,
                "emails": 0,
                "not_owed_reminded": 0,
                "outcome": str(RunOutcome.UNCHANGED),
                "rows_read": 0,  # it hashed the file and read no row of it
            }
            # one row, as parameters: a frame registered with DuckDB goes through Arrow (0.15 s of an idle hour)
            columns = ", ".join(quote_identifier(name) for name in summary)
            con.execute("DELETE FROM dunning_runs WHERE run_id = ?", [run_id])
            con.execute(
                f"INSERT INTO dunning_runs ({columns}) VALUES ({', '.join('?' for _ in summary)})",
                list(summary.values()),
            )

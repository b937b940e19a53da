"""Operational state kept beside the ledger: the pause flag, alerts, incidents, per-run audit and summary."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from dunning.ledger.sql import SqlConnection
from dunning.secret_env import scrub
from dunning.vocabulary import DATA_PROBLEMS, RunOutcome, SetAside

PER_RUN_TABLES = ("dunning_audit", "dunning_runs")


@dataclass(frozen=True)
class RunSummary:
    COUNT_NAMES = (
        "snapshot_rows",
        "rejected_rows",
        "due",
        "sent",
        "failed",
        "unknown",
        "held",
        "skipped",
        "emails",
        "not_owed_reminded",
    )
    counts: dict[str, int]
    rejected_by_rule: list[tuple[str, int]]
    held_by_reason: list[tuple[str, int]]  # this run's holds and the keys still held from earlier cycles
    would_send: int  # reminder keys a dry run would have sent
    provider_stopped: str | None  # the health stop's alert message, when the provider was stopped
    # keys sent (or, on a dry run, that would be) by kind, when some are not reminders: notices, invoice emails
    other_kinds: tuple[tuple[str, int], ...] = ()
    # `unknown` keys of earlier runs this run settled: (how, status) -> keys; how is `lookup` or `resubmission`
    settled: tuple[tuple[str, str, int], ...] = ()
    # hand-overs to a collections system (not emails): what this run did with them, by ledger status (`sent`: handed
    # over, also a resubmission or a retake of an earlier run's; `failed`, `unknown`), and its audit's escalation rows
    # by outcome (counted in `counts` with every key)
    escalations: tuple[tuple[str, int], ...] = ()
    escalations_audited: tuple[tuple[str, int], ...] = ()
    escalations_refused: int = 0  # refused for good in this run: one alert each
    # billing events this run stored or found that yield nothing, by kind (`SetAside`), in `event_quarantine`
    set_aside: tuple[tuple[str, int], ...] = ()
    # the invoices this run held for a data problem (no address, an invalid one, suppressed): invoice, customer, reason
    held_for_data: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class StatusCounts:
    by_status: dict[str, int]
    open_alerts: list[dict[str, Any]]  # the 20 newest unresolved: created_at, kind, message
    unknown_keys: list[str]  # the first 50 held for a human


@dataclass(frozen=True)
class PauseState:
    paused: bool
    reason: str | None = None
    changed_by: str | None = None
    changed_at: dt.datetime | None = None


class Operations(SqlConnection):
    """The pause flag, alerts, incidents, billing events and per-run rows, on the ledger's connection."""

    def pause_state(self) -> PauseState:
        row = next(
            iter(
                self.con.execute(
                    "SELECT paused, reason, changed_by, changed_at FROM pause_state WHERE id = 1"
                ).fetchall()
            ),
            None,
        )
        return PauseState(*row) if row else PauseState(False)

    def set_pause(self, paused: bool, reason: str | None, changed_by: str, at: dt.datetime) -> None:
        self.con.execute(
            "INSERT INTO pause_state VALUES (1, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET paused = excluded.paused, "
            "reason = excluded.reason, changed_by = excluded.changed_by, changed_at = excluded.changed_at",
            [paused, reason, changed_by, at],
        )

    def add_alert(
        self,
        kind: str,
        message: str,
        at: dt.datetime,
        run_id: str | None = None,
        details: dict[str, Any] | None = None,
        severity: str = "critical",
        alert_id: str | None = None,
    ) -> str:
        """Store one alert (its text and details masked of every secret this process holds); returns its id,
        `alert_id` when given (an alert whose id its subject's row names first, `escalation_store`)."""
        alert_id = alert_id or uuid.uuid4().hex
        stored = scrub(json.dumps(details, default=str)) if details else None  # masked, whatever produced the text
        self.con.execute(
            "INSERT INTO alerts (alert_id, created_at, kind, severity, message, run_id, details) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [alert_id, at, kind, severity, scrub(message), run_id, stored],
        )
        return alert_id

    def mark_alert_delivered(self, alert_id: str, delivered_to: str) -> None:
        self.con.execute("UPDATE alerts SET delivered_to = ? WHERE alert_id = ?", [delivered_to, alert_id])

    def alerts_for_run(self, run_id: str) -> pl.DataFrame:
        return self.frame("SELECT * FROM alerts WHERE run_id = ? ORDER BY created_at", [run_id])

    def record_incident(
        self,
        incident_id: str,
        at: dt.datetime,
        since: dt.datetime | None,
        source: str,
        flooded: int,
        apologies_sent: int,
    ) -> None:
        self.con.execute(
            "INSERT INTO incidents VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (incident_id) DO UPDATE SET "
            "last_recovery_at = excluded.last_recovery_at, flooded_customers = excluded.flooded_customers, "
            "apologies_sent = incidents.apologies_sent + excluded.apologies_sent",
            [incident_id, at, since, source, flooded, apologies_sent],
        )

    def store_events(self, events: pl.DataFrame, run_id: str, received_at: dt.datetime) -> int:
        """Keep each event once (first delivery wins); returns how many were new."""
        rows = events.with_columns(pl.lit(run_id).alias("first_run_id"), pl.lit(received_at).alias("received_at"))
        with self.registered("event_rows", rows):
            return len(
                self.insert_by_name(
                    "billing_events",
                    "event_rows",
                    on_conflict_do_nothing=True,
                    returning="event_id",
                    order_by="event_id",
                )
            )

    def quarantine_events(self, frame: pl.DataFrame, run_id: str, received_at: dt.datetime) -> int:
        """Keep the billing events validation rejected (`event_id`, `type`, `reason`, `payload`), once per run that
        received them."""
        rows = frame.select("event_id", "type", "reason", "payload").with_columns(
            pl.lit(run_id).alias("run_id"), pl.lit(received_at).alias("received_at")
        )
        with self.registered("rejected_events", rows):
            self.insert_by_name("event_quarantine", "rejected_events")
        return rows.height

    def recorded_keys(self, keys: list[str]) -> set[str]:
        with self.registered("asked_keys", pl.DataFrame({"k": keys}, schema={"k": pl.String})):
            return {
                k
                for (k,) in self.con.execute(
                    "SELECT idempotency_key FROM reminder_ledger WHERE idempotency_key IN (SELECT k FROM asked_keys)"
                ).fetchall()
            }

    def write_audit(
        self,
        run_id: str,
        audit: pl.DataFrame,
        counts: Mapping[str, int],
        as_of: dt.datetime,
        dry_run: bool,
        snapshot_rows: int,
        snapshot_path: str | None = None,
        run_outcome: RunOutcome = RunOutcome.COMPLETED,
        rejected_rows: int | None = None,
        rows_read: int | None = None,
    ) -> None:
        """The audit rows and the run's summary; `counts` as `audit.summarize` gives them. `rejected_rows`: what
        validation rejected (a dry run quarantines nothing); None counts the run's quarantine."""
        summary = pl.DataFrame(
            [
                {
                    "run_id": run_id,
                    "as_of": as_of,
                    "dry_run": dry_run,
                    "finished_wall_at": dt.datetime.now(dt.UTC),
                    "snapshot_path": snapshot_path,
                    "snapshot_rows": snapshot_rows,
                    "rejected_rows": rejected_rows
                    if rejected_rows is not None
                    else self.scalar("SELECT count(*) FROM snapshot_quarantine WHERE run_id = ?", [run_id]),
                    "due": counts["due"],
                    "sent": counts["sent"],
                    "failed": counts["failed"],
                    "unknown": counts["unknown"],
                    "held": counts["held"],
                    "skipped": self.scalar(
                        "SELECT count(*) FROM reminder_ledger WHERE run_id = ? AND status = 'skipped'", [run_id]
                    ),
                    "emails": self.scalar(  # an escalation is a hand-over, not an email
                        "SELECT count(DISTINCT email_id) FROM reminder_ledger WHERE run_id = ? AND status = 'sent' "
                        "AND kind <> 'escalation'",
                        [run_id],
                    ),
                    "not_owed_reminded": counts["not_owed_reminded"],
                    "outcome": str(run_outcome),
                    "rows_read": rows_read,
                }
            ]
        )
        self.replace_run_rows("dunning_audit", run_id, audit)
        self.replace_run_rows("dunning_runs", run_id, summary)

    def replace_run_rows(self, table: str, run_id: str, rows: pl.DataFrame) -> None:
        """Replace one run's rows in `table`, in one transaction, so a retry never doubles them."""
        if table not in PER_RUN_TABLES:
            raise ValueError(f"not a per-run table: {table}")
        with self.transaction() as con, self.registered("run_rows", rows):
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
            self.insert_by_name(table, "run_rows")

    def last_run(self) -> dict[str, Any] | None:
        rows = self.frame(
            "SELECT * FROM dunning_runs WHERE NOT dry_run ORDER BY finished_wall_at DESC LIMIT 1"
        ).to_dicts()
        return rows[0] if rows else None

    # The dead man's switch (dunning/send/liveness.py) reads these. Backfills are stored under run ids
    # "backfill:<day>:<policy>" with dry_run set; they are never live runs.

    def last_live_run(self, completed_only: bool = False) -> dict[str, Any] | None:
        """The last live (not dry, not backfill) run; with `completed_only`, the last one that was not halted."""
        # a run skipped as unchanged completed too: it checked everything and found nothing to do
        done = " AND coalesce(outcome, 'completed') IN ('completed', 'unchanged')" if completed_only else ""
        rows = self.frame(
            "SELECT run_id, as_of, finished_wall_at, outcome, due, sent, failed, unknown, held, rows_read "
            "FROM dunning_runs "
            f"WHERE NOT dry_run AND run_id NOT LIKE 'backfill:%'{done} ORDER BY finished_wall_at DESC LIMIT 1"
        ).to_dicts()
        return rows[0] if rows else None

    def last_dry_run(self) -> dict[str, Any] | None:
        rows = self.frame(
            "SELECT run_id, as_of, finished_wall_at, due, held FROM dunning_runs "
            "WHERE dry_run AND run_id NOT LIKE 'backfill:%' ORDER BY finished_wall_at DESC LIMIT 1"
        ).to_dicts()
        return rows[0] if rows else None

    def last_backfill(self) -> dict[str, Any] | None:
        rows = self.frame(
            "SELECT run_id, as_of, finished_wall_at FROM dunning_runs "
            "WHERE run_id LIKE 'backfill:%' ORDER BY finished_wall_at DESC LIMIT 1"
        ).to_dicts()
        return rows[0] if rows else None

    def unknown_waiting_since(self, before: dt.datetime) -> tuple[int, dt.datetime | None, str | None]:
        """`unknown` keys whose outcome was recorded (or, lacking that, claimed) before `before`: count, oldest time,
        oldest key."""
        row = self.con.execute(
            """
            WITH waiting AS (
                SELECT idempotency_key, coalesce(outcome_wall_at, claimed_at) AS since FROM reminder_ledger
                WHERE status = 'unknown' AND coalesce(outcome_wall_at, claimed_at) < ?
            )
            SELECT (SELECT count(*) FROM waiting), (SELECT min(since) FROM waiting),
                   (SELECT idempotency_key FROM waiting ORDER BY since, idempotency_key LIMIT 1)
            """,
            [before],
        ).fetchall()[0]
        return int(row[0]), row[1], row[2]

    def open_alert(self, kind: str) -> dict[str, Any] | None:
        """The oldest unresolved alert of `kind`, if any."""
        rows = self.frame(
            "SELECT alert_id, created_at, kind, message FROM alerts WHERE kind = ? AND resolved_at IS NULL "
            "ORDER BY created_at LIMIT 1",
            [kind],
        ).to_dicts()
        return rows[0] if rows else None

    def open_alert_messages(self, kind: str) -> list[str]:
        """The messages of every unresolved alert of `kind`, oldest first."""
        rows = self.con.execute(
            "SELECT message FROM alerts WHERE kind = ? AND resolved_at IS NULL ORDER BY created_at", [kind]
        ).fetchall()
        return [str(m) for (m,) in rows]

    def resolve_alerts(self, kind: str, at: dt.datetime) -> int:
        """Mark every unresolved alert of `kind` resolved at `at`; returns how many."""
        return len(
            self.con.execute(
                "UPDATE alerts SET resolved_at = ? WHERE kind = ? AND resolved_at IS NULL RETURNING alert_id",
                [at, kind],
            ).fetchall()
        )

    def is_paused(self) -> bool:
        """The pause flag alone; reads every row, so the connection has no unfinished result for a later `frame`."""
        rows = self.con.execute("SELECT paused FROM pause_state WHERE id = 1").fetchall()
        return bool(rows and rows[0][0])

    def run_summary(self, run_id: str) -> RunSummary | None:
        """What one run did, as the CLI reports it: counts, rejections by rule, holds by reason, a health stop."""
        rows = self.con.execute(
            "SELECT snapshot_rows, rejected_rows, due, sent, failed, unknown, held, skipped, emails, not_owed_reminded "
            "FROM dunning_runs WHERE run_id = ?",
            [run_id],
        ).fetchall()
        if not rows:
            return None
        counts = dict(zip(RunSummary.COUNT_NAMES, (int(v or 0) for v in rows[0]), strict=True))
        rules = self.con.execute(
            "SELECT rule, count(*) FROM snapshot_quarantine WHERE run_id = ? GROUP BY rule ORDER BY 2 DESC, 1", [run_id]
        ).fetchall()
        held = self.held_by_reason(run_id)
        would = self.con.execute(
            "SELECT count(*) FROM dunning_audit WHERE run_id = ? AND outcome = 'dry_run' AND kind = 'reminder'",
            [run_id],
        ).fetchall()[0][0]
        stopped = self.con.execute(
            "SELECT message FROM alerts WHERE run_id = ? AND kind = 'provider_unhealthy'", [run_id]
        ).fetchall()
        kinds = self.con.execute(
            "SELECT kind, count(*) FROM dunning_audit WHERE run_id = ? AND outcome IN ('sent', 'dry_run') "
            "AND kind <> 'reminder' GROUP BY kind ORDER BY kind",
            [run_id],
        ).fetchall()
        settled = self.con.execute(
            "SELECT CASE WHEN last_error LIKE 'resubmitted%' THEN 'resubmission' ELSE 'lookup' END, status, count(*) "
            "FROM reminder_ledger WHERE settled_run_id = ? GROUP BY 1, 2 ORDER BY 1, 2",
            [run_id],
        ).fetchall()
        escalations = self.con.execute(
            "SELECT status, count(*) FROM reminder_ledger WHERE kind = 'escalation' AND "
            "((status = 'sent' AND (run_id = ? OR settled_run_id = ?)) OR (status IN ('failed', 'unknown') "
            "AND run_id = ?)) GROUP BY status ORDER BY status",
            [run_id, run_id, run_id],
        ).fetchall()
        audited = self.con.execute(
            "SELECT outcome, count(*) FROM dunning_audit WHERE run_id = ? AND kind = 'escalation' "
            "GROUP BY outcome ORDER BY outcome",
            [run_id],
        ).fetchall()
        refused = self.scalar("SELECT count(*) FROM alerts WHERE run_id = ? AND kind = 'escalation_refused'", [run_id])
        return RunSummary(
            counts,
            [(r, int(n)) for r, n in rules],
            [(r, int(n)) for r, n in held],
            int(would),
            stopped[0][0] if stopped else None,
            tuple((str(k), int(n)) for k, n in kinds),
            tuple((str(how), str(status), int(n)) for how, status, n in settled),
            tuple((str(k), int(n)) for k, n in escalations),
            tuple((str(k), int(n)) for k, n in audited),
            int(refused or 0),  # type: ignore[call-overload]
            self._set_aside_by_kind(run_id),
            tuple(self.held_for_data(run_id, DATA_PROBLEMS)),
        )

    def held_by_reason(self, run_id: str) -> list[tuple[str, int]]:
        """One run's held keys per reason, a key counted under each reason it has (`reason` and `also_held`)."""
        totals: dict[str, int] = {}
        for reason, also, n in self.con.execute(
            "SELECT reason, also_held, count(*) FROM dunning_audit WHERE run_id = ? AND outcome = 'held' "
            "GROUP BY reason, also_held",
            [run_id],
        ).fetchall():
            for each in dict.fromkeys([reason, *(also.split(",") if also else [])]):
                totals[str(each)] = totals.get(str(each), 0) + int(n)
        return sorted(totals.items())

    def held_for_data(self, run_id: str, reasons: tuple[str, ...]) -> list[dict[str, Any]]:
        """One run's invoices held for a data problem (`reasons`, as the audit's `reason` or among `also_held`):
        invoice, customer and the first such reason, by invoice id."""
        placeholders = ", ".join("?" for _ in reasons)
        rows = self.con.execute(
            "SELECT invoice_id, customer_id, reason, also_held FROM dunning_audit "
            "WHERE run_id = ? AND outcome = 'held' "
            f"AND invoice_id IS NOT NULL AND (reason IN ({placeholders}) OR also_held IS NOT NULL) ORDER BY invoice_id",
            [run_id, *reasons],
        ).fetchall()
        found: dict[str, dict[str, Any]] = {}
        for invoice_id, customer_id, reason, also in rows:
            mine = [r for r in [reason, *(also.split(",") if also else [])] if r in reasons]
            if mine and invoice_id not in found:
                found[invoice_id] = {"invoice_id": invoice_id, "customer_id": customer_id, "reason": mine[0]}
        return list(found.values())

    def _set_aside_by_kind(self, run_id: str) -> tuple[tuple[str, int], ...]:
        counts = []
        for kind in SetAside:
            n = self.scalar(
                "SELECT count(*) FROM event_quarantine WHERE run_id = ? AND reason LIKE ?", [run_id, f"{kind}:%"]
            )
            if int(str(n)):
                counts.append((str(kind), int(str(n))))
        return tuple(counts)

    def status_counts(self) -> StatusCounts:
        """What `dunning status` shows of the ledger: keys by status, open alerts, unknown keys held for a human."""
        counts = {str(s): int(n) for s, n in self.con.execute(
            "SELECT status, count(*) FROM reminder_ledger GROUP BY status").fetchall()}  # fmt: skip
        alerts = [
            {"created_at": created_at, "kind": kind, "message": message}
            for created_at, kind, message in self.con.execute(
                "SELECT created_at, kind, message FROM alerts WHERE resolved_at IS NULL "
                "ORDER BY created_at DESC LIMIT 20"
            ).fetchall()
        ]
        unknown = [str(k) for (k,) in self.con.execute(
            "SELECT idempotency_key FROM reminder_ledger WHERE status = 'unknown' ORDER BY idempotency_key LIMIT 50"
        ).fetchall()]  # fmt: skip
        return StatusCounts(counts, alerts, unknown)

"""The ledger interface the pipeline depends on; DuckDB (`duckdb_ledger`) and PostgreSQL (`pg_ledger`) implement it.

Assets, the CLI and the send loop call only these methods, on whichever ledger
`factory.open_ledger_for` opened for the deployment's config.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import polars as pl

from dunning.ledger.sql import Executes
from dunning.ledger.stores.claims import ClaimCap, ClaimResult
from dunning.ledger.stores.exclusions import Excluded
from dunning.ledger.stores.operations import PauseState, RunSummary, StatusCounts
from dunning.ledger.stores.run_inputs import StateScope, UnknownSettling
from dunning.ledger.stores.suppressions import Condemned, Suppressed
from dunning.sharding import EVERYONE, Shard
from dunning.vocabulary import EmailKind, ExclusionScope, LedgerStatus, RunOutcome


class AlertStore(Protocol):
    """Where alerts are kept, and what became of their delivery (`dunning.send.alerts`)."""

    def add_alert(
        self,
        kind: str,
        message: str,
        at: dt.datetime,
        run_id: str | None = None,
        details: dict[str, Any] | None = None,
        severity: str = "critical",
        alert_id: str | None = None,
    ) -> str: ...

    def mark_alert_delivered(self, alert_id: str, delivered_to: str) -> None: ...

    def open_alert(self, kind: str) -> dict[str, Any] | None: ...

    def resolve_alerts(self, kind: str, at: dt.datetime) -> int: ...


class Ledger(AlertStore, Protocol):
    label: str  # what names it in a message (`sql.SqlConnection.label`)
    database_errors: tuple[type[BaseException], ...]

    # the connection: transactions that nest, a rolled-back simulation, a query as a polars frame
    def transaction(self) -> contextlib.AbstractContextManager[Executes]: ...

    def simulation(self) -> contextlib.AbstractContextManager[None]: ...

    def frame(self, sql: str, params: Sequence[object] | None = None) -> pl.DataFrame: ...

    def scalar(self, sql: str, params: Sequence[object] | None = None) -> object: ...

    def database_path(self) -> str | None: ...

    def refuses_duplicate_key(self) -> bool: ...

    def publish(self, home: Path) -> dict[str, int]: ...

    def invoice_state(self) -> pl.DataFrame: ...

    def record_cycle_changes(
        self, as_of: dt.datetime, cycled: pl.DataFrame, snapshot_taken_at: dt.datetime | None = None
    ) -> None: ...

    def latest_applied_snapshot(self) -> dict[str, Any] | None: ...

    def applied_snapshot_path(self, run_id: str) -> str | None: ...

    def record_applied_snapshot(
        self,
        run_id: str,
        taken_at: dt.datetime,
        as_of: dt.datetime,
        path: str | None,
        stale_allowed: bool,
        wall: dt.datetime,
        invoices: int | None = None,
    ) -> None: ...

    def quarantine(self, run_id: str, source: str, rejected: pl.DataFrame, at: dt.datetime) -> None: ...

    def claim_owners(self, run_id: str) -> list[str]: ...

    def expire_stale_claims(
        self,
        run_id: str,
        now: dt.datetime,
        dead_runs: Sequence[str] = (),
        handed_over: Callable[[str], set[str] | None] | None = None,
    ) -> int: ...

    def renew_leases(self, run_id: str, lease_until: dt.datetime) -> int: ...

    def claim(
        self,
        due: pl.DataFrame,
        skipped: pl.DataFrame,
        run_id: str,
        claimed_at: dt.datetime,
        cap: ClaimCap | None = None,
        lease_until: dt.datetime | None = None,
        bodies: pl.DataFrame | None = None,
    ) -> ClaimResult: ...

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
    ) -> int: ...

    def unknown_sends(self, include_claimed: bool = False) -> pl.DataFrame: ...

    def keep_payloads(self, payloads: pl.DataFrame) -> None: ...

    def drop_payloads(self, email_ids: list[str]) -> None: ...

    def hold_unknown(self, held: pl.DataFrame) -> int: ...

    def open_problems(self) -> pl.DataFrame: ...

    def emails_in_window(
        self, since: dt.datetime, until: dt.datetime, only_customers: pl.DataFrame | None = None
    ) -> pl.DataFrame: ...

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
    ) -> None: ...

    def retryable_failures(self, as_of: dt.datetime, max_attempts: int, kind: EmailKind = ...) -> pl.DataFrame: ...

    def state_as_of(self, as_of: dt.datetime, stages: pl.DataFrame) -> pl.DataFrame: ...

    def merge_history_day(self, business_date: dt.date, rows: pl.DataFrame, shard: Shard = ...) -> None: ...

    def replace_partition(
        self,
        table: str,
        business_date: dt.date,
        rows: pl.DataFrame,
        policy_id: str | None = None,
        shard: Shard = ...,
    ) -> None: ...

    def store_events(self, events: pl.DataFrame, run_id: str, received_at: dt.datetime) -> int: ...

    def recorded_keys(self, keys: list[str]) -> set[str]: ...

    # invoice emails (`ledger.invoice_email_store`)
    def invoice_keys_on_record(self, keys: pl.DataFrame) -> pl.DataFrame: ...

    def feature_enabled_on(self, feature: str) -> dt.date | None: ...

    def set_feature(
        self, feature: str, enabled: bool, business_date: dt.date, at: dt.datetime, run_id: str
    ) -> None: ...

    def seen_on_or_before(self, invoice_ids: pl.DataFrame, day: dt.date) -> pl.DataFrame: ...

    def record_skipped(self, rows: pl.DataFrame, run_id: str, at: dt.datetime) -> int: ...

    def invoices_on_record(self, invoice_ids: pl.Series) -> set[str]: ...

    def record_adopted(self, rows: pl.DataFrame, opened: pl.DataFrame, at: dt.datetime) -> int: ...

    def pending_notice_events(self, since: dt.datetime) -> pl.DataFrame: ...

    def recovery_by_stage(self) -> pl.DataFrame: ...

    def signal_events(self, types: Sequence[str], since: dt.datetime, until: dt.datetime) -> pl.DataFrame: ...

    # events that yield nothing, and what retention lets go (`ledger.stores.retention_store`)
    def set_aside_events(self, frame: pl.DataFrame, run_id: str, at: dt.datetime) -> int: ...

    def expired_notice_events(self, before: dt.datetime) -> pl.DataFrame: ...

    def set_aside_counts(self, run_id: str | None = None) -> dict[str, int]: ...

    def delivery_events_before(self, before: dt.datetime) -> int: ...

    def delete_delivery_events(self, before: dt.datetime) -> int: ...

    # the collections schedule (`ledger.stores.schedule_store`)
    def last_reminders(self, since: dt.datetime, until: dt.datetime, customers: pl.DataFrame) -> pl.DataFrame: ...

    def reminders_sent(self, invoices: pl.DataFrame) -> pl.DataFrame: ...

    def reminders_of(self, invoices: pl.DataFrame) -> pl.DataFrame: ...

    # delivery feedback (`ledger.stores.suppressions`)
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
    ) -> Suppressed: ...

    def suppress_many(self, rows: pl.DataFrame, at: dt.datetime) -> Condemned: ...

    def unsuppress(self, email: str, by: str, at: dt.datetime) -> bool: ...

    def suppressed_emails(self, on: dt.date) -> pl.DataFrame: ...

    def open_suppressions(self, on: dt.date) -> pl.DataFrame: ...

    def contacts_to_fix(self, on: dt.date) -> pl.DataFrame: ...

    def new_suppression_alerts(self, held: pl.DataFrame, at: dt.datetime) -> pl.DataFrame: ...

    def record_delivery_events(self, events: pl.DataFrame) -> set[str]: ...

    def emails_by_id(self, ids: list[str], column: str) -> pl.DataFrame: ...

    def ever_emailed(self, emails: list[str]) -> set[str]: ...

    def reports_to_confirm(self, since: dt.datetime, on: dt.date) -> pl.DataFrame: ...

    # the Message-ID secret (`ledger.stores.message_secret`)
    def message_secret(self, create_at: dt.datetime | None = None) -> str | None: ...

    # where polling a billing source stands (`ledger.cursors`)
    def source_cursor(self, source: str) -> str | None: ...

    def stage_cursor(self, source: str, cursor: str, run_id: str, at: dt.datetime) -> None: ...

    def commit_cursor(self, run_id: str, at: dt.datetime) -> list[str]: ...

    def pause_state(self) -> PauseState: ...

    def set_pause(self, paused: bool, reason: str | None, changed_by: str, at: dt.datetime) -> None: ...

    def is_paused(self) -> bool: ...

    def quarantine_events(self, frame: pl.DataFrame, run_id: str, received_at: dt.datetime) -> int: ...

    def resolve_by_hand(self, keys: list[str], sent: bool, note: str, wall: dt.datetime) -> list[str]: ...

    # escalations a human answers, and failed keys put back in line (`ledger.stores.escalation_store`)
    def key_states(self, keys: list[str]) -> pl.DataFrame: ...

    def released_escalations(self, keys: list[str]) -> pl.DataFrame: ...

    def retake_released(
        self, keys: list[str], run_id: str, claimed_at: dt.datetime, lease_until: dt.datetime
    ) -> set[str]: ...

    def mark_refused_escalations(self, max_attempts: int, at: dt.datetime) -> int: ...

    def refusals_to_page(self) -> pl.DataFrame: ...

    def take_refusal_alert(self, key: str, alert_id: str) -> bool: ...

    def refused_escalations(self) -> pl.DataFrame: ...

    def escalation_states(self, keys: list[str]) -> pl.DataFrame: ...

    def put_back_failed(self, keys: list[str], kinds: tuple[str, ...], note: str, wall: dt.datetime) -> list[str]: ...

    def resolve_refused(self, keys: list[str], sent: bool, note: str, wall: dt.datetime) -> list[str]: ...

    def drop_escalation_bodies(self, keys: list[str]) -> None: ...

    def record_incident(
        self,
        incident_id: str,
        at: dt.datetime,
        since: dt.datetime | None,
        source: str,
        flooded: int,
        apologies_sent: int,
    ) -> None: ...

    def alerts_for_run(self, run_id: str) -> pl.DataFrame: ...

    # exclusions (`dunning exclude` / `include`; `dunning.plan.exclusions` decides what they hold)
    def exclude(
        self,
        scope: ExclusionScope,
        target_id: str,
        reason: str | None,
        until: dt.date | None,
        by: str,
        at: dt.datetime,
    ) -> Excluded: ...

    def include(self, scope: ExclusionScope, target_id: str, by: str, at: dt.datetime) -> bool: ...

    def ever_seen(self, scope: ExclusionScope, target_id: str) -> bool: ...

    def open_exclusions(self) -> pl.DataFrame: ...

    # what `dunning status` and the run report read
    def last_run(self) -> dict[str, Any] | None: ...

    def last_dry_run(self) -> dict[str, Any] | None: ...

    def last_backfill(self) -> dict[str, Any] | None: ...

    def run_summary(self, run_id: str) -> RunSummary | None: ...

    def status_counts(self) -> StatusCounts: ...

    # an unchanged hour (`dunning.plan.unchanged`, `run_inputs`)
    def state_digest(self, scope: StateScope | None = None) -> str: ...

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
    ) -> None: ...

    def end_run_inputs(
        self, run_id: str, settled: bool, scope: pl.Series | None = None, shard: Shard = EVERYONE
    ) -> None: ...

    def last_ended_inputs(self, shard: str) -> dict[str, Any] | None: ...

    def open_work(
        self,
        since: dt.datetime,
        until: dt.datetime,
        max_attempts: int,
        *,
        reference_began: dt.datetime | None = None,
        settles: UnknownSettling | None = None,
    ) -> dict[str, int]: ...

    def unchanged_run(self, run_id: str) -> dict[str, Any] | None: ...

    def record_unchanged_run(
        self,
        run_id: str,
        reference: dict[str, Any],
        *,
        as_of: dt.datetime,
        snapshot_path: str,
        ledger_state: str,
        wall: dt.datetime,
    ) -> None: ...

    # the dead man's switch (`dunning.send.liveness`)
    def last_live_run(self, completed_only: bool = False) -> dict[str, Any] | None: ...

    def unknown_waiting_since(self, before: dt.datetime) -> tuple[int, dt.datetime | None, str | None]: ...

    # the collections desk (`dunning.desk`, `ledger.stores.desk`): promises to pay
    def latest_invoices(self, *, customer_id: str | None = None, invoice_id: str | None = None) -> pl.DataFrame: ...

    def add_promise(self, promise: dict[str, Any], covered: Sequence[tuple[str, int | None, int]]) -> bool: ...

    def promise_ids_on_record(self, ids: Sequence[str]) -> set[str]: ...

    def promise(self, promise_id: str) -> dict[str, Any] | None: ...

    def cancel_promise(self, promise_id: str, by: str, at: dt.datetime) -> bool: ...

    def promises_listed(self, broken_since: dt.datetime) -> pl.DataFrame: ...

    def promise_coverage(self, statuses: Sequence[str] = ("active",)) -> pl.DataFrame: ...

    def resolve_promise(self, promise_id: str, status: str, at: dt.datetime) -> bool: ...

    def note_promise_alert(self, promise_id: str, alert_id: str) -> None: ...

    def customer_promises(self, customer_id: str) -> pl.DataFrame: ...

    def broken_promises_unanswered(self) -> pl.DataFrame: ...

    def broken_promise_counts(self) -> pl.DataFrame: ...

    # customers' replies, acknowledgements, IMAP cursors
    def record_replies(self, rows: Sequence[dict[str, Any]]) -> set[str]: ...

    def note_reply_alert(self, reply_key: str, alert_id: str, *, unanswered: bool = False) -> None: ...

    def unanswered_replies(self, at: dt.datetime) -> pl.DataFrame: ...

    def acknowledge(self, customer_id: str, at: dt.datetime, by: str, note: str | None) -> int: ...

    def customer_replies_of(self, customer_id: str) -> pl.DataFrame: ...

    def customer_acks_of(self, customer_id: str) -> pl.DataFrame: ...

    def customers_by_address(self, addresses: Sequence[str]) -> pl.DataFrame: ...

    def imap_cursor(self, mailbox: str) -> tuple[int, int] | None: ...

    def set_imap_cursor(self, mailbox: str, uidvalidity: int, last_uid: int, at: dt.datetime) -> None: ...

"""One dunning cycle as plain functions, so Dagster assets, the resume guard and tests share them.

Each step takes what the previous one returned; none of them knows about
Dagster. The ledger is passed in, so a caller can run a whole cycle inside a
transaction and roll it back (the guard's simulated pass).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from dunning.config import DunningConfig
from dunning.email.locales import with_customer_locales
from dunning.email.pay_links import with_payment_urls
from dunning.fees.planning import fees_configured
from dunning.ingest.snapshot import read_snapshot
from dunning.ingest.snapshot_rules import summarize_rejections
from dunning.ingest.sources.normalize import templated_pay_links
from dunning.ledger.base import Ledger
from dunning.ledger.stores.claims import ClaimCap
from dunning.plan.breaker import BreakerVerdict, breaker_window, evaluate_breaker
from dunning.plan.exclusions import WAITING_HOLDS, hold_expr
from dunning.plan.policy import assign_cycles, due_and_skipped, plan_reminders, plan_retries
from dunning.report.audit import build_audit, summarize
from dunning.report.fee_audit import fee_audit_rows
from dunning.send.alerts import Alert, raise_alert
from dunning.send.sending import held_outcomes, with_email_groups, with_group_copies
from dunning.vocabulary import EmailKind, PlanRole, RunOutcome, SendStatus, plain


@dataclass(frozen=True)
class ValidatedSnapshot:
    valid: pl.DataFrame
    rejected: pl.DataFrame

    @property
    def summary(self) -> str:
        return summarize_rejections(self.rejected)


def load_snapshot(path: str | Path, config: DunningConfig) -> ValidatedSnapshot:
    """Read and validate; raises SnapshotError only when the file itself is unusable."""
    from dunning.ingest.snapshot_model import validate_snapshot  # pandera, imported by a run that validates only

    valid, rejected = validate_snapshot(read_snapshot(path, config.zone))
    # pay links only when https (else dropped and flagged for the audit), locales only when Babel knows them
    valid = templated_pay_links(valid, config.source.payment_url_template)  # for the invoices without their own
    valid = with_customer_locales(with_payment_urls(valid))
    valid = valid.drop("amount_due_raw", "amount_paid_raw", "due_date_raw", strict=False)
    # one contiguous chunk per number, date and flag column: every later step on a many-chunked frame paid for a
    # rechunk again. Text columns stay as read: copying them whole was a second gigabyte at 10M invoices, held at
    # once with the first, for steps that only filter and gather them
    numbers = [c for c, dtype in valid.schema.items() if dtype != pl.String]
    return ValidatedSnapshot(valid.with_columns(valid.select(numbers).rechunk()), rejected)


def snapshot_taken_at(valid: pl.DataFrame, as_of: dt.datetime) -> dt.datetime:
    """When the snapshot was taken: its newest `snapshot_at`, else the cycle's clock."""
    taken = valid.get_column("snapshot_at").max() if valid.height else None
    return taken if isinstance(taken, dt.datetime) else as_of


def cycle_snapshot(ledger: Ledger, valid: pl.DataFrame, config: DunningConfig, as_of: dt.datetime) -> pl.DataFrame:
    """The valid snapshot with each invoice's cycle, days overdue and whether it is owed and sendable."""
    return assign_cycles(valid, ledger.invoice_state(), as_of, config, snapshot_taken_at(valid, as_of))


def _aligned(part: pl.DataFrame, schema: pl.Schema) -> pl.DataFrame:
    return part.select([pl.col(c) if c in part.columns else pl.lit(None).alias(c) for c in schema]).cast(schema)


def plan_cycle(
    cycled: pl.DataFrame,
    config: DunningConfig,
    failed: pl.DataFrame | None = None,
    notices: pl.DataFrame | None = None,
    exclusions: pl.DataFrame | None = None,
    invoices: pl.DataFrame | None = None,
    settle: pl.DataFrame | None = None,
    escalations: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Every key this cycle must record: `role` due, retry (a failed send whose backoff is over) or skipped; and
    the `unknown` keys of earlier runs to settle (`settle`, `dunning.send.resubmission.settle_rows`: its own `hold`).

    `notices` are payment-failed notices from billing events (kind `payment_failed`), sent and gated like reminders;
    `escalations` the hand-overs due or retried (`dunning.plan.escalation`), held by exclusions like the others.
    `hold` says why a due or retry key is kept from the send before anything is claimed (`dunning.plan.exclusions`:
    `exclusions` in force, auto_advance, the minimum balance); null for the others.
    """
    planned_due, planned_skipped = due_and_skipped(plan_reminders(cycled, config))
    # Message-IDs are computed per chunk when keys are claimed (`send_due`); retries and notices bring theirs
    due = with_email_groups(planned_due, config).with_columns(
        pl.lit(None, dtype=pl.String).alias("email_id"),
        pl.lit(None, dtype=pl.String).alias("message_id"),
        pl.lit(None, dtype=pl.String).alias("hold"),  # a part may bring its own (a notice's untrusted address)
    )
    parts = [due]
    if failed is not None and failed.height:
        parts.append(with_group_copies(plan_retries(cycled, failed, due, config)))  # one email, every key's copies
    if notices is not None and notices.height:
        parts.append(notices)
    if invoices is not None and invoices.height:  # invoice emails (`dunning.plan.invoice_emails`): due, retry, skipped
        parts.append(invoices)
    if escalations is not None and escalations.height:
        parts.append(escalations)
    parts.append(planned_skipped)
    plan = pl.concat([_aligned(p, due.schema) for p in parts], how="vertical")
    sent_role = pl.col("role").is_in(SEND_ROLES)
    plan = plan.with_columns(
        pl.when(sent_role)
        .then(pl.coalesce("hold", hold_expr(cycled, exclusions, config)))
        .otherwise(None)
        .alias("hold")
    )
    if settle is None or settle.is_empty():
        return plan
    # a key on record as claimed or unknown is settled, never planned again: another run may have claimed it between
    # this plan's reads of the cycles and of the unknown keys (its claim advances both in one transaction)
    plan = plan.join(settle.select("idempotency_key"), on="idempotency_key", how="anti", maintain_order="left")
    return pl.concat([plan, _aligned(settle, plan.schema)], how="vertical")


SEND_ROLES = tuple(plain([PlanRole.DUE, PlanRole.RETRY]))


def due_rows(plan: pl.DataFrame) -> pl.DataFrame:
    return plan.filter(pl.col("role").is_in(SEND_ROLES))


# plan frame id -> (a weak reference to it, its sendable rows): a run's plan is handed from step to step as the
# same frame (`pipelines.io_manager`), and four steps ask for its sendable rows (the plan's metadata, the
# breaker, the send, the audit of a breaker trip): a filter over every plan row, a million on a new deployment
_SENDABLE: dict[int, tuple[weakref.ref[pl.DataFrame], pl.DataFrame]] = {}
_SENDABLE_LOCK = threading.Lock()
_SENDABLE_KEPT = 4


def sendable_due(plan: pl.DataFrame) -> pl.DataFrame:
    """Due and retry emails with an address and no hold (`plan_cycle`): what the breaker counts and a send claims.
    Escalations are not emails (`escalations_due`). Computed once per plan frame (frames between steps are never
    changed in place: each step makes new ones)."""
    with _SENDABLE_LOCK:
        kept = _SENDABLE.get(id(plan))
    if kept is not None and kept[0]() is plan and kept[1].width == plan.width:
        return kept[1]
    held = pl.col("hold").is_not_null() if "hold" in plan.columns else pl.lit(False)
    sendable = plan.filter(
        pl.col("role").is_in(SEND_ROLES) & pl.col("sendable") & ~held & (pl.col("kind") != EmailKind.ESCALATION)
    )
    with _SENDABLE_LOCK:
        _SENDABLE[id(plan)] = (weakref.ref(plan), sendable)
        for stale in [k for k, (ref, _) in _SENDABLE.items() if ref() is None] + list(_SENDABLE)[:-_SENDABLE_KEPT]:
            _SENDABLE.pop(stale, None)
    return sendable


def escalations_due(plan: pl.DataFrame) -> pl.DataFrame:
    """Due and retry escalations with no hold: the hand-overs this run claims and posts (`dunning.send.escalation`)."""
    held = pl.col("hold").is_not_null() if "hold" in plan.columns else pl.lit(False)
    return plan.filter(pl.col("role").is_in(SEND_ROLES) & ~held & (pl.col("kind") == EmailKind.ESCALATION))


def waiting_by_reason(plan: pl.DataFrame) -> dict[str, int]:
    """Due keys that wait for the schedule (`dunning.plan.exclusions.WAITING_HOLDS`), by reason: still newly due."""
    if "hold" not in plan.columns:
        return {}
    waiting = due_rows(plan).filter(pl.col("hold").is_in(plain(WAITING_HOLDS)))
    return {str(k): int(n) for k, n in waiting.group_by("hold").len().sort("hold").iter_rows()}


def to_attempt(plan: pl.DataFrame) -> pl.DataFrame:
    """Everything a live run would hand over now: the sendable emails and the escalations."""
    return pl.concat([sendable_due(plan), escalations_due(plan)], how="diagonal_relaxed")


def skipped_rows(plan: pl.DataFrame) -> pl.DataFrame:
    return plan.filter(pl.col("role") == PlanRole.SKIPPED)


def settle_rows_of(plan: pl.DataFrame) -> pl.DataFrame:
    """The plan's `unknown` keys of earlier runs to settle, with why the present forbids resubmitting them."""
    return plan.filter(pl.col("role") == PlanRole.SETTLE).select("idempotency_key", "hold")


def recent_emails(ledger: Ledger, as_of: dt.datetime, config: DunningConfig) -> pl.DataFrame:
    """Emails per customer already on record in the breaker's window around `as_of`."""
    return ledger.emails_in_window(*breaker_window(as_of, config.breaker))


def check_breaker(ledger: Ledger, plan: pl.DataFrame, as_of: dt.datetime, config: DunningConfig) -> BreakerVerdict:
    """The batch this cycle would send, plus the window's sends, against the per-customer cap."""
    return evaluate_breaker(sendable_due(plan), recent_emails(ledger, as_of, config), config.breaker)


def claim_cap(as_of: dt.datetime, config: DunningConfig) -> ClaimCap:
    return ClaimCap(config.breaker.max_emails, *breaker_window(as_of, config.breaker))


def audit_cycle(
    ledger: Ledger,
    snapshot: pl.DataFrame,
    plan: pl.DataFrame,
    outcomes: pl.DataFrame,
    *,
    run_id: str,
    as_of: dt.datetime,
    dry_run: bool,
    snapshot_path: str | None,
    run_outcome: RunOutcome = RunOutcome.COMPLETED,
    rejected_rows: int | None = None,
    rows_read: int | None = None,
    config: DunningConfig | None = None,
) -> pl.DataFrame:
    """Build and store this cycle's audit and run summary; returns the audit rows (with `config`, the fees' rows
    are stored beside them: `dunning.report.fee_audit`). `rejected_rows`: what validation
    rejected, when known (a dry run's count; None: the run's quarantine is counted)."""
    audit = build_audit(
        due_rows(plan), outcomes, ledger.open_problems(), snapshot, run_id=run_id, as_of=as_of, dry_run=dry_run
    )
    stored = audit
    if (
        config is not None and fees_configured(config) and not dry_run
    ):  # each charge claimed, each that waits for its rate: kind `fee`
        fee_rows = fee_audit_rows(ledger, run_id, as_of, dry_run)
        if fee_rows.height:
            stored = pl.concat([audit, fee_rows.select([c for c in fee_rows.columns if c in audit.columns])],
                               how="diagonal_relaxed")  # fmt: skip
    ledger.write_audit(
        run_id,
        stored,
        summarize(audit),
        as_of,
        dry_run,
        snapshot.height,
        snapshot_path,
        run_outcome,
        rejected_rows,
        rows_read,
    )
    return audit


def record_breaker_trip(
    ledger: Ledger,
    verdict: BreakerVerdict,
    snapshot: pl.DataFrame,
    plan: pl.DataFrame,
    config: DunningConfig,
    *,
    run_id: str,
    as_of: dt.datetime,
    dry_run: bool,
    snapshot_path: str | None,
    logger: logging.Logger | None = None,
    rows_read: int | None = None,
) -> str | None:
    """One alert for the trip (none on a dry run) and the held reminders in the audit; returns the alert id."""
    audit_cycle(
        ledger,
        snapshot,
        plan,
        held_outcomes(sendable_due(plan), SendStatus.BREAKER),
        run_id=run_id,
        as_of=as_of,
        dry_run=dry_run,
        snapshot_path=snapshot_path,
        run_outcome=RunOutcome.HALTED_BY_BREAKER,
        rows_read=rows_read,
    )
    if dry_run:
        return None
    offenders = verdict.offenders.select("customer_id", "emails_in_window", "recent_emails", "batch_emails").to_dicts()
    alert = Alert(
        kind="breaker",
        message=verdict.describe(),
        created_at=as_of,
        run_id=run_id,
        details={
            "max_emails": config.breaker.max_emails,
            "window_hours": config.breaker.window_hours,
            "customers": offenders,
        },
        dedup_key="dunning-breaker-" + ",".join(sorted(o["customer_id"] for o in offenders))[:200],
    )
    return raise_alert(ledger, config.alerts, alert, logger)

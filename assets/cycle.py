"""The dunning cycle's assets: snapshot -> reminders due -> send batch -> audit.

Thin adapters over `dunning.cycle`: each reads its resources, calls the pure
step, writes what the step says to write, and reports metadata for the UI.
Only `send_batch` sends, and only for the current run's reminders.
"""


import dagster as dg
import polars as pl

from dunning import audit as audit_rules
from dunning import cycle
from dunning.clock import utc_now
from dunning.errors import DunningError, InvalidRowsHalt, SnapshotError
from dunning.events import EVENTS_SCHEMA, PAYMENT_FAILED, event_keys, events_frame, notice_rows
from dunning.sending import held_outcomes, resolve_unknown, send_due
from pipelines.resources import CycleRequest, DunningHome

GROUP = "dunning"
LEDGER_POOL = "dunning_ledger"


def _fail(error: DunningError) -> dg.Failure:
    return dg.Failure(description=str(error), metadata={"error_class": type(error).__name__}, allow_retries=False)


@dg.asset(group_name=GROUP, kinds={"polars", "duckdb"}, io_manager_key="frames", pool=LEDGER_POOL)
def invoice_snapshot(context: dg.AssetExecutionContext, dunning_home: DunningHome, cycle_request: CycleRequest) -> dg.Output[pl.DataFrame]:
    """One row per accepted invoice of this cycle's snapshot, with its dunning cycle and days overdue.

    Rejected rows go to `snapshot_quarantine` with the rule they broke; the
    accepted rows are appended to `invoice_snapshots` (not on a dry run).
    """
    try:
        config = dunning_home.settings()
        if not cycle_request.snapshot_path:
            raise SnapshotError("no snapshot given (set cycle_request.snapshot_path, or pass --snapshot)")
        as_of = cycle_request.clock(context)
        loaded = cycle.load_snapshot(cycle_request.snapshot_path, config)
        with dunning_home.ledger() as ledger:
            if loaded.rejected.height and not cycle_request.dry_run:
                ledger.quarantine(context.run_id, cycle_request.snapshot_path, loaded.rejected, utc_now())
            if loaded.rejected.height and config.on_invalid_rows == "halt":
                raise InvalidRowsHalt(f"snapshot rejected (on_invalid_rows: halt): {loaded.summary}")
            cycled = cycle.cycle_snapshot(ledger, loaded.valid, config, as_of)
            if not cycle_request.dry_run:
                ledger.record_snapshot(context.run_id, as_of, cycled)
    except DunningError as error:
        raise _fail(error) from None
    if loaded.rejected.height:
        context.log.warning(loaded.summary)
    return dg.Output(
        cycled,
        metadata={
            "dagster/row_count": cycled.height,
            "rejected_rows": loaded.rejected.height,
            "rejections": loaded.summary,
            "owed_invoices": int(cycled.get_column("owed").sum()),
            "as_of": as_of.isoformat(),
        },
    )


@dg.asset(group_name=GROUP, kinds={"stripe", "duckdb"}, io_manager_key="frames", pool=LEDGER_POOL)
def billing_events(context: dg.AssetExecutionContext, dunning_home: DunningHome, cycle_request: CycleRequest) -> dg.Output[pl.DataFrame]:
    """One row per distinct billing event (Stripe) delivered to this run, stored once in `billing_events`."""
    if not cycle_request.events_path:
        return dg.Output(pl.DataFrame(schema=EVENTS_SCHEMA), metadata={"events": 0})
    try:
        events = events_frame(cycle_request.events_path)
        new = 0
        if not cycle_request.dry_run:
            with dunning_home.ledger() as ledger:
                new = ledger.store_events(events, context.run_id, utc_now())
    except DunningError as error:
        raise _fail(error) from None
    by_type = dict(events.group_by("type").len().iter_rows())
    ignored = sum(n for t, n in by_type.items() if t != PAYMENT_FAILED)
    if ignored:
        context.log.info(f"{ignored} event(s) of other types counted and ignored: {by_type}")
    return dg.Output(events, metadata={"events": events.height, "new_events": new, "ignored_events": ignored,
                                       "by_type": dg.MetadataValue.json(by_type)})


@dg.asset(group_name=GROUP, kinds={"polars"}, io_manager_key="frames", pool=LEDGER_POOL)
def reminders_due(context: dg.AssetExecutionContext, invoice_snapshot: pl.DataFrame, billing_events: pl.DataFrame,
                  dunning_home: DunningHome, cycle_request: CycleRequest) -> dg.Output[pl.DataFrame]:
    """One row per key this cycle: newly due (`due`), a failed send to retry (`retry`), or passed over (`skipped`).

    Reminders come from the snapshot; payment-failed notices (kind `payment_failed`) from new billing events.
    """
    config = dunning_home.settings()
    with dunning_home.ledger() as ledger:
        failed = ledger.retryable_failures(cycle_request.clock(context), config.retry.max_attempts)
        recorded = ledger.recorded_keys(event_keys(billing_events))
    domain = config.provider.from_address.rpartition("@")[2] or "dunning.invalid"
    notices = notice_rows(billing_events, invoice_snapshot, recorded, domain)
    plan = cycle.plan_cycle(invoice_snapshot, config, failed, notices)
    due = cycle.due_rows(plan)
    by_stage = dict(due.group_by("stage").len().iter_rows()) if due.height else {}
    return dg.Output(
        plan,
        metadata={
            "dagster/row_count": plan.height,
            "due": due.height,
            "due_unsendable": int((~due.get_column("sendable")).sum()) if due.height else 0,
            "retries": int((due.get_column("role") == "retry").sum()),
            "payment_failed_notices": int((due.get_column("kind") == "payment_failed").sum()),
            "skipped": plan.height - due.height,
            "emails": int(due.filter(pl.col("sendable")).get_column("email_group").n_unique()) if due.height else 0,
            "due_by_stage": dg.MetadataValue.json(by_stage),
        },
    )


@dg.asset(group_name=GROUP, kinds={"email", "duckdb"}, io_manager_key="frames", pool=LEDGER_POOL)
def send_batch(context: dg.AssetExecutionContext, reminders_due: pl.DataFrame, dunning_home: DunningHome,
               cycle_request: CycleRequest) -> dg.Output[pl.DataFrame]:
    """One row per sendable reminder key of this cycle with its outcome: sent, failed, unknown, or why it was held.

    Ledger first: keys are claimed under the primary key, and the customer cap
    re-checked, before the provider is called. Nothing is claimed on a dry run
    or while the pipeline is paused.
    """
    config = dunning_home.settings()
    as_of = cycle_request.clock(context)
    due = cycle.sendable_due(reminders_due)
    if cycle_request.dry_run:
        context.log.info(f"dry run: {due.height} reminder(s) would be claimed and sent; nothing claimed")
        return dg.Output(held_outcomes(due, "dry_run"), metadata={"dry_run": True, "would_send": due.height})

    def progress(report, total_emails: int) -> None:
        context.log.info(f"sent {report.emails}/{total_emails} emails ({report.sent} keys sent, {report.failed} failed, {report.unknown} unknown)")

    try:
        with dunning_home.ledger() as ledger:
            pause = ledger.pause_state()
            if pause.paused:
                context.log.warning(f"paused ({pause.reason}): {due.height} reminder(s) held, nothing sent")
                return dg.Output(held_outcomes(due, "paused"), metadata={"paused": True, "pause_reason": pause.reason or "", "held": due.height})
            with dunning_home.provider(config) as provider:
                stale = ledger.expire_stale_claims(context.run_id, utc_now())
                resolved = resolve_unknown(ledger, provider, utc_now())
                report, outcomes = send_due(
                    ledger, provider, due, cycle.skipped_rows(reminders_due), config=config, run_id=context.run_id,
                    as_of=as_of, now=utc_now, cap=cycle.claim_cap(as_of, config), progress=progress,
                )
    except DunningError as error:
        raise _fail(error) from None
    if report.failed or report.unknown:
        context.log.warning(f"{report.failed} key(s) failed and {report.unknown} ended unknown; see the audit")
    return dg.Output(
        outcomes,
        metadata={
            "dagster/row_count": outcomes.height,
            "emails": report.emails, "sent": report.sent, "failed": report.failed, "unknown": report.unknown,
            "throttled": report.throttled, "claimed_elsewhere": report.lost,
            "stale_claims_marked_unknown": stale, "unknown_resolved_by_lookup": resolved,
        },
    )


@dg.asset(group_name=GROUP, kinds={"polars", "duckdb"}, io_manager_key="frames", pool=LEDGER_POOL)
def dunning_audit(context: dg.AssetExecutionContext, invoice_snapshot: pl.DataFrame, reminders_due: pl.DataFrame,
                  send_batch: pl.DataFrame, dunning_home: DunningHome, cycle_request: CycleRequest) -> dg.Output[pl.DataFrame]:
    """One row per reminder key this cycle considered: outcome, reason if not sent, amount stated vs owed."""
    as_of = cycle_request.clock(context)
    with dunning_home.ledger() as ledger:
        audit = cycle.audit_cycle(
            ledger, invoice_snapshot, reminders_due, send_batch, run_id=context.run_id, as_of=as_of,
            dry_run=cycle_request.dry_run, snapshot_path=cycle_request.snapshot_path,
        )
    counts = audit_rules.summarize(audit)
    held = audit_rules.held_by_reason(audit)
    summary = audit_rules.markdown_summary(counts, held, dry_run=cycle_request.dry_run)
    return dg.Output(
        audit,
        metadata={"dagster/row_count": audit.height, "summary": dg.MetadataValue.md(summary),
                  **counts, "held_by_reason": dg.MetadataValue.json(held)},
    )

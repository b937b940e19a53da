"""The only place emails leave from: the current cycle's send batch, ledger first."""

import datetime as dt

import dagster as dg
import polars as pl

from assets.common import ASSET_DEFAULTS, LEDGER_POOL, as_operator_failure, frame_metadata
from dunning.plan.clock import RunMode, utc_now
from dunning.run import cycle, steps
from dunning.send.alerts import Alert, raise_alert
from dunning.send.handover import JOURNAL_DIR
from dunning.send.progress import report_send_progress
from dunning.send.render_pool import pool_size
from dunning.send.sending import held_outcomes
from dunning.vocabulary import SendStatus
from resources.dunning import CycleRequest, DunningHome

PROVIDER_UNHEALTHY = "provider_unhealthy"
LIVE_RUN_STATUSES = (
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
)


def local_cycle_runs(instance: dg.DagsterInstance, within: dt.timedelta = dt.timedelta(hours=6)) -> int:
    """The cycle runs in progress on this home (this one included), which share its machine's cores for rendering:
    the shards the schedule starts together. A run still marked started after `within` is taken as dead."""
    started = instance.get_run_records(
        dg.RunsFilter(
            job_name="dunning_cycle",
            statuses=[dg.DagsterRunStatus.STARTED],
            created_after=utc_now() - within,
        )
    )
    return max(1, len(started))


def dead_runs(instance: dg.DagsterInstance, run_ids: list[str]) -> list[str]:
    """The runs among `run_ids` that this instance knows have ended; a run it does not know (another
    worker's instance) is not known dead, and only its claims' lease can free them."""
    dead = []
    for run_id in run_ids:
        run = instance.get_run_by_id(run_id)
        if run is not None and run.status not in LIVE_RUN_STATUSES:
            dead.append(run_id)
    return dead


SIMULATED_COLUMNS = (
    "idempotency_key",
    "kind",
    "invoice_id",
    "customer_id",
    "customer_email",
    "cycle",
    "stage",
    "amount_minor",
    "currency",
    "email_id",
)


@dg.asset(**ASSET_DEFAULTS, kinds={"email", "duckdb"}, pool=LEDGER_POOL)
def send_batch(
    context: dg.AssetExecutionContext,
    reminders_due: pl.DataFrame,
    dunning_home: DunningHome,
    cycle_request: CycleRequest,
) -> dg.Output[pl.DataFrame]:
    """One row per sendable key of this cycle with its outcome: sent, failed, unknown, or why it was held.

    Keys are claimed under the primary key, and the customer cap re-checked,
    before the provider is called. Nothing is claimed on a dry run or while
    paused. A past day's partition (a backfill) never sends: what would have
    been sent goes to `simulated_sends`, replacing that day for that policy.
    """
    config = dunning_home.settings()
    clock = cycle_request.cycle_clock(context, config)
    due = cycle.sendable_due(reminders_due)
    if clock.mode is RunMode.DRY_RUN:
        attempted = cycle.to_attempt(reminders_due)
        context.log.info(f"dry run: {attempted.height} key(s) would be claimed and sent; nothing claimed")
        return dg.Output(
            held_outcomes(attempted, SendStatus.DRY_RUN), metadata={"dry_run": True, "would_send": attempted.height}
        )
    if clock.mode is RunMode.BACKFILL:
        simulated = due.select(
            pl.lit(clock.partition_date).alias("business_date"),
            pl.lit(config.policy_id).alias("policy_id"),
            pl.lit(context.run.run_id).alias("run_id"),
            pl.lit(clock.as_of).alias("as_of"),
            *SIMULATED_COLUMNS,
        )
        with dunning_home.ledger() as ledger:
            ledger.replace_partition(
                "simulated_sends",
                clock.partition_date,
                simulated,
                policy_id=config.policy_id,
                shard=cycle_request.shard_spec(),
            )
        context.log.info(
            f"backfill of {clock.partition_date}: {due.height} key(s) recorded in simulated_sends, nothing sent"
        )
        return dg.Output(
            held_outcomes(due, SendStatus.SIMULATED), metadata={"simulated": due.height, "policy_id": config.policy_id}
        )

    def progress(report, total_emails: int) -> None:
        context.log.info(
            f"sent {report.emails}/{total_emails} emails "
            f"({report.sent} keys sent, {report.failed} failed, {report.unknown} unknown)"
        )
        report_send_progress(report.emails, total_emails, report.sent, report.failed, report.unknown)

    try:
        with dunning_home.ledger() as ledger:
            step = steps.send_step(
                ledger,
                lambda: dunning_home.provider(config),
                reminders_due,
                config,
                clock,
                run_id=context.run.run_id,
                dead_runs=lambda owners: dead_runs(context.instance, list(owners)),
                now=utc_now,
                progress=progress,
                render_processes=pool_size(config.render_processes, local_cycle_runs(context.instance)),
                journal_dir=str(dunning_home.root / JOURNAL_DIR),
            )
    except Exception as error:  # noqa: BLE001 - recorded as an operator's line, masked (`as_operator_failure`)
        raise as_operator_failure(error) from None
    if step.report is None:
        context.log.warning(f"paused ({step.pause.reason}): {due.height} key(s) held, nothing sent")
        return dg.Output(
            step.outcomes, metadata={"paused": True, "pause_reason": step.pause.reason or "", "held": due.height}
        )
    report, outcomes, stale, resolved = step.report, step.outcomes, step.stale_claims_expired, step.unknown_settled
    if report.provider_stopped:
        with dunning_home.ledger() as ledger:
            alert_id = raise_alert(
                ledger,
                config.alerts,
                Alert(
                    kind=PROVIDER_UNHEALTHY,
                    message=f"{report.provider_stopped}; {report.released} claimed key(s) released as "
                    f"failed (never handed over), the next cycle retries them after the backoff",
                    created_at=clock.as_of,
                    run_id=context.run.run_id,
                    details={"provider": config.provider.kind, "released_keys": report.released},
                    dedup_key=f"dunning-provider-{config.provider.kind}",
                ),
                context.log,
            )
        context.log.error(f"provider stopped as unhealthy (alert {alert_id}): {report.provider_stopped}")
    if report.failed or report.unknown:
        context.log.warning(f"{report.failed} key(s) failed and {report.unknown} ended unknown; see the audit")
    return dg.Output(
        outcomes,
        metadata={
            **frame_metadata(outcomes),
            "emails": report.emails,
            "sent": report.sent,
            "failed": report.failed,
            "unknown": report.unknown,
            "throttled": report.throttled,
            "claimed_elsewhere": report.lost,
            "released": report.released,
            "provider_stopped": report.provider_stopped or "",
            "stale_claims_marked_unknown": stale,
            "first_emails": dg.MetadataValue.json([{"to": t, "subject": s} for t, s in step.first_emails]),
            "unknown_settled_by_lookup": resolved.by_lookup,
            "unknown_settled_by_resubmission": resolved.by_resubmission,
            "unknown_held_from_resubmission": dg.MetadataValue.json(resolved.held),
            "escalations_sent": step.escalations.sent,
            "escalations_failed": step.escalations.failed,
            "escalations_unknown": step.escalations.unknown,
            "escalations_resubmitted": step.escalations.resubmitted,
            "escalations_retried_after_a_crash": step.escalations.retried,
            "escalations_refused": step.escalations.refused,
        },
    )

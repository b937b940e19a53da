"""The audit: what was sent against what was owed, with a summary and a chart for the UI."""

from collections.abc import Iterator

import dagster as dg
import polars as pl

from assets.common import ASSET_DEFAULTS, LEDGER_POOL, frame_metadata
from checks.asset_checks import NO_UNOWED_REMINDERS_SPEC, SNAPSHOT_FOR_AUDIT, no_reminders_for_unowed_invoices
from dunning.plan import unchanged
from dunning.plan.clock import CycleClock
from dunning.report import audit as audit_rules
from dunning.run import cycle
from resources.dunning import CycleRequest, DunningHome, snapshot_count


def audit_run_id(context: dg.AssetExecutionContext, clock: CycleClock, policy_id: str) -> str:
    """Live and dry runs are audited under their run id; a backfill under its day and policy, so a re-run
    replaces it."""
    return context.run.run_id if clock.reads_live_state else f"backfill:{clock.partition_date}:{policy_id}"


def rejected_in_this_run(context: dg.AssetExecutionContext) -> int | None:
    return snapshot_count(context, "rejected_rows")


@dg.asset(
    **ASSET_DEFAULTS,
    kinds={"polars", "duckdb"},
    pool=LEDGER_POOL,
    ins={"invoice_snapshot": SNAPSHOT_FOR_AUDIT},
    check_specs=[NO_UNOWED_REMINDERS_SPEC],
)
def dunning_audit(
    context: dg.AssetExecutionContext,
    invoice_snapshot: pl.DataFrame,
    reminders_due: pl.DataFrame,
    send_batch: pl.DataFrame,
    dunning_home: DunningHome,
    cycle_request: CycleRequest,
) -> Iterator[dg.Output[pl.DataFrame] | dg.AssetCheckResult]:
    """One row per key this cycle considered: outcome, reason if not sent, amount stated vs owed; then its check
    (`no_reminders_for_unowed_invoices`)."""
    config = dunning_home.settings()
    clock = cycle_request.cycle_clock(context, config)
    run_id = audit_run_id(context, clock, config.policy_id)
    with dunning_home.ledger() as ledger:
        audit = cycle.audit_cycle(
            ledger,
            invoice_snapshot,
            reminders_due,
            send_batch,
            run_id=run_id,
            as_of=clock.as_of,
            dry_run=not clock.live,
            # the file applied, also when the run pulled it or took it from the landing folder (`resume` proves on it)
            snapshot_path=cycle_request.snapshot_path or ledger.applied_snapshot_path(context.run.run_id),
            rejected_rows=rejected_in_this_run(context),
            rows_read=snapshot_count(context, "rows_read"),
            config=config,
        )
        recovery = ledger.recovery_by_stage() if clock.live else None
        if clock.live:  # the state this run leaves, for a later hour to compare with (`dunning.plan.unchanged`)
            unchanged.finish(
                ledger, context.run.run_id, send_batch, cycle_request.shard_spec(), invoice_snapshot, reminders_due
            )
    counts = audit_rules.summarize(audit)
    held = audit_rules.held_by_reason(audit)
    by_stage = audit_rules.by_stage_and_outcome(audit)
    summary = (
        audit_rules.markdown_summary(counts, held, dry_run=not clock.live)
        + "\n\n"
        + audit_rules.markdown_chart(by_stage)
    )
    yield dg.Output(
        audit,
        metadata={
            **frame_metadata(audit),
            "summary": dg.MetadataValue.md(summary),
            **counts,
            "held_by_reason": dg.MetadataValue.json(held),
            **(
                {"recovery": dg.MetadataValue.md(audit_rules.recovery_markdown(recovery))}
                if recovery is not None
                else {}
            ),
        },
    )
    yield no_reminders_for_unowed_invoices(audit)

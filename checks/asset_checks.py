"""Asset checks: the gates in front of `send_batch`, and the audit's promises.

Both gates are blocking with ERROR severity: when one fails, `send_batch`
does not run and the run fails, so nothing leaves. The breaker gate also
records the trip (one alert, held reminders in the audit), because the steps
after it will not run to do so. The breaker is a step of its own (it reads the
ledger and records a trip); the soundness gate and the audit's check are
evaluated in their asset's own step (`REMINDERS_SOUND_SPEC`,
`NO_UNOWED_REMINDERS_SPEC`), each a step less per run.
"""

import dagster as dg
import polars as pl

from dunning.ingest.snapshot_rules import all_distinct
from dunning.plan.breaker import BREAKER_CHECK
from dunning.plan.clock import RunMode
from dunning.report import audit as audit_rules
from dunning.run import cycle
from resources.dunning import CycleRequest, DunningHome, snapshot_count

# what the audit and the breaker's trip record read of the snapshot (see RunScopedFramesIOManager)
SNAPSHOT_AUDIT_COLUMNS = ["invoice_id", "owed", "remaining_minor"]
SNAPSHOT_FOR_AUDIT = dg.AssetIn("invoice_snapshot", metadata={"columns": SNAPSHOT_AUDIT_COLUMNS})
REMINDERS_SOUND = "reminders_due_are_sound"
BREAKER = "circuit_breaker"
NO_UNOWED_REMINDERS = "no_reminders_for_unowed_invoices"
KEY_PATTERN = r"^(dunning:.+:[0-9]+:[A-Za-z0-9_-]+|event:.+|invoice:.+:.+|escalation:.+:[0-9]+)$"  # ids may hold ":"


def duplicated_rows(values: pl.Series) -> int:
    """Rows whose value another row has too (`is_duplicated().sum()`), counted only when there are any: proving
    every value distinct by its hash (`all_distinct`) is half the CPU of counting distinct values at 1.2M keys, a
    sixth of marking every duplicate."""
    if all_distinct(values):
        return 0
    return int(values.is_duplicated().sum())


def reminder_batch_problems(plan: pl.DataFrame) -> dict[str, int]:
    """Counts of rows breaking the batch's invariants; all must be zero."""
    due = plan.filter(pl.col("role").is_in(["due", "retry"]))
    return {
        "duplicate_keys": duplicated_rows(plan.get_column("idempotency_key")),
        "malformed_keys": int((~plan.get_column("idempotency_key").str.contains(KEY_PATTERN)).sum()),
        "not_owed": int((~due.get_column("owed")).sum()),
        "non_positive_amounts": int((due.get_column("amount_minor") <= 0).sum()),
        "invoices_with_two_due_stages": duplicated_rows(
            due.filter(pl.col("kind") == "reminder").get_column("invoice_id")
        ),
    }


# Checked inside the step that makes its asset (`check_specs`): a check that needs nothing but its asset's frame
# costs a Dagster step of its own (its events, its input loaded) for a few column sums.
REMINDERS_SOUND_SPEC = dg.AssetCheckSpec(
    REMINDERS_SOUND,
    asset="reminders_due",
    blocking=True,
    description=(
        "Every due reminder has a unique well-formed key, is for an owed invoice, "
        "and each invoice is due at most one stage."
    ),
)


def reminders_due_are_sound(reminders_due: pl.DataFrame) -> dg.AssetCheckResult:
    """The soundness gate's verdict on a plan (blocking, ERROR: a failure fails the step, so nothing is sent)."""
    problems = reminder_batch_problems(reminders_due)
    return dg.AssetCheckResult(
        check_name=REMINDERS_SOUND,
        passed=not any(problems.values()),
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={**problems, "rows": reminders_due.height},
    )


@dg.asset_check(
    asset="reminders_due",
    name=BREAKER,
    blocking=True,
    pool="dunning_ledger",
    additional_ins={"invoice_snapshot": SNAPSHOT_FOR_AUDIT},
    description=(
        "Circuit breaker: no customer may get more than breaker.max_emails emails in any breaker.window_hours "
        "window, counting this batch and the ledger's recent sends."
    ),
)
def circuit_breaker(
    context: dg.AssetCheckExecutionContext,
    reminders_due: pl.DataFrame,
    invoice_snapshot: pl.DataFrame,
    dunning_home: DunningHome,
    cycle_request: CycleRequest,
) -> dg.AssetCheckResult:
    config = dunning_home.settings()
    clock = cycle_request.cycle_clock(context, config)
    with dunning_home.ledger() as ledger:
        verdict = cycle.check_breaker(ledger, reminders_due, clock.as_of, config)
        paused = ledger.pause_state().paused
        backfill = clock.mode is RunMode.BACKFILL
        alert_id = None
        if not verdict.passed and not paused and not backfill:
            alert_id = cycle.record_breaker_trip(
                ledger,
                verdict,
                invoice_snapshot,
                reminders_due,
                config,
                run_id=context.run.run_id,
                as_of=clock.as_of,
                dry_run=clock.mode is RunMode.DRY_RUN,
                snapshot_path=cycle_request.snapshot_path,
                logger=context.log,
                rows_read=snapshot_count(context, "rows_read"),
            )
    offenders = verdict.offenders.head(50).select("customer_id", "emails_in_window").rows()
    return dg.AssetCheckResult(
        # paused or a backfill: nothing will be sent; the metadata still says who would have tripped it
        passed=verdict.passed or paused or backfill,
        severity=dg.AssetCheckSeverity.ERROR,
        description=verdict.describe(),
        metadata={
            "pandera_check": BREAKER_CHECK,
            "max_emails": config.breaker.max_emails,
            "window_hours": config.breaker.window_hours,
            "customers_over_cap": verdict.offenders.height,
            "offenders": dg.MetadataValue.json({c: n for c, n in offenders}),
            "paused": paused,
            "backfill": backfill,
            "alert_id": alert_id or "",
        },
    )


NO_UNOWED_REMINDERS_SPEC = dg.AssetCheckSpec(
    NO_UNOWED_REMINDERS,
    asset="dunning_audit",
    description=(
        "No reminder was sent for an invoice that was not owed, and every sent amount equals the remaining balance."
    ),
)


def no_reminders_for_unowed_invoices(dunning_audit: pl.DataFrame) -> dg.AssetCheckResult:
    """The audit's promise, checked in the audit's own step (not blocking: nothing runs after it that sends)."""
    unowed = audit_rules.not_owed_reminded(dunning_audit)
    mismatched = audit_rules.amount_mismatches(dunning_audit)
    return dg.AssetCheckResult(
        check_name=NO_UNOWED_REMINDERS,
        passed=unowed.is_empty() and mismatched.is_empty(),
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "reminders_for_unowed_invoices": unowed.height,
            "amount_mismatches": mismatched.height,
            "examples": dg.MetadataValue.json(unowed.head(10).select("idempotency_key").to_series().to_list()),
        },
    )

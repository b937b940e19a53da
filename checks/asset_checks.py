"""Asset checks: the gate in front of `send_batch`, and the audit's promises.

`reminders_due_are_sound` is blocking with ERROR severity: when it fails,
`send_batch` does not run and the run fails, so nothing leaves.
"""


import dagster as dg
import polars as pl

from dunning import audit as audit_rules

REMINDERS_SOUND = "reminders_due_are_sound"
NO_UNOWED_REMINDERS = "no_reminders_for_unowed_invoices"
KEY_PATTERN = r"^dunning:[^:]+:[0-9]+:[A-Za-z0-9_-]+$"


def reminder_batch_problems(plan: pl.DataFrame) -> dict[str, int]:
    """Counts of rows breaking the batch's invariants; all must be zero."""
    due = plan.filter(pl.col("role") == "due")
    return {
        "duplicate_keys": int(plan.get_column("idempotency_key").is_duplicated().sum()),
        "malformed_keys": int((~plan.get_column("idempotency_key").str.contains(KEY_PATTERN)).sum()),
        "not_owed": int((~due.get_column("owed")).sum()),
        "non_positive_amounts": int((due.get_column("amount_minor") <= 0).sum()),
        "invoices_with_two_due_stages": int(due.get_column("invoice_id").is_duplicated().sum()),
    }


@dg.asset_check(asset="reminders_due", name=REMINDERS_SOUND, blocking=True,
                description="Every due reminder has a unique well-formed key, is for an owed invoice, and each invoice is due at most one stage.")
def reminders_due_are_sound(reminders_due: pl.DataFrame) -> dg.AssetCheckResult:
    problems = reminder_batch_problems(reminders_due)
    return dg.AssetCheckResult(
        passed=not any(problems.values()),
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={**problems, "rows": reminders_due.height},
    )


@dg.asset_check(asset="dunning_audit", name=NO_UNOWED_REMINDERS,
                description="No reminder was sent for an invoice that was not owed, and every sent amount equals the remaining balance.")
def no_reminders_for_unowed_invoices(dunning_audit: pl.DataFrame) -> dg.AssetCheckResult:
    unowed = audit_rules.not_owed_reminded(dunning_audit)
    mismatched = audit_rules.amount_mismatches(dunning_audit)
    return dg.AssetCheckResult(
        passed=unowed.is_empty() and mismatched.is_empty(),
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "reminders_for_unowed_invoices": unowed.height,
            "amount_mismatches": mismatched.height,
            "examples": dg.MetadataValue.json(unowed.head(10).select("idempotency_key").to_series().to_list()),
        },
    )

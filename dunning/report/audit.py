"""What was sent against what was owed, for one cycle.

One audit row per reminder key the cycle considered: its outcome, the amount
the email stated against the remaining balance in the snapshot, and, when it
was not sent, why (excluded, below the minimum balance, no email address,
paused, breaker, throttled, provider failure, unknown outcome). A key that was not
held but whose invoice's pay link was dropped (not https) has the reason
`payment_url_dropped`: its email went without the link. Keys held from earlier cycles (`failed`, `unknown`)
for invoices still owed are listed too, so nothing waiting on a human drops
out of sight.
"""

from __future__ import annotations

import datetime as dt
from typing import NamedTuple

import polars as pl

from dunning.email.pay_links import DROPPED
from dunning.plan.exclusions import HOLDS, WAITING_HOLDS
from dunning.plan.schedule import ALSO_HELD
from dunning.vocabulary import (
    AuditNote,
    AuditOutcome,
    EmailKind,
    HoldReason,
    LedgerStatus,
    SendStatus,
    plain,
    plain_keys,
)


class Verdict(NamedTuple):
    """What the audit says of one key: its outcome and, when it was not sent, why."""

    outcome: AuditOutcome
    reason: HoldReason | None = None


# a due key's send status -> its verdict
OUTCOMES: dict[SendStatus, Verdict] = {
    SendStatus.SENT: Verdict(AuditOutcome.SENT),
    SendStatus.FAILED: Verdict(AuditOutcome.FAILED, HoldReason.PROVIDER_FAILURE),
    SendStatus.UNKNOWN: Verdict(AuditOutcome.UNKNOWN, HoldReason.UNKNOWN_OUTCOME),
    SendStatus.RELEASED: Verdict(AuditOutcome.FAILED, HoldReason.PROVIDER_STOPPED),
    SendStatus.THROTTLED: Verdict(AuditOutcome.HELD, HoldReason.THROTTLED),
    SendStatus.SUPPRESSED: Verdict(AuditOutcome.HELD, HoldReason.SUPPRESSED),
    SendStatus.LOST: Verdict(AuditOutcome.HELD, HoldReason.CLAIMED_BY_ANOTHER_RUN),
    SendStatus.PAUSED: Verdict(AuditOutcome.HELD, HoldReason.PAUSED),
    SendStatus.BREAKER: Verdict(AuditOutcome.HELD, HoldReason.BREAKER),
    SendStatus.DRY_RUN: Verdict(AuditOutcome.DRY_RUN),
    SendStatus.SIMULATED: Verdict(AuditOutcome.SIMULATED),
}
# due keys that never reached the send step: no address to send to, or a send that stopped before them
# (the keys are this module's own, in the working column `_status` only; never stored)
_NO_EMAIL, _BAD_EMAIL, _NOT_ATTEMPTED = "no_email", "bad_email", "not_attempted"
NOT_SENDABLE = Verdict(AuditOutcome.HELD, HoldReason.NO_EMAIL_ADDRESS)
INVALID_ADDRESS = Verdict(AuditOutcome.HELD, HoldReason.INVALID_ADDRESS)
NOT_ATTEMPTED = Verdict(AuditOutcome.HELD, HoldReason.NOT_ATTEMPTED)
# keys the plan held before the send (its `hold` column, `dunning.plan.exclusions`): never claimed
PLAN_HOLDS = {str(reason): Verdict(AuditOutcome.HELD, reason) for reason in HOLDS}
# why a key from an earlier cycle is still held, by its ledger status (`Ledger.open_problems` returns only these)
EARLIER_REASONS: dict[LedgerStatus, HoldReason] = {
    LedgerStatus.FAILED: HoldReason.PROVIDER_FAILURE,
    LedgerStatus.UNKNOWN: HoldReason.UNKNOWN_OUTCOME,
}


KEY_COLUMNS = ("idempotency_key", "kind", "invoice_id", "customer_id", "cycle", "stage")  # what names a key


def build_audit(
    due: pl.DataFrame,
    outcomes: pl.DataFrame,
    earlier_open_problems: pl.DataFrame,
    snapshot: pl.DataFrame,
    *,
    run_id: str,
    as_of: dt.datetime,
    dry_run: bool,
) -> pl.DataFrame:
    """`due`: this cycle's due reminder rows (with `sendable`); `outcomes`: key -> status for the sendable ones."""
    owed = snapshot.select("invoice_id", "owed", pl.col("remaining_minor").alias("snapshot_remaining"))
    # only the columns the audit reads, before the joins copy them (the plan carries every snapshot column)
    used = [
        *KEY_COLUMNS,
        "hold",
        "sendable",
        "customer_email",
        DROPPED,
        "cc_dropped",
        "amount_minor",
        "currency",
        "policy",
        "waits_until",
        ALSO_HELD,
    ]
    due = due.select([c for c in used if c in due.columns])
    rows = due.join(
        outcomes.select(
            "idempotency_key", pl.col("status").alias("sent_status"), pl.col("message_id").alias("sent_message_id")
        ),
        on="idempotency_key",
        how="left",
    )
    hold = pl.col("hold") if "hold" in rows.columns else pl.lit(None, dtype=pl.String)
    # a key not held whose invoice's pay link was not https: its email went without the link (`pay_links`)
    dropped = pl.col(DROPPED).fill_null(False) if DROPPED in rows.columns else pl.lit(False)
    # an empty address is missing; anything else that is not one address (two of them, a typo) is invalid
    email = pl.col("customer_email") if "customer_email" in rows.columns else pl.lit(None, dtype=pl.String)
    blank = email.is_null() | (email.str.strip_chars() == "")
    # a key not held whose email left out a copy address that broke the address rule (`dunning.desk.contacts`)
    cc_dropped = (pl.col("cc_dropped").fill_null(0) > 0) if "cc_dropped" in rows.columns else pl.lit(False)
    status = (
        pl.when(hold.is_not_null())
        .then(hold)
        .when(~pl.col("sendable") & blank)
        .then(pl.lit(_NO_EMAIL))
        .when(~pl.col("sendable"))
        .then(pl.lit(_BAD_EMAIL))
        .otherwise(pl.col("sent_status").fill_null(_NOT_ATTEMPTED))
    )
    verdicts = (
        plain_keys(OUTCOMES)
        | {_NO_EMAIL: NOT_SENDABLE, _BAD_EMAIL: INVALID_ADDRESS, _NOT_ATTEMPTED: NOT_ATTEMPTED}
        | PLAN_HOLDS
    )
    outcome_of = {key: str(verdict.outcome) for key, verdict in verdicts.items()}
    reason_of = {key: None if verdict.reason is None else str(verdict.reason) for key, verdict in verdicts.items()}
    current = rows.with_columns(status.alias("_status")).select(
        *KEY_COLUMNS,
        pl.col("_status").replace_strict(outcome_of, return_dtype=pl.String).alias("outcome"),
        pl.coalesce(
            pl.col("_status").replace_strict(reason_of, return_dtype=pl.String),
            pl.when(dropped).then(pl.lit(AuditNote.PAYMENT_URL_DROPPED, dtype=pl.String)),
            pl.when(cc_dropped).then(pl.lit(AuditNote.CC_ADDRESS_DROPPED, dtype=pl.String)),
        ).alias("reason"),
        pl.when(pl.col("_status") == SendStatus.SENT).then(pl.col("amount_minor")).alias("amount_stated_minor"),
        "currency",
        pl.when(pl.col("_status") == SendStatus.SENT).then(pl.col("sent_message_id")).alias("message_id"),
        (pl.col("policy") if "policy" in rows.columns else pl.lit(None, dtype=pl.String)).alias("policy"),
        # when a key that waits for the schedule (a send window, a holiday, spacing) may go
        (
            pl.when(pl.col("_status").is_in(plain(WAITING_HOLDS))).then(pl.col("waits_until"))
            if "waits_until" in rows.columns
            else pl.lit(None, dtype=pl.Datetime("us", "UTC"))
        ).alias("waits_until"),
        # the key's other reasons (`dunning.plan.schedule.ALSO_HELD`), only while it is held
        (
            pl.when(pl.col("_status").is_in([*PLAN_HOLDS, _NO_EMAIL, _BAD_EMAIL])).then(pl.col(ALSO_HELD))
            if ALSO_HELD in rows.columns
            else pl.lit(None, dtype=pl.String)
        ).alias(ALSO_HELD),
    )
    earlier = earlier_open_problems.select(
        *KEY_COLUMNS,
        pl.lit(AuditOutcome.HELD).alias("outcome"),
        # a reason, never an outcome: a status with no reason of its own (none today) gets none
        pl.col("status")
        .replace_strict(plain_keys(EARLIER_REASONS), default=None, return_dtype=pl.String)
        .alias("reason"),
        pl.lit(None, dtype=pl.Int64).alias("amount_stated_minor"),
        "currency",
        "message_id",
        (pl.col("policy") if "policy" in earlier_open_problems.columns else pl.lit(None, dtype=pl.String)).alias(
            "policy"
        ),
        pl.lit(None, dtype=pl.Datetime("us", "UTC")).alias("waits_until"),
        pl.lit(None, dtype=pl.String).alias(ALSO_HELD),
    ).join(current.select("idempotency_key"), on="idempotency_key", how="anti", maintain_order="left")
    combined = pl.concat([current, earlier.cast(current.schema)], how="vertical")
    # the snapshot's rows of these invoices only: a left join hashes its right side, which was every invoice
    owed = owed.filter(pl.col("invoice_id").is_in(combined.get_column("invoice_id").drop_nulls().implode()))
    return combined.join(owed, on="invoice_id", how="left").select(
        pl.lit(run_id).alias("run_id"),
        pl.lit(as_of).alias("as_of"),
        pl.lit(dry_run).alias("dry_run"),
        *KEY_COLUMNS,
        "outcome",
        "reason",
        "owed",
        "amount_stated_minor",
        pl.col("snapshot_remaining").alias("remaining_minor"),
        "currency",
        "message_id",
        "policy",
        "waits_until",
        ALSO_HELD,
    )


def not_owed_reminded(audit: pl.DataFrame) -> pl.DataFrame:
    """Reminders sent in this cycle for invoices that were not owed: must always be empty."""
    return audit.filter(
        (pl.col("kind") == EmailKind.REMINDER)
        & (pl.col("outcome") == AuditOutcome.SENT)
        & ~pl.col("owed").fill_null(False)
    )


def amount_mismatches(audit: pl.DataFrame) -> pl.DataFrame:
    """Sent reminders whose stated amount differs from the snapshot's remaining balance: must be empty."""
    sent = audit.filter((pl.col("kind") == EmailKind.REMINDER) & (pl.col("outcome") == AuditOutcome.SENT))
    return sent.filter(pl.col("amount_stated_minor") != pl.col("remaining_minor"))


def still_held_expr() -> pl.Expr:
    """Rows for keys held from earlier cycles (failed or unknown then), listed so they stay in sight."""
    return (pl.col("outcome") == AuditOutcome.HELD) & pl.col("reason").is_in(plain(EARLIER_REASONS.values()))


SUMMARIZED_OUTCOMES = (
    AuditOutcome.SENT,
    AuditOutcome.FAILED,
    AuditOutcome.UNKNOWN,
    AuditOutcome.HELD,
    AuditOutcome.DRY_RUN,
)


def summarize(audit: pl.DataFrame) -> dict[str, int]:
    """The audit's counts in one pass over its rows (one `select` of sums: a row a filter would drop, its
    condition null, counts as no row, as in `not_owed_reminded` and `amount_mismatches`)."""
    reminder = pl.col("kind") == EmailKind.REMINDER
    sent_reminder = reminder & (pl.col("outcome") == AuditOutcome.SENT)
    counts = {
        "due": reminder & ~still_held_expr(),
        "still_held": still_held_expr(),
        **{str(outcome): pl.col("outcome") == outcome for outcome in SUMMARIZED_OUTCOMES},
        "not_owed_reminded": sent_reminder & ~pl.col("owed").fill_null(False),
        "payment_urls_dropped": pl.col("reason") == AuditNote.PAYMENT_URL_DROPPED,
        "amount_mismatches": sent_reminder & (pl.col("amount_stated_minor") != pl.col("remaining_minor")),
        "cc_addresses_dropped": pl.col("reason") == AuditNote.CC_ADDRESS_DROPPED,
    }
    row = audit.select(**{name: condition.fill_null(False).sum() for name, condition in counts.items()}).row(0)
    return {name: int(n or 0) for name, n in zip(counts, row, strict=True)}


def held_by_reason(audit: pl.DataFrame) -> dict[str, int]:
    held = audit.filter(pl.col("outcome") == AuditOutcome.HELD).group_by("reason").len().sort("reason")
    return dict(held.iter_rows())


def markdown_summary(counts: dict[str, int], held: dict[str, int], *, dry_run: bool) -> str:
    lines = [
        f"**Dunning cycle{' (dry run)' if dry_run else ''}**",
        "",
        "| outcome | keys |",
        "|---|---|",
        *[f"| {k} | {counts[k]} |" for k in ("due", "sent", "failed", "unknown", "held", "dry_run")],
        "",
        f"Reminders sent for invoices not owed: **{counts['not_owed_reminded']}** (must be 0).",
    ]
    if held:
        lines += ["", "Held, by reason: " + ", ".join(f"{r} {n}" for r, n in held.items())]
    return "\n".join(lines)


def by_stage_and_outcome(audit: pl.DataFrame) -> pl.DataFrame:
    return (
        audit.with_columns(pl.coalesce("stage", "kind").alias("stage"))
        .group_by("stage", "outcome")
        .len()
        .sort("stage", "outcome")
    )


def markdown_chart(counts: pl.DataFrame, width: int = 40) -> str:
    """Keys per stage and outcome as a bar chart that renders in the UI's markdown."""
    if counts.is_empty():
        return "_nothing was due this cycle_"
    top = max([1, *counts.get_column("len").to_list()])
    lines = ["**Keys per stage and outcome**", "", "```"]
    for stage, outcome, n in counts.rows():
        bar = "█" * max(1, round(width * n / top))
        lines.append(f"{stage:>14} {outcome:<10} {bar} {n}")
    return "\n".join(lines + ["```"])


def recovery_markdown(recovery: pl.DataFrame) -> str:
    """Recovery by policy, stage and currency (`Ledger.recovery_by_stage`) as a table for the UI's markdown."""
    if recovery.is_empty():
        return "_no reminder sent yet: nothing to recover_"
    lines = [
        "**Recovery by stage** (paid after a reminder: a later snapshot shows the invoice paid)",
        "",
        "| policy | stage | currency | reminders sent | paid ≤ 7 d | paid ≤ 30 d | recovered (minor) | median days |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in recovery.to_dicts():
        median = "–" if r["median_days_to_pay"] is None else f"{r['median_days_to_pay']:g}"
        lines.append(
            f"| {r['policy']} | {r['stage']} | {r['currency']} | {r['reminders_sent']} | {r['paid_within_7d']} | "
            f"{r['paid_within_30d']} | {r['amount_recovered_minor']} | {median} |"
        )
    return "\n".join(lines)

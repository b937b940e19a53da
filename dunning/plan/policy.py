"""What is newly due: the snapshot diffed against the ledger's per-invoice state.

Pure polars, no I/O, no per-invoice Python: the caller brings the accepted
snapshot and one state row per invoice the ledger knows (`invoice_id, cycle,
cycle_open, last_stage_days`); these functions return which cycle each invoice
is in and which reminder keys are due or skipped. The ledger state holds the
highest stage already on record in the invoice's current cycle (claimed, sent,
failed, unknown or skipped), so the diff costs one join with one row per
invoice, however long the history.
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from dunning.config import DunningConfig
from dunning.keys import reminder_key_expr
from dunning.plan.policies import NO_STAGE, policy_expr, stages_frame
from dunning.safe_text import ADDRESS_PATTERN, MAX_ADDRESS
from dunning.vocabulary import PLAN_ROLE_DTYPE, EmailKind, HoldReason, PlanRole

CYCLE_ACTION = pl.Enum(["open", "close"])
STATE_SCHEMA = pl.Schema(
    {"invoice_id": pl.String, "cycle": pl.Int32, "cycle_open": pl.Boolean, "last_stage_days": pl.Int32}
)
# optional in a state frame: when the snapshot that last opened or closed the invoice's cycle was taken
CHANGED_AT = "changed_snapshot_at"
CHANGED_AT_TYPE = pl.Datetime("us", "UTC")


def business_date(as_of: dt.datetime, config: DunningConfig) -> dt.date:
    """The calendar day `as_of` falls on in the business timezone."""
    return as_of.astimezone(config.zone).date()


def with_balances(snapshot: pl.DataFrame) -> pl.DataFrame:
    """`remaining_minor` and `owed` (open with something left to pay)."""
    remaining = pl.col("amount_due") - pl.col("amount_paid")
    return snapshot.with_columns(
        remaining.alias("remaining_minor"),
        ((pl.col("status") == "open") & (remaining > 0)).alias("owed"),
    )


def sendable_expr() -> pl.Expr:
    """Whether the row's `customer_email` is a usable address: `safe_text.is_address`, vectorized."""
    address = pl.col("customer_email")
    return (address.str.contains(ADDRESS_PATTERN) & (address.str.len_bytes() <= MAX_ADDRESS)).fill_null(False)


def address_problem_expr() -> pl.Expr:
    """Why a row that is not sendable has no usable address: `no_email_address` when `customer_email` is empty,
    else `invalid_address` (two addresses, a typo); null for a sendable row."""
    address = pl.col("customer_email")
    blank = address.is_null() | (address.str.strip_chars() == "")
    return (
        pl.when(sendable_expr())
        .then(pl.lit(None, dtype=pl.String))
        .when(blank)
        .then(pl.lit(str(HoldReason.NO_EMAIL_ADDRESS)))
        .otherwise(pl.lit(str(HoldReason.INVALID_ADDRESS)))
    )


def assign_cycles(
    snapshot: pl.DataFrame,
    state: pl.DataFrame,
    as_of: dt.datetime,
    config: DunningConfig,
    snapshot_taken_at: dt.datetime | None = None,
) -> pl.DataFrame:
    """The snapshot with `remaining_minor`, `days_overdue`, `owed`, the governing `policy`
    (`dunning.plan.policies`) and the dunning `cycle`.

    A cycle opens when an invoice is first seen open, unpaid and past due; it
    closes when the invoice is seen paid, void, or with nothing remaining. An
    invoice seen past due again after its cycle closed starts the next cycle.
    `cycle_action` says what the ledger must record: open, close, or nothing.
    A snapshot taken (`snapshot_taken_at`, default `as_of`) before the one that
    last opened or closed an invoice's cycle changes nothing for that invoice:
    a stale export never reopens what a newer one saw paid, nor closes what a
    newer one reopened.
    """
    # plain comparisons, each flag computed once: at 1M invoices `is_in` on the status strings and a
    # string-valued when/then were half of this function's time
    today = business_date(as_of, config)
    first_stage_days = min(1, min(s.days_overdue for s in config.every_stage))
    status = pl.col("status")
    # the state joined to the ids alone, in the snapshot's order, then set beside its columns: joining the whole
    # snapshot copied every text column (a gigabyte at 10M invoices) for a few integers per invoice
    known = snapshot.select("invoice_id").join(_state(state), on="invoice_id", how="left", maintain_order="left")
    joined = with_balances(snapshot).with_columns(
        (pl.lit(today) - pl.col("due_date")).dt.total_days().cast(pl.Int32).alias("days_overdue"),
        policy_expr(config, set(snapshot.columns)).alias("policy"),
        *known.drop("invoice_id"),
    )
    is_settled = (status == "paid") | (status == "void") | ((status == "open") & (pl.col("remaining_minor") <= 0))
    flags = joined.select(
        (pl.col("owed") & (pl.col("days_overdue") >= first_stage_days)).alias("past_due"),
        is_settled.alias("settled"),
        pl.col("cycle_open").fill_null(False).alias("was_open"),
        (pl.col(CHANGED_AT) > pl.lit(snapshot_taken_at or as_of, dtype=CHANGED_AT_TYPE))
        .fill_null(False)
        .alias("stale"),
    )
    past_due, settled, was_open = (
        flags.get_column("past_due"),
        flags.get_column("settled"),
        flags.get_column("was_open"),
    )
    fresh = ~flags.get_column("stale")
    opens, closes = past_due & ~was_open & fresh, settled & was_open & fresh
    return joined.with_columns(
        pl.when(opens).then(pl.col("cycle").fill_null(0) + 1).otherwise(pl.col("cycle")).cast(pl.Int32).alias("cycle"),
        pl.when(opens)
        .then(pl.lit("open", dtype=CYCLE_ACTION))
        .when(closes)
        .then(pl.lit("close", dtype=CYCLE_ACTION))
        .otherwise(None)
        .alias("cycle_action"),
        pl.when(opens).then(None).otherwise(pl.col("last_stage_days")).cast(pl.Int32).alias("last_stage_days"),
        ((past_due & (was_open | fresh)) | (was_open & ~settled)).alias("in_cycle"),
    ).drop("cycle_open", CHANGED_AT)


def _state(state: pl.DataFrame) -> pl.DataFrame:
    if CHANGED_AT not in state.columns:
        state = state.with_columns(pl.lit(None, dtype=CHANGED_AT_TYPE).alias(CHANGED_AT))
    return state.select(*STATE_SCHEMA, CHANGED_AT).cast(pl.Schema({**STATE_SCHEMA, CHANGED_AT: CHANGED_AT_TYPE}))


DENSE_GATHER = 4  # a gather of at least 1/DENSE_GATHER of a frame's rows rechunks it first


def gather_rows(frame: pl.DataFrame, rows: pl.Series) -> pl.DataFrame:
    """`frame.gather(rows)` for `rows` in nearly ascending order (the plan's keys: two runs of the snapshot's
    order). A dense gather (a new deployment: most invoices have a key) is faster on one chunk, and its copy of the
    frame is about the size of its result; a sparse one (an hour's newly due keys, a tenth of the invoices) is as
    fast across the chunks the snapshot was read in, and rechunking first held a second copy of every text
    column until the gather ended: 0.6 GB more at 10M invoices, over the 4 GB target (`bench/RESULTS.md`,
    2026-12-07, notes on the 11:27 run)."""
    if rows.len() * DENSE_GATHER >= frame.height:
        frame = frame.rechunk()
    return frame.gather(rows)


def plan_reminders(cycled: pl.DataFrame, config: DunningConfig) -> pl.DataFrame:
    """One row per reminder key this cycle must record: `role` is `due` (send) or `skipped`; the due rows first,
    then the skipped ones (`due_and_skipped` splits them), each part in the snapshot's order.

    For each invoice in an open cycle, the target is the highest stage it has
    reached (`days_overdue >= stage_days`) whose balance rule it meets
    (`remaining / amount_due >= min_remaining_ratio`). It is due when it is
    above everything on record in the cycle; stages between what is on record
    and the target are recorded as skipped, never sent later.
    """
    # Every comparison has its column on the left: polars (2.1, and 1.x before it) compares a literal on the left
    # with a scalar column (an all-null state column of invoices without history is kept as one) as a one-row
    # result, which a filter of 16,384 rows or more refuses (`filter predicate length of 2`); see
    # tests/test_plan_shapes.py.
    # Cost, at 1M and 10M invoices: the target is one horizontal max over the (few) configured stages,
    # computed on the few columns it needs for in-cycle invoices only; the wide frame is gathered once, for
    # the invoices that have a target; the due key is a join on the target's days, and only invoices that
    # jump a stage are crossed with the stages to spell out their skipped keys. (Crossing every in-cycle
    # invoice with the stages, with all its columns, was half of this step.)
    above_record = pl.col("last_stage_days").fill_null(NO_STAGE)
    policies = config.resolved_policies()
    reached = []
    for policy in policies:
        governs = pl.col("policy") == policy.name if len(policies) > 1 else pl.lit(True)
        for s in policy.stages:
            rule = (
                governs
                & (pl.col("days_overdue") >= s.days_overdue)
                & (above_record < s.days_overdue)
                & (pl.col("remaining_minor") >= s.min_remaining_ratio * pl.col("amount_due"))
            )
            reached.append((s.days_overdue, rule))
    target = pl.max_horizontal([pl.when(rule).then(pl.lit(days, dtype=pl.Int32)) for days, rule in reached])
    every_days = sorted({days for days, _ in reached})
    jumps = pl.any_horizontal([(above_record < days) & (pl.col("target_days") > days) for days in every_days])
    stages = stages_frame(config).drop("min_remaining_ratio")
    targets = (
        cycled.select(
            pl.int_range(pl.len(), dtype=pl.UInt32).alias("row"),
            "source_row",
            "days_overdue",
            "last_stage_days",
            "remaining_minor",
            "amount_due",
            "policy",
            (pl.col("in_cycle") & pl.col("owed")).alias("candidate"),
        )
        .filter("candidate")
        .select("row", "source_row", "policy", "last_stage_days", target.alias("target_days"))
        .drop_nulls("target_days")
    )
    # the keys decided on a few narrow columns, then every snapshot column gathered once, in the plan's order
    # (gathering the wide rows first and carrying them through the join, the cross join and the sort copied
    # them four times: half a gigabyte at 10M invoices)
    due = targets.join(
        stages.with_columns(pl.col("stage_days").alias("target_days")), on=["policy", "target_days"], how="inner"
    )
    skipped = (
        targets.filter(jumps)
        .join(stages, on="policy", how="inner")
        .filter((pl.col("stage_days") > above_record) & (pl.col("stage_days") < pl.col("target_days")))
    )
    keys = (
        pl.concat([due, skipped.select(due.columns)], how="vertical")
        .select(
            "row",
            "source_row",
            "stage",
            "stage_rank",
            "stage_count",
            "stage_days",
            "tone",
            "gentle_first",
            pl.when(pl.col("stage_days") == pl.col("target_days"))
            .then(pl.lit(PlanRole.DUE))
            .otherwise(pl.lit(PlanRole.SKIPPED))
            .cast(PLAN_ROLE_DTYPE)
            .alias("role"),
        )
        # the due keys first, then the skipped ones (the enum's order), each in the snapshot's order (an email sorts
        # its own invoices): the cycle takes each part as a slice of the wide frame, not a filter copying it
        .sort("role", "source_row", "stage_rank")
        .drop("source_row")
    )
    return (
        gather_rows(cycled, keys.get_column("row"))
        .with_columns(keys.drop("row"))
        .with_columns(
            reminder_key_expr().alias("idempotency_key"),
            pl.lit(EmailKind.REMINDER).alias("kind"),
            pl.col("remaining_minor").alias("amount_minor"),
            sendable_expr().alias("sendable"),
        )
        .select(
            *cycled.columns,
            "sendable",
            "stage",
            "stage_rank",
            "stage_count",
            "stage_days",
            "tone",
            "gentle_first",
            "role",
            "idempotency_key",
            "kind",
            "amount_minor",
        )
    )


def due_and_skipped(planned: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`plan_reminders`' due rows and its skipped rows, as two slices of it (no column copied: at 1.2M rows of
    forty-odd columns, two filters were 0.1 s)."""
    due_count = int((planned.get_column("role") == PlanRole.DUE).sum())
    return planned.slice(0, due_count), planned.slice(due_count)


def plan_retries(cycled: pl.DataFrame, failed: pl.DataFrame, due: pl.DataFrame, config: DunningConfig) -> pl.DataFrame:
    """`failed` reminder keys to send again: still the invoice's current stage, in its current cycle, still owed.

    `failed` holds the ledger's retryable rows (`idempotency_key, invoice_id,
    cycle, stage, email_id, message_id`). A retry keeps its key and its
    Message-ID; an invoice that has a newer stage due this cycle gets that one
    instead; one whose policy changed keeps it only when its new policy has the stage.
    """
    current = cycled.filter(pl.col("in_cycle") & pl.col("owed")).join(
        due.select("invoice_id"), on="invoice_id", how="anti"
    )
    return (
        failed.select("idempotency_key", "invoice_id", "cycle", "stage", "email_id", "message_id")
        .join(current, on=["invoice_id", "cycle"], how="inner")
        .join(stages_frame(config).drop("min_remaining_ratio"), on=["policy", "stage"], how="inner")
        .filter(pl.col("stage_days") == pl.col("last_stage_days"))
        .with_columns(
            pl.lit(PlanRole.RETRY, dtype=PLAN_ROLE_DTYPE).alias("role"),
            pl.lit(EmailKind.REMINDER).alias("kind"),
            pl.col("remaining_minor").alias("amount_minor"),
            pl.col("email_id").alias("email_group"),
            sendable_expr().alias("sendable"),
        )
    )


def email_groups(due: pl.DataFrame, config: DunningConfig) -> pl.Expr:
    """The expression naming the email each due reminder belongs to."""
    if config.group_by == "invoice":
        return pl.col("idempotency_key")
    # an email groups the invoices of one policy only: a customer with invoices under two policies gets two
    policy = pl.col("policy").fill_null("") if "policy" in due.columns else pl.lit("")
    return pl.concat_str([pl.col("customer_id"), pl.col("customer_email").str.to_lowercase(), policy], separator="|")

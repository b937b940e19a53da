"""What the desk adds to a run's plan step: the promises judged, the invoices and customers whose keys wait, and
what the next reminder's template learns of a broken promise.

`plan_desk` reads the ledger once per run; a live run (and the resume guard's simulation, whose writes are rolled
back and whose alerts stay home) records the verdicts; a dry run, a preview and a backfill only look.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from dunning.config import DunningConfig
from dunning.desk import promises, replies
from dunning.ledger.base import Ledger
from dunning.plan.clock import CycleClock
from dunning.plan.exclusions import PROMISED, REPLIED, with_held
from dunning.vocabulary import EmailKind


@dataclass(frozen=True)
class DeskState:
    promised: list[str]  # invoices whose keys an active promise holds
    replied: list[str]  # customers waiting for an answer to their reply
    broken: pl.DataFrame  # `promises.BROKEN_SCHEMA`: per invoice, the broken promise its next reminder tells of
    judged: pl.DataFrame  # this run's verdicts (`promises.judge`)


def plan_desk(
    ledger: Ledger, cycled: pl.DataFrame, config: DunningConfig, clock: CycleClock, *, run_id: str | None
) -> DeskState:
    """The desk's holds at the run's clock; a live run judges the promises whose grace is over first, so a broken
    one's invoices take up dunning in this same run."""
    coverage = ledger.promise_coverage()
    verdicts = promises.judge(coverage, cycled, clock.as_of, config) if clock.reads_live_state else None
    if verdicts is None:
        verdicts = pl.DataFrame(schema={"promise_id": pl.String, "status": pl.String})
    if clock.live and verdicts.height:
        promises.record_verdicts(ledger, verdicts, config, as_of=clock.as_of, run_id=run_id)
    broken = (
        promises.broken_for_templates(ledger, verdicts, coverage)
        if clock.reads_live_state
        else pl.DataFrame(schema=promises.BROKEN_SCHEMA)
    )
    waiting = replies.waiting(ledger, clock.as_of, config)
    if clock.live and waiting.ran_out.height:
        replies.alert_unanswered(ledger, waiting.ran_out, config, as_of=clock.as_of, run_id=run_id)
    return DeskState(promises.promised_invoices(coverage, clock.as_of, config), waiting.paused, broken, verdicts)


def with_desk_holds(exclusions: pl.DataFrame, state: DeskState) -> pl.DataFrame:
    """The exclusions in force plus the desk's holds (`dunning.plan.exclusions.hold_expr` reads them)."""
    return with_held(with_held(exclusions, PROMISED, state.promised), REPLIED, state.replied)


def with_broken_promises(plan: pl.DataFrame, state: DeskState) -> pl.DataFrame:
    """Each reminder row of an invoice with a broken promise unanswered gains `broken_promise_until` and
    `broken_promise_amount_minor` (null for the others)."""
    if state.broken.is_empty():
        return plan.with_columns(
            pl.lit(None, dtype=pl.Date).alias("broken_promise_until"),
            pl.lit(None, dtype=pl.Int64).alias("broken_promise_amount_minor"),
        )
    joined = plan.join(state.broken, on="invoice_id", how="left", maintain_order="left")
    is_reminder = pl.col("kind") == EmailKind.REMINDER
    return joined.with_columns(
        pl.when(is_reminder).then(pl.col("broken_promise_until")).alias("broken_promise_until"),
        pl.when(is_reminder).then(pl.col("broken_promise_amount_minor")).alias("broken_promise_amount_minor"),
    )

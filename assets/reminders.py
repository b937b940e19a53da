"""What is newly due: the day's snapshot diffed against the ledger, plus retries and payment-failed notices."""

from collections.abc import Iterator

import dagster as dg
import polars as pl

from assets.common import ASSET_DEFAULTS, LEDGER_POOL, frame_metadata
from checks.asset_checks import REMINDERS_SOUND_SPEC, reminders_due_are_sound
from dunning.plan import schedule
from dunning.run import cycle, steps
from resources.dunning import CycleRequest, DunningHome


@dg.asset(**ASSET_DEFAULTS, kinds={"polars"}, pool=LEDGER_POOL, check_specs=[REMINDERS_SOUND_SPEC])
def reminders_due(
    context: dg.AssetExecutionContext,
    invoice_snapshot: pl.DataFrame,
    billing_events: pl.DataFrame,
    dunning_home: DunningHome,
    cycle_request: CycleRequest,
) -> Iterator[dg.Output[pl.DataFrame] | dg.AssetCheckResult]:
    """One row per key this cycle: newly due (`due`), a failed send to retry (`retry`), or passed over (`skipped`).

    Reminders come from the snapshot; payment-failed notices (kind
    `payment_failed`) from new billing events. Retries and notices belong to
    live runs only: a backfill asks what the policy would have sent that day. The soundness gate
    (`reminders_due_are_sound`, blocking) is evaluated here, after the plan is recorded.
    """
    config = dunning_home.settings()
    clock = cycle_request.cycle_clock(context, config)
    with dunning_home.ledger() as ledger:
        plan = steps.plan_step(ledger, invoice_snapshot, billing_events, config, clock, cycle_request.shard_spec(),
                               run_id=context.run.run_id)  # fmt: skip
    due = cycle.due_rows(plan)
    by_stage = dict(due.group_by("stage").len().iter_rows()) if due.height else {}
    waiting = cycle.waiting_by_reason(plan)
    yield dg.Output(
        plan,
        metadata={
            **frame_metadata(plan),
            "due": due.height,
            "retries": int((due.get_column("role") == "retry").sum()),
            "payment_failed_notices": int((due.get_column("kind") == "payment_failed").sum()),
            "due_unsendable": int((~due.get_column("sendable")).sum()) if due.height else 0,
            "skipped": int((plan.get_column("role") == "skipped").sum()),
            "unknown_to_settle": int((plan.get_column("role") == "settle").sum()),
            "held_before_send": int(due.get_column("hold").is_not_null().sum()) if due.height else 0,
            "emails": int(cycle.sendable_due(plan).get_column("email_group").n_unique()) if due.height else 0,
            "due_by_stage": dg.MetadataValue.json({str(k): v for k, v in by_stage.items()}),
            # the collections schedule: keys that wait (a send window, a holiday, spacing), still newly due
            "waiting": sum(waiting.values()),
            "waiting_by_reason": dg.MetadataValue.json(waiting),
            "escalations_due": int(cycle.escalations_due(plan).height),
            "unknown_customer_timezones": schedule.unknown_timezones(invoice_snapshot),
        },
    )
    yield reminders_due_are_sound(plan)

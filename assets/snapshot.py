"""The inputs of a cycle: the invoice snapshot (validated, with cycles) and the billing events."""

import dagster as dg
import polars as pl

from assets.common import ASSET_DEFAULTS, LEDGER_POOL, fail, frame_metadata, log_run_mode
from dunning import cycle
from dunning.clock import RunMode, utc_now
from dunning.errors import DunningError, InvalidRowsHalt, SnapshotError
from dunning.events import EVENTS_SCHEMA, PAYMENT_FAILED, load_events
from dunning.landing import latest_for_day
from dunning.policy import assign_cycles, stages_frame
from resources.dunning import CycleRequest, DunningHome

HISTORY_COLUMNS = (
    "invoice_id",
    "customer_id",
    "customer_email",
    "currency",
    "amount_due",
    "amount_paid",
    "remaining_minor",
    "due_date",
    "status",
    "days_overdue",
    "cycle",
)


def _snapshot_path(dunning_home: DunningHome, cycle_request: CycleRequest, day) -> str:
    if cycle_request.snapshot_path:
        return cycle_request.snapshot_path
    landed = latest_for_day(dunning_home.root / "landing", day)
    if landed is None:
        raise SnapshotError(
            f"no snapshot given and none landed for {day} in {dunning_home.root / 'landing'} "
            "(name files YYYY-MM-DD*.csv|parquet|json)"
        )
    return str(landed)


@dg.asset(**ASSET_DEFAULTS, kinds={"polars", "duckdb", "pandera"}, pool=LEDGER_POOL)
def invoice_snapshot(
    context: dg.AssetExecutionContext, dunning_home: DunningHome, cycle_request: CycleRequest
) -> dg.Output[pl.DataFrame]:
    """One row per accepted invoice of the day's snapshot, with its dunning cycle and days overdue.

    Rejected rows go to `snapshot_quarantine` with the rule they broke. The
    day's partition of `invoice_history_daily` is replaced in one transaction; a
    live run also opens/closes cycles in `invoice_cycles`. A
    backfill evaluates the day against the ledger as it stood then.
    """
    try:
        config = dunning_home.settings()
        clock = cycle_request.cycle_clock(context, config)
        path = _snapshot_path(dunning_home, cycle_request, clock.partition_date)
        loaded = cycle.load_snapshot(path, config)
        taken_at = cycle.snapshot_taken_at(loaded.valid, clock.as_of)
        with dunning_home.ledger() as ledger:
            if clock.live:  # before anything is written
                cycle.refuse_stale(ledger, taken_at, cycle_request.allow_stale)
            if loaded.rejected.height and clock.mode is not RunMode.DRY_RUN:
                ledger.quarantine(context.run.run_id, path, loaded.rejected, utc_now())
            if loaded.rejected.height and config.on_invalid_rows == "halt":
                raise InvalidRowsHalt(f"snapshot rejected (on_invalid_rows: halt): {loaded.summary}")
            state = (
                ledger.invoice_state()
                if clock.reads_live_state
                else ledger.state_as_of(clock.as_of, stages_frame(config))
            )
            cycled = assign_cycles(loaded.valid, state, clock.as_of, config, taken_at)
            if clock.live:
                ledger.record_cycle_changes(clock.as_of, cycled, taken_at)
                ledger.record_applied_snapshot(
                    context.run.run_id, taken_at, clock.as_of, path, cycle_request.allow_stale, utc_now()
                )
            if clock.mode is not RunMode.DRY_RUN:
                ledger.replace_partition(
                    "invoice_history_daily",
                    clock.partition_date,
                    cycled.select(
                        pl.lit(clock.partition_date).alias("business_date"),
                        pl.lit(context.run.run_id).alias("run_id"),
                        pl.lit(clock.as_of).alias("as_of"),
                        *HISTORY_COLUMNS,
                    ),
                )
    except DunningError as error:
        raise fail(error) from None
    if loaded.rejected.height:
        context.log.warning(loaded.summary)
    mode = log_run_mode(context, clock.mode)
    return dg.Output(
        cycled,
        metadata={
            **frame_metadata(cycled),
            "mode": mode,
            "snapshot": path,
            "rejected_rows": loaded.rejected.height,
            "rejections": loaded.summary,
            "owed_invoices": int(cycled.get_column("owed").sum()),
            "as_of": clock.as_of.isoformat(),
        },
    )


@dg.asset(**ASSET_DEFAULTS, kinds={"stripe", "duckdb"}, pool=LEDGER_POOL)
def billing_events(
    context: dg.AssetExecutionContext, dunning_home: DunningHome, cycle_request: CycleRequest
) -> dg.Output[pl.DataFrame]:
    """One row per distinct accepted billing event (Stripe) delivered to this run, stored once in `billing_events`.

    An `invoice.payment_failed` event that cannot be a sound notice (see
    `dunning.events.rejection_reasons`) is left out and, on a live run, kept in
    `event_quarantine` with its reasons; the other events proceed.
    """
    if not cycle_request.events_path:
        return dg.Output(pl.DataFrame(schema=EVENTS_SCHEMA), metadata={"events": 0, "rejected_events": 0})
    try:
        loaded = load_events(cycle_request.events_path)
        events = loaded.accepted
        new = 0
        if not cycle_request.dry_run:
            received_at = utc_now()
            with dunning_home.ledger() as ledger, ledger.transaction():
                new = ledger.store_events(events, context.run.run_id, received_at)
                if loaded.rejected.height:
                    ledger.quarantine_events(loaded.rejected, context.run.run_id, received_at)
    except DunningError as error:
        raise fail(error) from None
    if loaded.rejected.height:
        context.log.warning(loaded.summary())
    by_type = dict(events.group_by("type").len().iter_rows())
    ignored = sum(n for t, n in by_type.items() if t != PAYMENT_FAILED)
    if ignored:
        context.log.info(f"{ignored} event(s) of other types counted and ignored: {by_type}")
    return dg.Output(
        events,
        metadata={
            **frame_metadata(events),
            "new_events": new,
            "ignored_events": ignored,
            "rejected_events": loaded.rejected.height,
            "rejections": loaded.summary(),
            "by_type": dg.MetadataValue.json(by_type),
        },
    )

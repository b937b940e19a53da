"""The inputs of a cycle: the invoice snapshot (validated, with cycles) and the billing events."""

import datetime as dt
from collections.abc import Iterator

import dagster as dg
import polars as pl

from assets.common import (
    ASSET_DEFAULTS,
    LEDGER_POOL,
    NARROW_AFTER_FULL_LOAD,
    as_operator_failure,
    frame_metadata,
    log_run_mode,
    tag_held,
)
from checks.asset_checks import SNAPSHOT_AUDIT_COLUMNS
from dunning.config import DunningConfig
from dunning.errors import SnapshotError, SnapshotRefused
from dunning.ingest import rejections
from dunning.ingest.events import (
    EVENTS_SCHEMA,
    PAYMENT_FAILED,
    REJECTED_SCHEMA,
    LoadedEvents,
    expired_rows,
    load_events,
    with_pending,
)
from dunning.ingest.landing import latest_for_day
from dunning.ingest.sources import pulls
from dunning.plan import unchanged
from dunning.plan.clock import CycleClock, refuse_future, utc_now
from dunning.run import inbox, ingest, steps
from dunning.run.snapshot_guard import REFUSED_CLASS_TAG, REFUSED_TAG
from dunning.secret_env import scrub
from dunning.send.alerts import Alert, raise_alert
from resources.dunning import CycleRequest, DunningHome


def _pulls(config: DunningConfig, cycle_request: CycleRequest, clock: CycleClock) -> bool:
    return pulls.pulls_from_source(config.source, bool(cycle_request.snapshot_path), clock.reads_live_state)


def _snapshot_path(
    dunning_home: DunningHome, cycle_request: CycleRequest, config: DunningConfig, clock: CycleClock
) -> tuple[str, str | None]:
    """`--snapshot`; else, with a billing source, a fresh pull (HOME/snapshots/); else the day's landed file. With
    the billing source's kind when it was pulled from it."""
    if cycle_request.snapshot_path:
        return cycle_request.snapshot_path, None
    shard = cycle_request.shard_spec()
    if cycle_request.shard and clock.live and ingest.reads_the_store(config, dunning_home.root):
        return str(ingest.shard_snapshot(config, dunning_home.root, shard.count, shard.index, clock.as_of)), None
    if _pulls(config, cycle_request, clock):
        return str(
            pulls.pull_invoices(config.source, dunning_home.root, utc_now(), zone=config.zone)
        ), config.source.kind
    day = clock.partition_date
    landed = latest_for_day(dunning_home.root / "landing", day)
    if landed is None:
        raise SnapshotError(
            f"no snapshot given and none landed for {day} in {dunning_home.root / 'landing'} "
            "(name files YYYY-MM-DD*.csv|parquet|json)"
        )
    return str(landed), None


def refuse_input(context: dg.AssetExecutionContext, dunning_home: DunningHome, error: SnapshotRefused) -> None:
    """A refused snapshot ends the run's work here without failing it: this asset materializes nothing, so the
    steps after it and their checks (the breaker among them) are skipped, as Dagster shows a check it never ran,
    instead of "execution failed" beside every asset as if the breaker had tripped. The reason is on the run (tags
    `dunning/refused`, `dunning/refused_class`) and in its log; `dunning run` exits 2 with it. A run the command did
    not start (the schedule, a sensor, the UI) raises the alert a failed run would have."""
    line = scrub(str(error))
    context.instance.add_run_tags(
        context.run.run_id, {REFUSED_TAG: line[:4000], REFUSED_CLASS_TAG: type(error).__name__}
    )
    context.log.error(f"snapshot refused, nothing applied; the later steps and checks are skipped: {line}")
    if context.run.tags.get("dunning/trigger") in ("cli", "backfill"):  # the command says it, with its exit code
        return
    with dunning_home.ledger() as ledger:
        raise_alert(
            ledger,
            dunning_home.settings().alerts,
            Alert(kind="input_refused", message=f"run {context.run.run_id} refused its snapshot: {line}"[:2000],
                  created_at=utc_now(), run_id=context.run.run_id, details={"error_class": type(error).__name__}),
        )  # fmt: skip


@dg.asset(
    **ASSET_DEFAULTS,
    kinds={"polars", "duckdb", "pandera"},
    pool=LEDGER_POOL,
    output_required=False,
    deps=["ingested_snapshot"],  # a sharded run reads its part of the hour's ingest (`assets.ingest`)
    # reminders_due reads every column; the steps after it (the breaker's trip record, the audit) only these: the
    # frames IO manager keeps only them once reminders_due has its copy (a gigabyte less held at 10M invoices)
    metadata={NARROW_AFTER_FULL_LOAD: SNAPSHOT_AUDIT_COLUMNS},
)
def invoice_snapshot(
    context: dg.AssetExecutionContext, dunning_home: DunningHome, cycle_request: CycleRequest
) -> Iterator[dg.Output[pl.DataFrame]]:
    """One row per accepted invoice of the day's snapshot, with its dunning cycle and days overdue.

    Rejected rows go to `snapshot_quarantine` with the rule they broke. The
    day's partition of `invoice_history_daily` is replaced in one transaction; a
    live run also opens/closes cycles in `invoice_cycles`. A
    backfill evaluates the day against the ledger as it stood then.

    A live run given nothing new since the last one (`dunning.plan.unchanged`) materializes nothing: the steps after
    this one are skipped, and the run's record says what was checked.
    """
    try:
        config = dunning_home.settings()
        clock = cycle_request.cycle_clock(context, config)
        if clock.live and cycle_request.as_of:  # a run launched with a clock ahead (the launchpad), as the CLI's
            refuse_future(clock.as_of, utc_now(), cycle_request.allow_future_as_of)
        path, source = _snapshot_path(dunning_home, cycle_request, config, clock)
        with dunning_home.ledger() as ledger:
            if clock.live:
                inputs = unchanged.RunInputs.of(path, config, clock, cycle_request.shard_spec())
                brings_data = (
                    bool(cycle_request.events_path)
                    or _pulls(config, cycle_request, clock)
                    or bool(inbox.pending(dunning_home.root, config.source.kind))  # webhook events wait to be applied
                )
                verdict = unchanged.start(
                    ledger, inputs, clock, config, run_id=context.run.run_id, may_skip=not brings_data, wall=utc_now()
                )
                if verdict.unchanged:
                    context.log.info(verdict.reason)
                    return
            applied = steps.apply_snapshot(
                ledger,
                path,
                config,
                clock,
                run_id=context.run.run_id,
                allow_stale=cycle_request.allow_stale,
                wall=utc_now(),
                shard=cycle_request.shard_spec(),
                allow_shrink=cycle_request.allow_shrink,
                source=source,
            )
    except SnapshotRefused as error:  # the input was refused: nothing later is evaluated, so nothing later fails
        refuse_input(context, dunning_home, error)
        return
    except Exception as error:  # noqa: BLE001 - recorded as an operator's line, masked (`as_operator_failure`)
        tag_held(context, error)
        raise as_operator_failure(error) from None
    loaded, cycled = applied.loaded, applied.cycled
    if loaded.rejected.height:
        context.log.warning(loaded.summary)
    mode = log_run_mode(context, clock.mode)
    yield dg.Output(
        cycled,
        metadata={
            **frame_metadata(cycled),
            "mode": mode,
            "snapshot": path,
            "rejected_rows": loaded.rejected.height,
            "rows_read": applied.rows_read,
            "rejections": loaded.summary,
            # the rules broken, the first rows and the duplicated ids' copies: the run summary says them alike for a
            # live run and a dry run (which stores nothing in snapshot_quarantine)
            "rejected_detail": dg.MetadataValue.json(rejections.breakdown(loaded.rejected)),
            "owed_invoices": int(cycled.get_column("owed").sum()),
            "as_of": clock.as_of.isoformat(),
            "shard": str(cycle_request.shard_spec()),
        },
    )


@dg.asset(**ASSET_DEFAULTS, kinds={"stripe", "duckdb"}, pool=LEDGER_POOL)
def billing_events(
    context: dg.AssetExecutionContext, dunning_home: DunningHome, cycle_request: CycleRequest
) -> dg.Output[pl.DataFrame]:
    """One row per distinct accepted billing event (Stripe) delivered to this run, stored once in `billing_events`.

    Events come from `--events FILE`; or, on a run that pulls from a `stripe` source, the unsharded run or shard 0
    polls the `invoice.payment_failed` events newer than the ledger's cursor (kept in HOME/snapshots/, the newest id
    staged for the send step to commit once the notices are claimed), and every run adds the stored payment-failed
    events still without a notice (so each shard sends its customers' notices). An `invoice.payment_failed` event
    that cannot be a sound notice (see `dunning.ingest.events.rejection_reasons`) is left out and, on a live run,
    kept in `event_quarantine` with its reasons; the other events proceed.
    """
    try:
        config = dunning_home.settings()
        clock = cycle_request.cycle_clock(context, config)
        polling = not cycle_request.events_path and pulls.polls_events(
            config.source, bool(cycle_request.snapshot_path), clock.reads_live_state
        )
        received = None
        if clock.live and inbox.pending(
            dunning_home.root, config.source.kind
        ):  # what `dunning serve-webhooks` accepted since
            with dunning_home.ledger() as ledger:
                received = inbox.apply_inbox(ledger, dunning_home.root, config, context.run.run_id, utc_now())
            context.log.info(f"webhook inbox: {received.files} event(s) applied")
        webhooks = inbox.inbox_dir(dunning_home.root).is_dir()  # stored Stripe events feed notices as polled ones do
        if not cycle_request.events_path and not polling and not webhooks:
            return dg.Output(pl.DataFrame(schema=EVENTS_SCHEMA), metadata={"events": 0, "rejected_events": 0})
        first_shard = cycle_request.shard_spec().index == 0
        polled = None
        if polling and first_shard:  # once per cycle, whatever the sharding
            with dunning_home.ledger() as ledger:
                cursor = ledger.source_cursor(pulls.events_cursor(config.source))
            polled = pulls.poll_events(config.source, dunning_home.root, cursor, clock.as_of, utc_now())
        path = cycle_request.events_path or (str(polled.path) if polled and polled.path else None)
        if path:
            loaded = load_events(path)
        else:
            loaded = LoadedEvents(pl.DataFrame(schema=EVENTS_SCHEMA), pl.DataFrame(schema=REJECTED_SCHEMA))
        events = loaded.accepted
        new = expired = 0
        if not cycle_request.dry_run:
            received_at = utc_now()
            with dunning_home.ledger() as ledger, ledger.transaction():
                new = ledger.store_events(events, context.run.run_id, received_at)
                if loaded.rejected.height and first_shard:  # kept once, by shard 0
                    ledger.quarantine_events(loaded.rejected, context.run.run_id, received_at)
                if polled is not None and polled.newest_id:
                    ledger.stage_cursor(
                        pulls.events_cursor(config.source), polled.newest_id, context.run.run_id, received_at
                    )
        pending = 0
        if polling or webhooks:
            since = clock.as_of - dt.timedelta(days=config.source.events_lookback_days)
            with dunning_home.ledger() as ledger:
                waiting = ledger.pending_notice_events(since)
                events = with_pending(events, waiting)
                if clock.live and first_shard:  # older ones yield nothing: set aside, counted, once (by shard 0)
                    old = ledger.expired_notice_events(since).filter(~pl.col("event_id").is_in(events["event_id"]))
                    expired = ledger.set_aside_events(
                        expired_rows(old, config.source.events_lookback_days, clock.as_of),
                        context.run.run_id,
                        utc_now(),
                    )
            pending = waiting.height
    except Exception as error:  # noqa: BLE001 - recorded as an operator's line, masked (`as_operator_failure`)
        raise as_operator_failure(error) from None
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
            "polled_events": polled.count if polled is not None else 0,
            "events_file": path or "",
            "pending_events_from_ledger": pending,
            "expired_events": expired,
            "by_type": dg.MetadataValue.json(by_type),
        },
    )

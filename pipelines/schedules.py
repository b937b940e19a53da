"""The hourly schedule: one run per hour (per shard), deduplicated by a run key for that hour, skipped while paused.

Why a run tag and not a MultiPartitionsDefinition (day x shard) for sharding:
the daily partition keys stay exactly what they are, so backfills, the UI's
partition ranges, the landing sensor and every recorded materialization keep
working unchanged; the number of shards can change from one hour to the next
(`shards:` in the config) without re-keying history or leaving a grid of
never-materialized (day, shard) partitions behind; and sharding is a way of
splitting the work, not a property of the data, since any shard's rows can be
redone by an unsharded run. The tag `dunning/shard` = "K/N" is what the run
queue's per-value limit keys on, so runs of one shard queue instead of racing.
"""

import datetime as dt

import dagster as dg
from croniter import croniter

from dunning.errors import LedgerBusy
from dunning.ingest.landing import latest_for_day
from pipelines.jobs import dunning_cycle_job, dunning_ingest_job
from resources.dunning import SHARD_TAG, DunningHome

INGEST_AS_OF_TAG = "dunning/as_of"  # on an ingest run: the hour its shard runs are for


def shard_requests(as_of: str, partition: str, shards: int, trigger: str) -> list[dg.RunRequest]:
    """One cycle run per shard K of N, tagged and keyed by shard and hour."""
    return [
        dg.RunRequest(
            run_key=f"dunning-cycle-{as_of}-shard-{shard}",
            job_name=dunning_cycle_job.name,
            partition_key=partition,
            run_config={"resources": {"cycle_request": {"config": {"as_of": as_of, "shard": shard}}}},
            tags={"dunning/trigger": trigger, SHARD_TAG: shard},
        )
        for shard in (f"{k}/{shards}" for k in range(shards))
    ]


# what the UI shows beside "Every minute": the schedule the operator configured lives in HOME/config.yaml, read at
# each tick (reading it when the definitions load would branch on the environment at import)
CRON_DESCRIPTION = (
    "Starts {what} at each tick of schedule.cron in HOME/config.yaml, in the business timezone (default "
    "'0 * * * *', hourly). Dagster shows 'Every minute' because it asks every minute; each minute that is not a "
    "tick of your cron is skipped, and the skip reason (Ticks tab) names your cron, its zone and the next tick."
)


def _tick(context: dg.ScheduleEvaluationContext, dunning_home: DunningHome):
    """(settings, as_of, partition) when this minute starts a cycle, else the SkipReason saying why not."""
    scheduled = context.scheduled_execution_time
    settings = dunning_home.settings()
    local = scheduled.astimezone(settings.zone)
    if not croniter.match(settings.schedule.cron, local):
        following = croniter(settings.schedule.cron, local).get_next(dt.datetime)
        return dg.SkipReason(
            f"{local:%Y-%m-%d %H:%M} {settings.timezone} is not a tick of schedule.cron {settings.schedule.cron!r} "
            f"(in {settings.timezone}); the next one is {following:%Y-%m-%d %H:%M}"
        )
    day = local.date()
    if settings.source.kind == "none" and latest_for_day(dunning_home.root / "landing", day) is None:
        return dg.SkipReason(
            f"no snapshot landed for {day} in {dunning_home.root / 'landing'} and no billing source configured: "
            "nothing to run (land a file named YYYY-MM-DD*.csv|parquet|json there, or configure source:)"
        )
    try:
        with dunning_home.ledger(timeout_seconds=5) as ledger:
            pause = ledger.pause_state()
        if pause.paused:
            return dg.SkipReason(f"dunning is paused since {pause.changed_at} by {pause.changed_by}: {pause.reason}")
    except LedgerBusy:
        context.log.info("ledger busy; requesting the run, which checks the pause itself")
    return settings, scheduled.isoformat(), day.isoformat()


@dg.schedule(
    job=dunning_cycle_job,
    cron_schedule="* * * * *",  # every minute; `schedule.cron` in the config says which minutes start a cycle
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description=CRON_DESCRIPTION.format(what="one dunning cycle"),
)
def hourly_dunning(context: dg.ScheduleEvaluationContext, dunning_home: DunningHome):
    """Asks for one cycle at each tick of `schedule.cron` (business `timezone`, hourly by default) with the tick as
    its clock; the run key stops a double launch.

    The cron comes from the config, read at each evaluation: a Dagster schedule's own cron is fixed when the
    definitions load, and reading the config there would branch on the environment at import. So the schedule is
    evaluated every minute and skips, cheaply, every minute that is not a tick of `schedule.cron`.

    With `shards: N` (N > 1) it skips: `hourly_ingest` starts the hour with one ingest, and the sensor
    `shards_after_ingest` asks for the N shard runs when it succeeds. While paused it skips with the reason. With
    no billing source and no snapshot landed for the day it skips with the reason too: no run, no failure, no page.
    If the ledger is busy it asks for the run anyway: the job itself holds every send while paused.
    """
    tick = _tick(context, dunning_home)
    if isinstance(tick, dg.SkipReason):
        return tick
    settings, as_of, partition = tick
    if settings.shards > 1:
        return dg.SkipReason(
            f"shards: {settings.shards}: the hour starts with one ingest (schedule hourly_ingest), then one run per "
            "shard (sensor shards_after_ingest)"
        )
    return dg.RunRequest(
        run_key=f"dunning-cycle-{as_of}",
        partition_key=partition,
        run_config={"resources": {"cycle_request": {"config": {"as_of": as_of}}}},
        tags={"dunning/trigger": "schedule"},
    )


@dg.schedule(
    job=dunning_ingest_job,
    cron_schedule="* * * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description=CRON_DESCRIPTION.format(what="one ingest (with shards: N > 1)"),
)
def hourly_ingest(context: dg.ScheduleEvaluationContext, dunning_home: DunningHome):
    """With `shards: N` (N > 1), at each tick of `schedule.cron`: one ingest of the hour's snapshot (validated once,
    stored split by shard); the shard runs follow it (`shards_after_ingest`). Unsharded it skips: `hourly_dunning`
    runs the cycle, which reads the snapshot itself."""
    tick = _tick(context, dunning_home)
    if isinstance(tick, dg.SkipReason):
        return tick
    settings, as_of, partition = tick
    if settings.shards == 1:
        return dg.SkipReason("shards: 1: hourly_dunning runs the cycle, which reads the snapshot itself")
    return dg.RunRequest(
        run_key=f"dunning-ingest-{as_of}",
        partition_key=partition,
        run_config={"ops": {"ingested_snapshot": {"config": {"as_of": as_of}}}},
        tags={"dunning/trigger": "schedule", INGEST_AS_OF_TAG: as_of},
    )

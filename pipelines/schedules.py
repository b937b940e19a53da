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

import dagster as dg
from croniter import croniter

from dunning.errors import LedgerBusy
from dunning.ingest.landing import latest_for_day
from pipelines.jobs import dunning_cycle_job
from resources.dunning import SHARD_TAG, DunningHome


@dg.schedule(
    job=dunning_cycle_job,
    cron_schedule="* * * * *",  # every minute; `schedule.cron` in the config says which minutes start a cycle
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.STOPPED,
)
def hourly_dunning(context: dg.ScheduleEvaluationContext, dunning_home: DunningHome):
    """Asks for one cycle at each tick of `schedule.cron` (business `timezone`, hourly by default) with the tick as
    its clock; the run key stops a double launch.

    The cron comes from the config, read at each evaluation: a Dagster schedule's own cron is fixed when the
    definitions load, and reading the config there would branch on the environment at import. So the schedule is
    evaluated every minute and skips, cheaply, every minute that is not a tick of `schedule.cron`.

    With `shards: N` (N > 1) it asks for N runs, shard K of N each, tagged and
    keyed by shard; with one shard the request is exactly the unsharded one.
    While paused it skips with the reason. With no billing source and no snapshot landed for the day it skips with
    the reason too: no run, no failure, no page. If the ledger is busy it asks for the run anyway: the job itself
    holds every send while paused.
    """
    scheduled = context.scheduled_execution_time
    settings = dunning_home.settings()
    local = scheduled.astimezone(settings.zone)
    if not croniter.match(settings.schedule.cron, local):
        return dg.SkipReason(f"{local:%Y-%m-%d %H:%M} is not a tick of schedule.cron {settings.schedule.cron!r}")
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
    as_of = scheduled.isoformat()
    partition = day.isoformat()
    if settings.shards == 1:
        return dg.RunRequest(
            run_key=f"dunning-cycle-{as_of}",
            partition_key=partition,
            run_config={"resources": {"cycle_request": {"config": {"as_of": as_of}}}},
            tags={"dunning/trigger": "schedule"},
        )
    shards = [f"{k}/{settings.shards}" for k in range(settings.shards)]
    return [
        dg.RunRequest(
            run_key=f"dunning-cycle-{as_of}-shard-{shard}",
            partition_key=partition,
            run_config={"resources": {"cycle_request": {"config": {"as_of": as_of, "shard": shard}}}},
            tags={"dunning/trigger": "schedule", SHARD_TAG: shard},
        )
        for shard in shards
    ]

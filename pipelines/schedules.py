"""The hourly schedule: one run per hour, deduplicated by a run key for that hour, skipped while paused."""

import dagster as dg

from dunning.errors import LedgerBusy
from pipelines.jobs import dunning_cycle_job
from resources.dunning import DunningHome


@dg.schedule(
    job=dunning_cycle_job,
    cron_schedule="0 * * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.STOPPED,
)
def hourly_dunning(context: dg.ScheduleEvaluationContext, dunning_home: DunningHome):
    """Asks for one cycle per hour with the hour as its clock; the run key stops a double launch.

    While paused it skips with the reason. If the ledger is busy it asks for the
    run anyway: the job itself holds every send while paused.
    """
    try:
        with dunning_home.ledger(timeout_seconds=5) as ledger:
            pause = ledger.pause_state()
        if pause.paused:
            return dg.SkipReason(f"dunning is paused since {pause.changed_at} by {pause.changed_by}: {pause.reason}")
    except LedgerBusy:
        context.log.info("ledger busy; requesting the run, which checks the pause itself")
    scheduled = context.scheduled_execution_time
    as_of = scheduled.isoformat()
    return dg.RunRequest(
        run_key=f"dunning-cycle-{as_of}",
        partition_key=scheduled.astimezone(dunning_home.settings().zone).date().isoformat(),
        run_config={"resources": {"cycle_request": {"config": {"as_of": as_of}}}},
        tags={"dunning/trigger": "schedule"},
    )

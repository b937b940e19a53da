"""The hourly schedule: one run per hour, deduplicated by a run key for that hour."""


import dagster as dg

from pipelines.jobs import dunning_cycle_job


@dg.schedule(job=dunning_cycle_job, cron_schedule="0 * * * *", execution_timezone="UTC",
             default_status=dg.DefaultScheduleStatus.STOPPED)
def hourly_dunning(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    """Asks for one cycle per hour with the hour as its clock; the run key stops a double launch."""
    scheduled = context.scheduled_execution_time
    as_of = scheduled.isoformat()
    return dg.RunRequest(
        run_key=f"dunning-cycle-{as_of}",
        run_config={"resources": {"cycle_request": {"config": {"as_of": as_of}}}},
        tags={"dunning/trigger": "schedule"},
    )

"""Sensors: a failed run pages a human, even one nobody was watching (a scheduled run at 3 am)."""

import dagster as dg

from dunning.alerts import Alert, raise_alert
from dunning.clock import utc_now
from pipelines.jobs import dunning_cycle_job
from pipelines.recovery_job import flood_recovery
from pipelines.resources import DunningHome


@dg.run_failure_sensor(monitored_jobs=[dunning_cycle_job, flood_recovery], default_status=dg.DefaultSensorStatus.RUNNING,
                       description="Raises one alert per failed dunning run; a breaker trip has already paged, so it is not paged twice.")
def page_on_run_failure(context: dg.RunFailureSensorContext, dunning_home: DunningHome) -> None:
    run = context.dagster_run
    with dunning_home.ledger() as ledger:
        if not ledger.alerts_for_run(run.run_id).is_empty():
            return
        message = context.failure_event.message or "run failed"
        raise_alert(ledger, dunning_home.settings().alerts, Alert(
            kind="run_failure", message=f"run {run.run_id} of {run.job_name} failed: {message}"[:2000],
            created_at=utc_now(), run_id=run.run_id, details={"job": run.job_name, "tags": dict(run.tags)}))

"""Sensors: snapshots landing in DIR/landing start runs; a failed run pages a human.

The landing sensor asks for one run per new file, keyed by the file's content
hash (`run_key`), so the same file dropped twice, or renamed, never starts a
second run; its cursor remembers the hashes it has seen.
"""

import json

import dagster as dg

from dunning.alerts import Alert, raise_alert
from dunning.clock import utc_now
from dunning.landing import content_hash, landing_files
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


@dg.sensor(job=dunning_cycle_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.STOPPED,
           description="One run per new snapshot file in DIR/landing (named YYYY-MM-DD*.csv|parquet|json).")
def landing_snapshots(context: dg.SensorEvaluationContext, dunning_home: DunningHome):
    seen = set(json.loads(context.cursor)) if context.cursor else set()
    requests = []
    for day, path in landing_files(dunning_home.root / "landing"):
        digest = content_hash(path)
        if digest in seen:
            continue
        seen.add(digest)
        requests.append(dg.RunRequest(
            run_key=f"landing-{digest}", partition_key=day.isoformat(),
            run_config={"resources": {"cycle_request": {"config": {"snapshot_path": str(path)}}}},
            tags={"dunning/trigger": "landing", "dunning/snapshot": path.name},
        ))
    context.update_cursor(json.dumps(sorted(seen)))
    return requests or dg.SkipReason("no new snapshot in the landing folder")

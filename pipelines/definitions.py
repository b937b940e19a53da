"""The one entry point: assets, checks, the job, the schedule and resources, assembled.

The dunning job runs in-process: its four steps share one DuckDB file that
only one process may open for writing at a time, and a process per step would
cost ~15 s of start-up per cycle while buying no parallelism.
"""

from __future__ import annotations

import dagster as dg

from assets.audit import dunning_audit
from assets.ingest import ingested_snapshot
from assets.publication import analyst_history
from assets.reminders import reminders_due
from assets.retention import retention_sweep
from assets.sending import send_batch
from assets.snapshot import billing_events, invoice_snapshot
from checks.asset_checks import circuit_breaker
from pipelines.feedback_job import feedback_import
from pipelines.instance import pool_wait  # noqa: F401 - a run waiting for its pool slot sleeps, not spins
from pipelines.io_manager import RunScopedFramesIOManager
from pipelines.jobs import dunning_cycle_job, dunning_ingest_job
from pipelines.recovery_job import flood_recovery
from pipelines.schedules import hourly_dunning, hourly_ingest
from pipelines.sensors import (
    dead_mans_switch,
    feedback_files_landed,
    landing_snapshots,
    page_on_run_failure,
    shards_after_ingest,
    stripe_events,
)
from resources.dunning import CycleRequest, DunningHome

defs = dg.Definitions(
    assets=[
        ingested_snapshot,
        invoice_snapshot,
        billing_events,
        reminders_due,
        send_batch,
        dunning_audit,
        analyst_history,
        retention_sweep,
    ],
    asset_checks=[circuit_breaker],  # the other two are evaluated in their asset's step (`check_specs`)
    jobs=[dunning_cycle_job, dunning_ingest_job, flood_recovery, feedback_import],
    schedules=[hourly_dunning, hourly_ingest],
    sensors=[
        page_on_run_failure,
        landing_snapshots,
        dead_mans_switch,
        stripe_events,
        feedback_files_landed,
        shards_after_ingest,
    ],
    resources={
        "dunning_home": DunningHome(home=dg.EnvVar("DUNNING_HOME")),
        "cycle_request": CycleRequest(),
        "frames": RunScopedFramesIOManager(),
    },
)

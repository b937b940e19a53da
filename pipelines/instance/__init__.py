"""The Dagster instance under the deployment's home, so every CLI run shows in the UI.

A brand-new SQLite instance migrates its storage on first use; two processes
doing that at once can crash ("alembic_version has more than one head"), so
the first use happens under an exclusive file lock.

The instance limits the `dunning_ledger` pool to one step at a time, or to
`shards` steps (the config's `shards:`, set by the CLI through
`set_pool_slots`, the call behind `dagster instance concurrency set`) so that
N shards of one day can work at once. Runs of the same shard (run tag
`dunning/shard`) queue one at a time instead of racing: the run queue's
per-value tag limit below, applied by the instance's QueuedRunCoordinator (the
default coordinator) to every run the daemon launches (schedule, UI). A run
whose process was killed keeps its pool slot until something marks it ended;
under `dagster dev` the daemon's run monitoring does that
(`free_slots_after_run_end_seconds`), but the CLI runs without a daemon, so it
reaps its own dead runs first: runs it started (tagged with host and pid)
whose process no longer exists are marked failed and their slots freed.

The instance is a `DunningInstance` (`instance_class:` in the dagster.yaml written here), whose SQLite storage
keeps its connections (`pipelines.instance.storage`); an earlier release's unchanged dagster.yaml is upgraded to it.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import socket
from pathlib import Path

import dagster as dg

from pipelines.instance import pool_wait  # noqa: F401 - a run waiting for its pool slot sleeps, not spins
from pipelines.instance.compute_logs import FileComputeLogManager
from pipelines.instance.storage import DunningInstance, KeptEventLogStorage, KeptScriptDirectory

# the dagster.yaml names the first
__all__ = ["DunningInstance", "FileComputeLogManager", "KeptEventLogStorage", "KeptScriptDirectory"]

DAGSTER_YAML = """\
# Written by `dunning` on first use. See README "Running it for real" for production settings.
instance_class:
  module: pipelines.instance
  class: DunningInstance
telemetry:
  enabled: false
nux:
  enabled: false
run_monitoring:
  enabled: true
  free_slots_after_run_end_seconds: 300
concurrency:
  pools:
    default_limit: 1
  runs:
    tag_concurrency_limits:
      - key: dunning/shard
        value:
          applyLimitPerUniqueValue: true
        limit: 1
"""


# what earlier releases wrote: replaced by DAGSTER_YAML when found unchanged
EARLIER_DAGSTER_YAML = DAGSTER_YAML.replace(
    "instance_class:\n  module: pipelines.instance\n  class: DunningInstance\n", ""
)


PID_TAG, HOST_TAG = "dunning/pid", "dunning/host"
LIVE_STATUSES = (
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.QUEUED,
)


def owner_tags() -> dict[str, str]:
    return {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname()}


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_dead_runs(instance: dg.DagsterInstance) -> list[str]:
    """Mark runs started by a dead `dunning` process on this host as failed, freeing their pool slots."""
    reaped = []
    host = socket.gethostname()
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=list(LIVE_STATUSES), tags={HOST_TAG: host})):
        pid = run.tags.get(PID_TAG)
        if pid and pid.isdigit() and int(pid) != os.getpid() and not _process_alive(int(pid)):
            instance.report_run_failed(
                run,
                f"the dunning process {pid} on {host} ended without finishing this run "
                f"(killed, or it could not record the end: see its last step's log)",
            )
            instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
            reaped.append(run.run_id)
    return reaped


def last_own_run(
    instance: dg.DagsterInstance, since: dt.datetime | None = None
) -> tuple[dg.DagsterRun, str | None] | None:
    """The newest run this process started (after `since`) and the step it was in, if it stopped inside one.

    Best effort, for naming them in an error: the instance's storage may be what
    failed (a full disk), so any error reading it gives None, or no step."""
    try:
        runs = instance.get_runs(filters=dg.RunsFilter(tags=owner_tags(), created_after=since), limit=1)
    except Exception:  # noqa: BLE001 - the storage we are reporting on may be unreadable
        return None
    if not runs:
        return None
    open_steps: dict[str, None] = {}
    try:
        for record in instance.all_logs(runs[0].run_id):  # in-process executor: one step at a time
            event = record.dagster_event
            if event is None or not event.step_key:
                continue
            if event.is_step_start:
                open_steps[event.step_key] = None
            elif event.is_step_success or event.is_step_failure or event.is_step_skipped:
                open_steps.pop(event.step_key, None)
    except Exception:  # noqa: BLE001
        open_steps.clear()
    return runs[0], next(reversed(open_steps), None)


def runs_written_since(home: Path, since: dt.datetime) -> list[str]:
    """Ids of the runs whose own event log file (Dagster's SQLite layout: HOME/dagster/history/runs/<run id>.db,
    or its write-ahead log `.db-wal`, where a kept connection's commits stay until a checkpoint) was written since
    `since`. Names a run when its storage can no longer be read at all (on a full disk SQLite cannot even map its
    WAL index, so reads fail too)."""
    try:
        written = {
            f.name.split(".db", 1)[0]
            for f in (dagster_home(home) / "history" / "runs").glob("*-*-*-*-*.db*")
            if f.name.endswith((".db", ".db-wal")) and f.stat().st_mtime >= since.timestamp()
        }
    except OSError:
        return []
    return sorted(written)


def end_run_failed(instance: dg.DagsterInstance, run: dg.DagsterRun, message: str) -> bool:
    """Mark this process's unfinished run failed with `message` and free its pool slots (best effort: the
    storage may refuse this too; then the next CLI reaps it); False when it could not."""
    if run.status not in LIVE_STATUSES:
        return False
    try:
        instance.report_run_failed(run, message)
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
    except Exception:  # noqa: BLE001
        return False
    return True


def set_pool_slots(instance: dg.DagsterInstance, pool: str, slots: int) -> None:
    """Give `pool` exactly `slots` slots on this instance (what `dagster instance concurrency set` does), only
    when it differs: an explicit limit overrides `default_limit`, so it is set every time, to 1 as well."""
    storage = instance.event_log_storage
    if storage.get_concurrency_info(pool).slot_count != slots:
        storage.set_concurrency_slots(pool, slots)


def dagster_home(home: Path) -> Path:
    return home / "dagster"


def get_instance(home: Path) -> dg.DagsterInstance:
    """The instance at HOME/dagster, created and migrated once, under a lock."""
    directory = dagster_home(home)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".init.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        config = directory / "dagster.yaml"
        if not config.exists() or config.read_text() == EARLIER_DAGSTER_YAML:
            config.write_text(DAGSTER_YAML)
        os.environ["DAGSTER_HOME"] = str(directory)
        instance = dg.DagsterInstance.get()
        instance.get_runs(limit=1)  # forces storage creation/migration while we hold the lock
        reap_dead_runs(instance)
    return instance

"""The Dagster instance under the deployment's home, so every CLI run shows in the UI.

A brand-new SQLite instance migrates its storage on first use; two processes
doing that at once can crash ("alembic_version has more than one head"), so
the first use happens under an exclusive file lock.

The instance limits the `dunning_ledger` pool to one step at a time. A run
whose process was killed keeps its pool slot until something marks it ended;
under `dagster dev` the daemon's run monitoring does that
(`free_slots_after_run_end_seconds`), but the CLI runs without a daemon, so it
reaps its own dead runs first: runs it started (tagged with host and pid)
whose process no longer exists are marked failed and their slots freed.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

import dagster as dg

DAGSTER_YAML = """\
# Written by `dunning` on first use. See README "Running it for real" for production settings.
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
"""


PID_TAG, HOST_TAG = "dunning/pid", "dunning/host"
LIVE_STATUSES = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.NOT_STARTED,
                 dg.DagsterRunStatus.QUEUED)


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
            instance.report_run_failed(run, f"the dunning process {pid} on {host} ended without finishing this run (killed?)")
            instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
            reaped.append(run.run_id)
    return reaped


def dagster_home(home: Path) -> Path:
    return home / "dagster"


def get_instance(home: Path) -> dg.DagsterInstance:
    """The instance at HOME/dagster, created and migrated once, under a lock."""
    directory = dagster_home(home)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".init.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        config = directory / "dagster.yaml"
        if not config.exists():
            config.write_text(DAGSTER_YAML)
        os.environ["DAGSTER_HOME"] = str(directory)
        instance = dg.DagsterInstance.get()
        instance.get_runs(limit=1)  # forces storage creation/migration while we hold the lock
        reap_dead_runs(instance)
    return instance

"""The Dagster instance under the deployment's home, so every CLI run shows in the UI.

A brand-new SQLite instance migrates its storage on first use; two processes
doing that at once can crash ("alembic_version has more than one head"), so
the first use happens under an exclusive file lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import dagster as dg

DAGSTER_YAML = """\
# Written by `dunning` on first use. See README "Running it for real" for production settings.
telemetry:
  enabled: false
run_monitoring:
  enabled: true
  free_slots_after_run_end_seconds: 300
concurrency:
  pools:
    default_limit: 1
"""


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
    return instance

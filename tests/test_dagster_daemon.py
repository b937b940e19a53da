"""The sharded job through Dagster's own scheduling: the daemon's run queue on a PostgreSQL instance.

This is the deployment of `deploy/dagster.yaml`, used verbatim: the instance
(runs, events, pool slots) in one PostgreSQL database, the ledger in another,
`dagster-daemon` dequeuing runs and launching each in its own process. Runs
are submitted with `dagster job launch`, as an operator or the schedule would;
two runs of one shard must queue behind each other (the `dunning/shard` tag
limit), and every key is sent exactly once across all of them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import psycopg
import pytest

from tests.conftest import write_snapshot
from tests.helpers import customers

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
AS_OF = "2026-11-05T09:00:00+00:00"
TERMINAL = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)


def _instance_env(tmp_path: Path, instance_dsn: str, ledger_dsn: str) -> dict[str, str]:
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.yaml", dagster_home / "dagster.yaml")
    rest = instance_dsn.split("://", 1)[1]
    user, rest = rest.split("@", 1)
    host_port, db_name = rest.split("/", 1)
    host, port = host_port.split(":")
    env = {k: v for k, v in os.environ.items() if k not in ("DUNNING_HOME",)}
    env.update(
        DAGSTER_HOME=str(dagster_home), DAGSTER_PG_HOST=host, DAGSTER_PG_PORT=port, DAGSTER_PG_USER=user,
        DAGSTER_PG_PASSWORD="", DAGSTER_PG_DB=db_name, DUNNING_POSTGRES_DSN=ledger_dsn,
    )  # fmt: skip
    return env


def _launch(env: dict[str, str], home: Path, config: Path, snapshot: Path, shard: str) -> None:
    run_config = {
        "resources": {
            "dunning_home": {"config": {"home": str(home), "config_path": str(config)}},
            "cycle_request": {"config": {"snapshot_path": str(snapshot), "as_of": AS_OF, "shard": shard}},
        }
    }
    tags = {"dunning/shard": shard, "dagster/partition": AS_OF[:10], "dunning/trigger": "test"}
    launched = subprocess.run(
        [str(BIN / "dagster"), "job", "launch", "-w", str(REPO / "workspace.yaml"), "-j", "dunning_cycle",
         "--config-json", json.dumps(run_config), "--tags", json.dumps(tags)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr[-3000:]


def _wait_for_runs(instance: dg.DagsterInstance, count: int, deadline_seconds: float) -> list[dg.DagsterRun]:
    deadline = time.monotonic() + deadline_seconds
    while True:
        runs = instance.get_runs()
        if len(runs) >= count and all(r.status in TERMINAL for r in runs):
            return runs
        if time.monotonic() > deadline:
            raise AssertionError(f"runs not finished in {deadline_seconds}s: {[(r.run_id, r.status) for r in runs]}")
        time.sleep(0.5)  # polling the instance for the daemon's progress, not waiting for a fixed time


@pytest.mark.slow
def test_sharded_runs_queued_by_the_daemon_send_each_key_once(tmp_path, postgres_cluster, monkeypatch):
    env = _instance_env(tmp_path, postgres_cluster.fresh_database("dagster"), postgres_cluster.fresh_database("ledger"))
    for name in ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD", "DAGSTER_PG_DB"):
        monkeypatch.setenv(name, env[name])  # the instance read back here resolves the same variables
    migrated = subprocess.run([str(BIN / "dagster"), "instance", "migrate"], env=env, capture_output=True, text=True)
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    home = tmp_path / "home"
    env["DUNNING_HOME"] = str(home)  # the code location's resources read it, as in production
    config = tmp_path / "config.yaml"
    config.write_text("ledger:\n  kind: postgres\nshards: 2\n")
    rows = customers(12)
    snapshot = write_snapshot(tmp_path / "snapshot.csv", rows)

    daemon = subprocess.Popen(
        [str(BIN / "dagster-daemon"), "run", "-w", str(REPO / "workspace.yaml")],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for shard in ("0/2", "1/2", "0/2"):  # shard 0 twice: the second run must queue, then find nothing new
            _launch(env, home, config, snapshot, shard)
        with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
            runs = _wait_for_runs(instance, 3, deadline_seconds=240)
            records = {r.dagster_run.run_id: r for r in instance.get_run_records()}
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    assert [r.status for r in runs] == [dg.DagsterRunStatus.SUCCESS] * 3
    first, second = sorted(
        (records[r.run_id] for r in runs if r.tags["dunning/shard"] == "0/2"), key=lambda r: r.start_time or 0
    )
    assert first.end_time is not None and second.start_time is not None
    assert second.start_time >= first.end_time, "two runs of one shard ran at the same time"

    with psycopg.connect(env["DUNNING_POSTGRES_DSN"]) as con:
        sent = con.execute(
            "SELECT idempotency_key, count(*) FROM reminder_ledger WHERE status = 'sent' GROUP BY 1"
        ).fetchall()
    assert sorted(k for k, _ in sent) == sorted(f"dunning:in_{i}:1:day3" for i in range(12))
    assert all(n == 1 for _, n in sent)
    assert len(list((home / "outbox").glob("*.eml"))) == 12

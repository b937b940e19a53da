"""The real Dagster webserver on this workspace: the graph, checks, schedule, sensors, and a CLI run are there."""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import Deployment, invoice
from tests.smtp_server import free_port

ROOT = Path(__file__).resolve().parents[1]
WEBSERVER = shutil.which("dagster-webserver", path=str(Path(sys.executable).parent))

QUERY = """
{
  assetNodes { assetKey { path } dependencyKeys { path } isPartitioned
               assetChecksOrError { ... on AssetChecks { checks { name blocking } } } }
  repositoriesOrError { ... on RepositoryConnection { nodes { name schedules { name } sensors { name } } } }
  runsOrError { ... on Runs { results { runId jobName status tags { key value } } } }
}
"""


def graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture
def webserver(tmp_path):
    deployment = Deployment(tmp_path)
    code, _, err = deployment.run([invoice()], "2026-11-05T09:00:00Z")
    assert code == 0, err
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(deployment.home / "dagster"), "DUNNING_HOME": str(deployment.home)}
    process = subprocess.Popen(
        [WEBSERVER, "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                data = graphql(port, QUERY)["data"]
                if data["repositoriesOrError"].get("nodes"):
                    break
            except (OSError, KeyError, TypeError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"webserver did not come up: {process.stderr.read() if process.poll() is not None else 'timeout'}"
                )
            time.sleep(0.5)
        yield data
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.slow
def test_the_ui_shows_the_graph_checks_schedule_sensors_and_cli_runs(webserver):
    nodes = {"/".join(n["assetKey"]["path"]): n for n in webserver["assetNodes"]}
    assert set(nodes) == {
        "ingested_snapshot",
        "invoice_snapshot",
        "billing_events",
        "reminders_due",
        "send_batch",
        "dunning_audit",
        "analyst_history",
        "retention_sweep",
    }
    deps = {k: {"/".join(d["path"]) for d in n["dependencyKeys"]} for k, n in nodes.items()}
    assert deps["reminders_due"] == {"invoice_snapshot", "billing_events"}
    assert deps["send_batch"] == {"reminders_due"}
    assert deps["dunning_audit"] == {"invoice_snapshot", "reminders_due", "send_batch"}
    assert deps["analyst_history"] == {"dunning_audit"}
    assert deps["retention_sweep"] == {"billing_events"}, "pruning waits on nothing that sends"
    assert deps["invoice_snapshot"] == {"ingested_snapshot"}, "the lineage shows ingest -> shards"
    assert all(n["isPartitioned"] for n in nodes.values())
    checks = {c["name"]: c["blocking"] for c in nodes["reminders_due"]["assetChecksOrError"]["checks"]}
    assert checks == {"reminders_due_are_sound": True, "circuit_breaker": True}
    [repository] = webserver["repositoriesOrError"]["nodes"]
    assert {s["name"] for s in repository["schedules"]} == {"hourly_dunning", "hourly_ingest"}
    assert {s["name"] for s in repository["sensors"]} == {
        "page_on_run_failure",
        "landing_snapshots",
        "dead_mans_switch",
        "stripe_events",
        "feedback_files_landed",
        "shards_after_ingest",
    }
    runs = webserver["runsOrError"]["results"]
    assert len(runs) == 1 and runs[0]["jobName"] == "dunning_cycle" and runs[0]["status"] == "SUCCESS"
    tags = {t["key"]: t["value"] for t in runs[0]["tags"]}
    assert tags["dunning/trigger"] == "cli" and tags["dagster/partition"] == "2026-11-05"

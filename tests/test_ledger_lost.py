"""The ledger lost in the middle of a send: nothing more leaves, one line says what became of the claimed keys.

A PostgreSQL server of its own (Debian's binaries), stopped with `-m immediate` while the run hands emails to a
slow SMTP server, then started again.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.conftest import Deployment, write_snapshot
from tests.helpers import DUNNING, customers
from tests.postgres_server import start_cluster
from tests.smtp_server import ScriptedHandler, SmtpServer

AS_OF = "2026-11-05T09:00:00Z"
pytestmark = pytest.mark.slow


@pytest.fixture
def own_cluster():
    cluster = start_cluster()
    if cluster is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine: apt-get install postgresql")
    try:
        yield cluster
    finally:
        cluster.stop()


def run(home, snapshot, config, env, as_of=AS_OF, **popen):
    command = [DUNNING, "--home", str(home), "run", "--snapshot", str(snapshot), "--as-of", as_of, "--config", config]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **popen)


def test_a_ledger_stopped_mid_send_stops_the_sending_with_exit_4_and_the_next_run_sends_nothing_twice(
    tmp_path, own_cluster, monkeypatch
):
    env = {**os.environ, "DUNNING_POSTGRES_DSN": own_cluster.fresh_database()}
    snapshot = write_snapshot(tmp_path / "s.csv", customers(40))
    home = tmp_path / "home"
    handler = ScriptedHandler(delay_seconds=0.1)
    with SmtpServer(handler) as server:
        config = tmp_path / "pg.yaml"
        config.write_text(
            "ledger: {kind: postgres}\nclaim_chunk_size: 5\n"
            f"provider: {{kind: smtp, host: 127.0.0.1, port: {server.port}, connections: 1, from: b@example.com}}\n"
        )
        process = run(home, snapshot, str(config), env)
        deadline = time.monotonic() + 120
        while len(handler.received) < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        own_cluster.halt()
        at_halt = len(handler.received)
        out, err = process.communicate(timeout=120)
        delivered_first = handler.keys()
    assert process.returncode == 4, (out, err)
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.strip()]
    assert "the PostgreSQL ledger named by $DUNNING_POSTGRES_DSN failed while sending" in line, line
    assert "nothing more was handed over" in line and "key(s) may have gone" in line and "`dunning run`" in line
    assert len(delivered_first) <= at_halt + 5 + 1, "at most the chunk in hand when the ledger went"
    assert len(delivered_first) < 40

    monkeypatch.setenv("DUNNING_POSTGRES_DSN", env["DUNNING_POSTGRES_DSN"])
    deployment = Deployment(tmp_path)  # its home is `home`: the rest runs in this process, through the same command
    code, out, err = deployment.cli("status", "--json", "--config", str(config))
    assert code == 4 and "Traceback" not in err  # the ledger is down: status says so, with the last failure
    assert json.loads(out)["last_failure"]["exit_code"] == 4

    own_cluster.resume()
    code, out, err = deployment.cli("status", "--json", "--config", str(config))
    assert code == 0, err
    failure = json.loads(out)["last_failure"]
    assert failure["exit_code"] == 4 and "failed while sending" in failure["message"]

    healthy = ScriptedHandler()
    with SmtpServer(healthy) as server:
        config.write_text(config.read_text().replace(str(handler_port(config)), str(server.port)))
        for as_of in ("2026-11-05T10:00:00Z", "2026-11-05T12:00:00Z"):
            code, _, err = deployment.cli("run", "--snapshot", str(snapshot), "--as-of", as_of, "--config", str(config))
            assert code == 0, err
    assert not set(healthy.keys()) & set(delivered_first), "nothing delivered twice"
    assert len(set(healthy.keys()) | set(delivered_first)) >= 40 - 6, "the rest went, bar what waits for a human"


def handler_port(config) -> int:
    return int(config.read_text().split("port: ")[1].split(",")[0])

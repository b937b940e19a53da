"""Shared helpers: snapshots written as real files, the real CLI run in-process, the real DuckDB file read back."""

from __future__ import annotations

import contextlib
import email
import io
import json
import threading
from email import policy
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import duckdb
import polars as pl
import pytest

from pipelines import cli
from tests.in_process import InProcessCycle, run_cycle

# what each test costs (`DUNNING_TEST_TIMES=FILE`); Dagster's migration scripts parsed once per process
pytest_plugins = ["tests.timing", "pytester"]

INVOICE_DEFAULTS = {
    "invoice_id": "in_1",
    "customer_id": "cus_1",
    "customer_email": "ada@example.com",
    "currency": "USD",
    "amount_due": 10000,
    "amount_paid": 0,
    "due_date": "2026-11-01",
    "status": "open",
    "customer_name": "Ada",
}


def invoice(**overrides) -> dict:
    row = dict(INVOICE_DEFAULTS)
    row.update(overrides)
    return row


def write_snapshot(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pl.DataFrame([{k: (None if v is None else str(v)) for k, v in r.items()} for r in rows])
    if path.suffix == ".parquet":
        frame.write_parquet(path)
    else:
        frame.write_csv(path)
    return path


class Deployment:
    """One dunning home directory driven through the `dunning` command."""

    def __init__(self, root: Path):
        self.root = root
        self.home = root / "home"
        self._snapshots = 0

    def snapshot(self, rows: list[dict], suffix: str = ".csv") -> Path:
        self._snapshots += 1
        return write_snapshot(self.root / f"snapshot-{self._snapshots}{suffix}", rows)

    def cli(self, *args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["--home", str(self.home), *args])
        return code, out.getvalue(), err.getvalue()

    def run(self, rows: list[dict], as_of: str, *extra: str) -> tuple[int, str, str]:
        return self.cli("run", "--snapshot", str(self.snapshot(rows)), "--as-of", as_of, *extra)

    def run_in_process(
        self, rows: list[dict], as_of: str, config: str | Path | None = None, events: Path | None = None
    ) -> InProcessCycle:
        """The same cycle as `run`, composed from `dunning.run.steps` without Dagster (`tests/in_process.py`)."""
        return run_cycle(self.home, self.snapshot(rows), as_of, config, events)

    def query(self, sql: str, params: list | None = None) -> list[tuple]:
        con = duckdb.connect(str(self.home / "dunning.duckdb"), read_only=True)
        try:
            return con.execute(sql, params or []).fetchall()
        finally:
            con.close()

    def ledger(self, where: str = "true") -> list[dict]:
        con = duckdb.connect(str(self.home / "dunning.duckdb"), read_only=True)
        try:
            return con.sql(f"SELECT * FROM reminder_ledger WHERE {where} ORDER BY idempotency_key").pl().to_dicts()
        finally:
            con.close()

    def latest_materialization(self, asset: str):
        """The newest materialization of `asset` in the home's Dagster instance."""
        import dagster as dg

        instance = dg.DagsterInstance.from_config(str(self.home / "dagster"))
        event = instance.get_latest_materialization_event(dg.AssetKey(asset))
        assert event is not None and event.asset_materialization is not None, f"{asset} was never materialized"
        return event.asset_materialization

    def outbox(self) -> list[email.message.EmailMessage]:
        directory = self.home / "outbox"
        # in the order written (a Message-ID, hence a file name, is an HMAC under the home's own secret: its order
        # says nothing), then by name for files of one instant
        files = (
            sorted(directory.glob("*.eml"), key=lambda f: (f.stat().st_mtime_ns, f.name)) if directory.exists() else []
        )
        return [email.message_from_bytes(f.read_bytes(), policy=policy.default) for f in files]


@pytest.fixture(autouse=True)
def _secrets_of_this_test_only():
    """The secrets a test's process remembers (`dunning.secret_env`) are forgotten after it: a test that planted
    one must not mask text in the next test run by the same worker."""
    from dunning import secret_env

    before = set(secret_env._KNOWN)
    yield
    secret_env._KNOWN.intersection_update(before)


SHARED_SECRET_ENV = "DUNNING_TEST_MESSAGE_SECRET"


@pytest.fixture
def shared_message_secret(monkeypatch) -> str:
    """Homes that must mint the same Message-IDs (shards against one run, a pool against none): one secret for all,
    as `message_secret_env` gives a deployment of several homes; the config line that names it."""
    monkeypatch.setenv(SHARED_SECRET_ENV, "one-secret-for-every-home-of-this-test")
    return f"message_secret_env: {SHARED_SECRET_ENV}\n"


@pytest.fixture
def deployment(tmp_path: Path) -> Deployment:
    return Deployment(tmp_path)


@pytest.fixture(scope="session")
def postgres_cluster():
    """One throwaway PostgreSQL cluster per test session (per xdist worker), stopped at the end."""
    from tests.postgres_server import start_cluster

    cluster = start_cluster()
    if cluster is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine: apt-get install postgresql")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def postgres_dsn(postgres_cluster) -> str:
    """A new, empty database on the session's cluster: its libpq URL."""
    return postgres_cluster.fresh_database()


class _Recorder(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.path, json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    """A local HTTP receiver for alert webhooks: its URL, and each POST's (path, JSON body) as it arrives."""
    _Recorder.received = []
    server = HTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", _Recorder.received
    server.shutdown()

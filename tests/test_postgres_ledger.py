"""The `dunning` command on a PostgreSQL ledger (`ledger: {kind: postgres}`), against a real throwaway server.

Each home's config names the ledger; the DSN is in `DUNNING_POSTGRES_DSN` and carries a password (the test
cluster trusts loopback connections, so any password works), which must never reach the operator's terminal.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import duckdb
import psycopg
import pytest

from tests.conftest import Deployment, invoice

PASSWORD = "pw-Zq8s!secret"
ENV = "DUNNING_POSTGRES_DSN"


def with_password(dsn: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{PASSWORD}@{parts.hostname}:{parts.port}"))


def postgres_home(root: Path, config: str = "ledger: {kind: postgres}\n") -> Deployment:
    deployment = Deployment(root)
    deployment.home.mkdir(parents=True, exist_ok=True)
    (deployment.home / "config.yaml").write_text(config)
    return deployment


@pytest.fixture
def shared_dsn(postgres_dsn, monkeypatch) -> str:
    dsn = with_password(postgres_dsn)
    monkeypatch.setenv(ENV, dsn)
    return dsn


def rows_of(dsn: str, sql: str) -> list[tuple]:
    with psycopg.connect(dsn) as con:
        return con.execute(sql).fetchall()


def assert_secret_kept(dsn: str, *texts: str) -> None:
    for text in texts:
        assert PASSWORD not in text and dsn not in text


ROWS = [
    invoice(invoice_id="in_1"),
    invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bob@example.com"),
    invoice(invoice_id="in_3", customer_id="cus_3", customer_email="cy@example.com", due_date="2026-10-20"),
]


@pytest.mark.slow
def test_two_runs_send_each_key_once_and_keep_nothing_in_the_home(tmp_path, shared_dsn):
    deployment = postgres_home(tmp_path / "a")
    code, out, err = deployment.run(ROWS, "2026-11-05T09:00:00Z")
    assert code == 0, err
    first = sorted(m["X-Dunning-Keys"] for m in deployment.outbox())
    assert first == ["dunning:in_1:1:day3", "dunning:in_2:1:day3", "dunning:in_3:1:day14"]
    code, out2, err2 = deployment.run(ROWS, "2026-11-05T10:00:00Z")
    assert code == 0, err2
    assert sorted(m["X-Dunning-Keys"] for m in deployment.outbox()) == first, "the second run sends nothing again"
    keys = rows_of(shared_dsn, "SELECT idempotency_key, count(*) FROM reminder_ledger WHERE status = 'sent' GROUP BY 1")
    assert sorted(keys) == [(k, 1) for k in first]
    runs = rows_of(shared_dsn, "SELECT count(*) FROM dunning_runs WHERE NOT dry_run")
    assert runs == [(2,)]
    assert not (deployment.home / "dunning.duckdb").exists(), "the ledger is in PostgreSQL, not in the home"

    code, status_out, status_err = deployment.cli("status", "--json")
    assert code == 0, status_err
    status = json.loads(status_out)
    assert status["ledger_counts"] == {"sent": 3, "skipped": 2} and status["paused"] is False  # in_3: day3, day7
    assert status["last_run"]["sent"] == 0, "the last live run found everything already sent"

    analytics = deployment.home / "analytics.duckdb"
    assert analytics.is_file()
    con = duckdb.connect(str(analytics), read_only=True)
    try:
        published = con.execute("SELECT count(*) FROM reminder_ledger WHERE status = 'sent'").fetchone()[0]
        contacts = con.execute("SELECT count(*) FROM contact_history").fetchone()[0]
    finally:
        con.close()
    assert published == 3 and contacts == 3
    assert not (deployment.home / "dunning.duckdb").exists(), "status and publication made no DuckDB ledger either"
    assert_secret_kept(shared_dsn, out, err, out2, err2, status_out, status_err)
    stored = [f for f in deployment.home.rglob("*") if f.is_file() and PASSWORD.encode() in f.read_bytes()]
    assert stored == [], "the DSN's password is in no file of the home (Dagster's run storage included)"
    tables = [t for (t,) in rows_of(shared_dsn, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
    assert "reminder_ledger" in tables
    for table in tables:
        assert rows_of(shared_dsn, f"SELECT count(*) FROM {table} t WHERE t::text LIKE '%{PASSWORD}%'") == [(0,)]


@pytest.mark.slow
def test_a_pause_from_one_home_stops_a_run_from_another_home_sharing_the_ledger(tmp_path, shared_dsn):
    operator, worker = postgres_home(tmp_path / "operator"), postgres_home(tmp_path / "worker")
    code, out, err = operator.cli("pause", "--reason", "shared ledger drill")
    assert code == 0, err
    code, out, err = worker.run(ROWS, "2026-11-05T09:00:00Z")
    assert code == 0, err
    assert "PAUSED" in out and "shared ledger drill" in out
    assert worker.outbox() == []
    assert rows_of(shared_dsn, "SELECT count(*) FROM reminder_ledger") == [(0,)]
    held = rows_of(shared_dsn, "SELECT DISTINCT outcome, reason FROM dunning_audit")
    assert held == [("held", "paused")]
    assert json.loads(worker.cli("status", "--json")[1])["paused"] is True
    assert_secret_kept(shared_dsn, out, err)


def test_a_missing_dsn_variable_is_one_line_naming_it(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    deployment = postgres_home(tmp_path)
    for args in (["status"], ["pause"]):
        code, out, err = deployment.cli(*args)
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1 and ENV in err and "Traceback" not in err
    code, _, err = deployment.run(ROWS, "2026-11-05T09:00:00Z")
    assert code == 2 and ENV in err and len(err.strip().splitlines()) == 1
    assert not (deployment.home / "dunning.duckdb").exists()


def test_a_dsn_pasted_into_the_config_is_refused_without_being_echoed(tmp_path, postgres_dsn):
    dsn = with_password(postgres_dsn)
    deployment = postgres_home(tmp_path, f"ledger: {{kind: postgres, dsn_env: '{dsn}'}}\n")
    code, out, err = deployment.cli("status")
    assert code == 2 and "ledger.dsn_env" in err
    code2, out2, err2 = deployment.run(ROWS, "2026-11-05T09:00:00Z")
    assert code2 == 2 and "ledger.dsn_env" in err2
    assert_secret_kept(dsn, out, err, out2, err2)


def test_an_unreachable_server_is_one_line_without_the_dsn(tmp_path, monkeypatch, postgres_dsn):
    parts = urlsplit(postgres_dsn)
    dsn = urlunsplit(parts._replace(netloc=f"{parts.username}:{PASSWORD}@127.0.0.1:1"))  # nothing listens on port 1
    monkeypatch.setenv(ENV, dsn)
    deployment = postgres_home(tmp_path)
    code, out, err = deployment.cli("status")
    assert code == 4, err
    assert len(err.strip().splitlines()) == 1 and f"${ENV}" in err and "Traceback" not in err
    assert_secret_kept(dsn, out, err)

"""PostgreSQL roles: a migrating role owns the schema, a least-privilege worker role runs the cycles.

The roles the docs recommend (docs: security, "PostgreSQL roles"), created here on a throwaway server: the
owner migrates the ledger once; the worker, without CREATE on the database or the schema, runs every command a
worker runs against the migrated ledger, and cannot change the schema.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from dunning.ledger.backends.pg_ledger import open_postgres_ledger
from tests.conftest import invoice
from tests.test_postgres_ledger import postgres_home

WORKER_GRANTS = """
CREATE ROLE {worker} LOGIN;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
REVOKE CREATE ON DATABASE "{database}" FROM PUBLIC;
GRANT CONNECT, TEMPORARY ON DATABASE "{database}" TO {worker};
GRANT USAGE ON SCHEMA public TO {worker};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {worker};
"""


def as_role(dsn: str, role: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))


@pytest.mark.slow
def test_a_worker_without_create_runs_cycles_on_a_ledger_its_owner_migrated(tmp_path, postgres_dsn, monkeypatch):
    database = urlsplit(postgres_dsn).path.lstrip("/")
    worker = f"worker_{database[-8:]}"
    with open_postgres_ledger(postgres_dsn, "$OWNER_DSN"):  # the migrating role creates and migrates the schema
        pass
    with psycopg.connect(postgres_dsn, autocommit=True) as con:
        for statement in WORKER_GRANTS.format(worker=worker, database=database).split(";"):
            if statement.strip():
                con.execute(statement)
    worker_dsn = as_role(postgres_dsn, worker)
    with psycopg.connect(worker_dsn) as con, pytest.raises(psycopg.errors.InsufficientPrivilege):
        con.execute("CREATE TABLE not_allowed (x int)")
    monkeypatch.setenv("DUNNING_POSTGRES_DSN", worker_dsn)
    deployment = postgres_home(tmp_path)
    rows = [invoice(), invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bo@example.com")]
    code, out, err = deployment.run(rows, "2026-11-05T09:00:00Z")
    assert code == 0, err
    assert "sent: 2 reminder key(s)" in out
    assert deployment.run(rows, "2026-11-05T10:00:00Z")[0] == 0
    for command in (["pause", "--reason", "check"], ["status"], ["exclude", "--customer", "cus_2"]):
        assert deployment.cli(*command)[0] == 0, command
    with psycopg.connect(worker_dsn) as con:
        assert con.execute("SELECT count(*) FROM reminder_ledger WHERE status = 'sent'").fetchone() == (2,)


@pytest.mark.slow
def test_a_worker_on_a_ledger_that_needs_migrating_is_told_to_run_it_as_the_owner(tmp_path, postgres_dsn, monkeypatch):
    database = urlsplit(postgres_dsn).path.lstrip("/")
    worker = f"fresh_{database[-8:]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as con:
        for statement in WORKER_GRANTS.format(worker=worker, database=database).split(";"):
            if statement.strip():
                con.execute(statement)
    monkeypatch.setenv("DUNNING_POSTGRES_DSN", as_role(postgres_dsn, worker))
    code, _, err = postgres_home(tmp_path).cli("status")
    assert code == 2 and "needs schema migrations this role may not run" in err and "Traceback" not in err

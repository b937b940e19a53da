"""The ledger tests' two databases: `backend` opens a fresh DuckDB file or a fresh PostgreSQL database.

Import the fixture into a test module (`from tests.ledger_backends import backend_fixture`) and every test that takes it
runs once per backend; the PostgreSQL runs use the session's throwaway cluster (`postgres_dsn` in conftest).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
from psycopg import errors as pg_errors

from dunning.ledger.backends.duckdb_ledger import DuckDBLedger, open_ledger
from dunning.ledger.backends.pg_ledger import PostgresLedger, open_postgres_ledger

BACKENDS = ("duckdb", "postgres")


@dataclass
class Backend:
    kind: str
    path: Path | None = None  # the DuckDB file
    dsn: str | None = None  # the PostgreSQL database

    @property
    def duplicate_error(self) -> type[BaseException]:
        return duckdb.ConstraintException if self.kind == "duckdb" else pg_errors.UniqueViolation

    def open(self, timeout_seconds: float = 30.0) -> contextlib.AbstractContextManager[DuckDBLedger | PostgresLedger]:
        """The ledger; opened again inside, a second writer on it: on DuckDB a connection of its own to the file
        this process already holds (one process at a time holds a DuckDB file), on PostgreSQL a session of its own."""
        if self.kind == "duckdb":
            assert self.path is not None
            return open_ledger(self.path, timeout_seconds)
        assert self.dsn is not None
        return open_postgres_ledger(self.dsn, "$TEST_DSN", timeout_seconds)


@pytest.fixture(params=BACKENDS, name="backend")
def backend_fixture(request, tmp_path) -> Backend:
    if request.param == "duckdb":
        return Backend("duckdb", path=tmp_path / "d.duckdb")
    return Backend("postgres", dsn=request.getfixturevalue("postgres_dsn"))

"""The ledger on PostgreSQL: the same tables and methods as on DuckDB (`duckdb_ledger.LedgerTables`), on a
psycopg connection (`pg_connection`), so several homes and workers can share one ledger.

Publication for analysts reads each published table out of PostgreSQL into an
in-memory DuckDB database with the ledger's DuckDB schema, and runs the same
`analytics.publish` on it: the Parquet files and `analytics.duckdb` look
exactly as they do for a DuckDB ledger.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import duckdb

from dunning.analytics import PUBLISHED_TABLES, publish
from dunning.ledger.connection import LedgerConnection
from dunning.ledger.duckdb_ledger import LedgerTables
from dunning.ledger.pg_connection import PgConnection, connect_pg
from dunning.ledger.pg_schema import migrate_pg
from dunning.ledger.sql import quote_identifier


class PostgresLedger(LedgerTables, PgConnection):
    """The ledger on a PostgreSQL database."""

    def publish(self, home: Path) -> dict[str, int]:
        """The analysts' copy under `home`, made by DuckDB from a copy of the published tables."""
        copy = duckdb.connect(":memory:")
        try:
            LedgerConnection.prepare(copy)  # the ledger's DuckDB schema: the same column types as a DuckDB ledger
            for table in PUBLISHED_TABLES:
                rows = self.frame(f"SELECT * FROM {quote_identifier(table)}")
                if rows.is_empty():
                    continue
                names = ", ".join(quote_identifier(c) for c in rows.columns)
                copy.register("published_rows", rows.to_arrow())
                copy.execute(f"INSERT INTO {quote_identifier(table)} ({names}) SELECT {names} FROM published_rows")
                copy.unregister("published_rows")
            return publish(copy, home)
        finally:
            copy.close()


@contextlib.contextmanager
def open_postgres_ledger(dsn: str, source: str, timeout_seconds: float = 120.0) -> Iterator[PostgresLedger]:
    """The ledger in the database at `dsn` (its schema created or migrated if needed); `source` names the DSN in
    messages (the environment variable it came from), never the DSN itself."""
    raw = connect_pg(dsn, timeout_seconds, source)
    try:
        ledger = PostgresLedger(raw)
        migrate_pg(ledger.con, source, timeout_seconds)
        yield ledger
    finally:
        raw.close()

"""The ledger on PostgreSQL: the same tables and methods as on DuckDB (`duckdb_ledger.LedgerTables`), on a
psycopg connection (`pg_connection`), so several homes and workers can share one ledger.

Publication for analysts reads each published table out of PostgreSQL into an
in-memory DuckDB database with the ledger's DuckDB schema, and runs the same
`analytics.publish` on it: the Parquet files and `analytics.duckdb` look
exactly as they do for a DuckDB ledger. The rows travel as PostgreSQL's CSV
(`COPY ... TO STDOUT`), staged in a file under the home and read by DuckDB's
CSV reader with the ledger's column types: a million history rows in about 3
s, where turning each into Python values (`frame`) took 20. Of the tables
published by day, only the days whose rows changed since the last publication
are copied: their fingerprints are counted in PostgreSQL first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import tempfile
from collections.abc import Collection, Iterator
from pathlib import Path

import duckdb

from dunning.ledger.backends.connection import LedgerConnection
from dunning.ledger.backends.duckdb_ledger import LedgerTables
from dunning.ledger.backends.pg_connection import ROW_VERSIONS_DIGEST, PgConnection, connect_pg
from dunning.ledger.backends.publication import (
    PARTITIONED_TABLES,
    PUBLISHED_TABLES,
    UNDATED,
    changed_days,
    day_fingerprints,
    publish,
    to_republish,
)
from dunning.ledger.schema.pg_schema import migrate_pg
from dunning.ledger.sql import quote_identifier, sql_string


class PostgresLedger(LedgerTables, PgConnection):
    """The ledger on a PostgreSQL database."""

    def publish(self, home: Path, only: Collection[str] | None = None) -> dict[str, int]:
        """The analysts' copy under `home`, made by DuckDB from a copy of the published tables: of a table
        published by day, only the rows of the days that changed since the last publication (a year of history
        is not copied every hour to rewrite one day); `only`: of those tables (and any never published)."""
        copy = duckdb.connect(":memory:")
        home.mkdir(parents=True, exist_ok=True)
        fingerprints: dict[str, dict[str, str]] = {}
        tables = to_republish(home, only)
        try:
            LedgerConnection.prepare(copy)  # the ledger's DuckDB schema: the same column types as a DuckDB ledger
            with tempfile.TemporaryDirectory(dir=home, prefix=".publication-") as staging:
                for table in PUBLISHED_TABLES:
                    if table not in tables:
                        continue
                    rows = RowFilter()
                    if table in PARTITIONED_TABLES:
                        fingerprints[table] = self._day_fingerprints(table, PARTITIONED_TABLES[table])
                        changed = changed_days(home / "analytics" / table, fingerprints[table])
                        rows = RowFilter.of_days(PARTITIONED_TABLES[table], changed)
                    self._copy_table(copy, table, Path(staging) / f"{table}.csv", rows)
            return publish(copy, home, fingerprints, only=tables)
        finally:
            copy.close()

    def _day_fingerprints(self, table: str, day: str) -> dict[str, str]:
        """Per day of `table`: its row count and `ROW_VERSIONS_DIGEST` (as `table_digest_sql`), so any change to a
        day changes its fingerprint; marked `pg`, so a home that moves from a DuckDB ledger republishes every day
        once."""
        sql = f"SELECT {day} AS day, count(*), 'pg' || {ROW_VERSIONS_DIGEST} FROM {quote_identifier(table)} GROUP BY 1"
        return day_fingerprints(self.con.execute(sql).fetchall())

    def _copy_table(self, copy: duckdb.DuckDBPyConnection, table: str, staged: Path, rows: RowFilter) -> None:
        """`table`'s rows (those `rows` keeps) into the same table of `copy`, by way of a CSV file (PostgreSQL
        writes NULL as an empty field and an empty string as `""`, which DuckDB keeps apart with
        `allow_quoted_nulls = false`)."""
        if rows.keeps_none:
            return
        columns = copy.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ? "
            "ORDER BY ordinal_position",
            [table],
        ).fetchall()
        names = ", ".join(quote_identifier(name) for name, _ in columns)
        query = f"COPY (SELECT {names} FROM {quote_identifier(table)} WHERE {rows.where}) TO STDOUT (FORMAT csv)"
        with open(staged, "wb") as out, self.raw.cursor().copy(query, rows.params or None) as stream:
            for chunk in stream:
                out.write(chunk)
        if not staged.stat().st_size:
            return
        types = ", ".join(f"{sql_string(name)}: {sql_string(kind)}" for name, kind in columns)
        copy.execute(
            f"INSERT INTO {quote_identifier(table)} ({names}) SELECT {names} FROM read_csv(?, header = false, "
            f"auto_detect = false, allow_quoted_nulls = false, quote = '\"', escape = '\"', nullstr = '', "
            f"columns = {{{types}}})",
            [str(staged)],
        )


@dataclasses.dataclass(frozen=True)
class RowFilter:
    """Which rows of a table publication copies: all of them, or those of some days (a WHERE clause with psycopg
    parameters)."""

    where: str = "TRUE"
    params: tuple[object, ...] = ()
    keeps_none: bool = False

    @classmethod
    def of_days(cls, day: str, days: list[str]) -> RowFilter:
        """The rows whose `day` expression is one of `days` (ISO dates, or `UNDATED` for rows without a day)."""
        dated = [dt.date.fromisoformat(d) for d in days if d != UNDATED]
        if not dated and UNDATED not in days:
            return cls(keeps_none=True)
        return cls(f"({day} = ANY(%s::date[]) OR ({day} IS NULL AND %s))", (dated, UNDATED in days))


@contextlib.contextmanager
def open_postgres_ledger(dsn: str, source: str, timeout_seconds: float = 120.0) -> Iterator[PostgresLedger]:
    """The ledger in the database at `dsn` (its schema created or migrated if needed); `source` names the DSN in
    messages (the environment variable it came from), never the DSN itself."""
    raw = connect_pg(dsn, timeout_seconds, source)
    try:
        ledger = PostgresLedger(raw)
        ledger.label = f"the PostgreSQL ledger named by {source}"
        migrate_pg(ledger.con, source, timeout_seconds)
        yield ledger
    finally:
        raw.close()

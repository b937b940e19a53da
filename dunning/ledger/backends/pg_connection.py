"""The ledger's connection on PostgreSQL (psycopg 3), with the API the DuckDB one has.

The mixins' SQL is written with `?` placeholders; here they become psycopg's
`%s` (and a literal `%` is doubled), outside quoted text and comments. The
connection runs in autocommit mode so `transaction()` issues the same
BEGIN/COMMIT/ROLLBACK as on DuckDB. `frame()` builds polars frames with the
dtypes DuckDB gives for the same columns, from the type OIDs of the result;
`registered()` copies a frame into a TEMP table (CSV COPY) and drops it after.

The DSN is a secret (it may hold a password): it is never put in a message.
What names the server in errors is the environment variable it came from.
"""

from __future__ import annotations

import contextlib
import functools
import re
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import polars as pl
import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from dunning.errors import LedgerBusy, UserInputError
from dunning.ledger.sql import PROBE_INSERT, SqlConnection, quote_identifier


class LedgerUnavailable(LedgerBusy):
    """The PostgreSQL ledger could not be reached (a server down or refusing us): nothing was done; try again."""


# result type OID -> the polars dtype DuckDB gives the same column
PG_DTYPES: dict[int, pl.DataType] = {
    16: pl.Boolean(),
    21: pl.Int16(),
    23: pl.Int32(),
    20: pl.Int64(),
    700: pl.Float32(),
    701: pl.Float64(),
    25: pl.String(),
    1043: pl.String(),
    1042: pl.String(),
    19: pl.String(),
    705: pl.String(),
    1082: pl.Date(),
    1114: pl.Datetime("us"),
    1184: pl.Datetime("us", "UTC"),
    1186: pl.Duration("us"),
}


def _column_type(dtype: pl.DataType) -> str:
    """The PostgreSQL type of a TEMP table column holding a polars column."""
    if dtype in (pl.Int8, pl.Int16, pl.Int32, pl.UInt8, pl.UInt16):
        return "INTEGER"
    if dtype in (pl.Int64, pl.UInt32):
        return "BIGINT"
    if dtype in (pl.UInt64, pl.Int128) or isinstance(dtype, pl.Decimal):
        return "NUMERIC"
    if dtype in (pl.Float32, pl.Float64):
        return "DOUBLE PRECISION"
    if dtype == pl.Boolean:
        return "BOOLEAN"
    if dtype == pl.Date:
        return "DATE"
    if isinstance(dtype, pl.Datetime):
        return "TIMESTAMPTZ" if dtype.time_zone else "TIMESTAMP"
    if isinstance(dtype, pl.Duration):
        return "INTERVAL"
    if dtype in (pl.String, pl.Null, pl.Categorical) or isinstance(dtype, pl.Enum):
        return "TEXT"
    raise TypeError(f"a {dtype} column cannot be registered as a PostgreSQL table")


_TOKENS = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|--[^\n]*|\?|%""")


@functools.lru_cache(maxsize=512)
def translate(sql: str) -> str:
    """`?` placeholders as `%s` and literal `%` as `%%`, leaving `?` in quoted text and comments alone."""

    def one(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "?":
            return "%s"
        return token.replace("%", "%%")

    return _TOKENS.sub(one, sql)


class PgExecutor:
    """`execute(sql_with_question_marks, params)` returning a psycopg cursor, like DuckDB's connection."""

    def __init__(self, raw: psycopg.Connection[Any]):
        self.raw = raw

    def execute(self, query: str, parameters: Sequence[object] | None = None, /) -> psycopg.Cursor[Any]:
        cursor = self.raw.cursor()
        cursor.execute(translate(query), list(parameters or []))
        return cursor


def redact(text: str, dsn: str) -> str:
    """`text` without the DSN or its password in it."""
    secrets = {dsn}
    with contextlib.suppress(Exception):  # a DSN libpq cannot parse has no password to find
        password = conninfo_to_dict(dsn).get("password")
        if password:
            secrets.add(str(password))
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***")
    return text


def connect_pg(dsn: str, timeout_seconds: float, source: str) -> psycopg.Connection[Any]:
    """An autocommit connection in UTC with synchronous commits; `source` names it in errors (the env var)."""
    try:
        conninfo_to_dict(dsn)
    except (psycopg.Error, ValueError):  # libpq's parse error quotes the text it could not parse: not shown
        raise UserInputError(
            f"{source} does not hold a valid PostgreSQL connection string (the value is not shown: it may hold a "
            "password)"
        ) from None
    try:
        raw = psycopg.connect(dsn, autocommit=True, connect_timeout=max(2, int(timeout_seconds)))
    except (psycopg.Error, ValueError) as error:  # libpq names the host and port, never the password
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        reason = redact("; ".join(lines) or "no reason given", dsn)[:300]
        raise LedgerUnavailable(
            f"cannot connect to the PostgreSQL ledger named by {source}: {type(error).__name__}: {reason}"
        ) from None
    raw.prepare_threshold = None  # TEMP tables are recreated per call: a prepared plan would outlive its table
    raw.execute("SET TimeZone = 'UTC'")
    raw.execute("SET synchronous_commit = on")  # a commit is on disk before a claim counts as won
    return raw


# an aggregate over a group of rows: text that changes with every committed insert, update or delete of them, from
# the transaction ids stamped on their row versions (`xmin`), without turning a row into text
ROW_VERSIONS_DIGEST = "coalesce(sum(hashint8extended(xmin::text::bigint, 0)), 0)::text"


class PgConnection(SqlConnection):
    """The ledger's connection on PostgreSQL."""

    # a deadlock or serialization failure aborts the claim's transaction: another writer won, the chunk is lost
    lost_claim_errors = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure)
    database_errors: tuple[type[BaseException], ...] = (psycopg.Error,)
    history_keyed = True
    con: PgExecutor

    def __init__(self, raw: psycopg.Connection[Any]):
        super().__init__(PgExecutor(raw))
        self.raw = raw

    def frame(self, sql: str, params: Sequence[object] | None = None) -> pl.DataFrame:
        cursor = self.con.execute(sql, params)
        rows = cursor.fetchall()
        description = cursor.description or []
        series = []
        for i, column in enumerate(description):
            dtype = PG_DTYPES.get(column.type_code)
            values = [row[i] for row in rows]
            series.append(pl.Series(column.name, values, dtype=dtype) if dtype else pl.Series(column.name, values))
        return pl.DataFrame(series)

    @contextlib.contextmanager
    def _register(self, name: str, frame: pl.DataFrame) -> Iterator[None]:
        table = quote_identifier(name)
        columns = ", ".join(f"{quote_identifier(c)} {_column_type(t)}" for c, t in frame.schema.items())
        self.con.execute(f"CREATE TEMP TABLE {table} ({columns})")
        try:
            self._copy_in(name, frame)
            yield
        finally:
            # in a failed transaction the ROLLBACK that follows removes the table; a DROP would only fail
            if self.raw.info.transaction_status != TransactionStatus.INERROR:
                self.con.execute(f"DROP TABLE IF EXISTS pg_temp.{table}")

    def _copy_in(self, table: str, frame: pl.DataFrame) -> None:
        """`frame`'s rows into `table` by COPY, as CSV (labels as their text)."""
        if not frame.height:
            return
        labels = [c for c, t in frame.schema.items() if t == pl.Categorical or isinstance(t, pl.Enum)]
        text = frame.with_columns(pl.col(labels).cast(pl.String)).write_csv(
            include_header=False, quote_style="non_numeric"
        )
        names = ", ".join(quote_identifier(c) for c in frame.columns)
        with self.raw.cursor().copy(f"COPY {quote_identifier(table)} ({names}) FROM STDIN (FORMAT csv)") as copy:
            copy.write(text)

    def copy_new_rows(self, table: str, rows: pl.DataFrame) -> bool:
        """Under a savepoint, so a unique violation undoes only this COPY, inside whatever transaction is open."""
        with self.transaction():
            self.con.execute("SAVEPOINT copy_new_rows")
            try:
                self._copy_in(table, rows)
            except pg_errors.UniqueViolation:
                self.con.execute("ROLLBACK TO SAVEPOINT copy_new_rows")
                return False
            self.con.execute("RELEASE SAVEPOINT copy_new_rows")
        return True

    def interval_of_microseconds(self, expression: str) -> str:
        return f"(({expression}) * INTERVAL '1 microsecond')"

    def changed_rows(self, sql: str, params: Sequence[object]) -> int:
        return max(self.con.execute(sql, params).rowcount, 0)

    def table_digest_sql(self, table: str, where: str = "TRUE") -> str:
        """From the row versions, not their text: every insert or update writes a version stamped with its
        transaction's id (`xmin`), so the count and the sum of the ids' hashes change with every committed write,
        and summing them skips turning each row into text (a 500k-row ledger: 90 ms, where hashing its rows' text
        took 1.1 s, once per worker per run)."""
        return f"SELECT count(*), {ROW_VERSIONS_DIGEST} FROM {quote_identifier(table)} WHERE {where}"

    def refuses_duplicate_key(self) -> bool:
        """A failed statement aborts a PostgreSQL transaction, so the duplicate is tried under a SAVEPOINT."""
        probe = f"guard-probe:{uuid.uuid4().hex}"
        with self.simulation():
            self.con.execute(PROBE_INSERT, [probe])
            self.con.execute("SAVEPOINT duplicate_probe")
            try:
                self.con.execute(PROBE_INSERT, [probe])
            except pg_errors.UniqueViolation:
                self.con.execute("ROLLBACK TO SAVEPOINT duplicate_probe")
                return True
        return False

"""`source: {kind: sql}`: the invoices are the rows of the operator's own query on their own PostgreSQL database.

One pull, in one read-only transaction with `statement_timeout` set from `source.timeout_seconds`:

1. the query is prepared, not run, and the database describes its result (`describe`): one statement only (the
   extended protocol refuses two), each column's name and type;
2. the columns are judged (`sql_columns.snapshot_columns`: exit 2 naming each missing or mistyped one) before a
   row is read;
3. `COPY (SELECT <each snapshot column as text> FROM (<query>) AS q) TO STDOUT (FORMAT csv, HEADER true)` streams
   the rows into a file as the server writes them: no row is ever a Python object, memory stays flat whatever the
   size, and the file is a CSV snapshot that `dunning.ingest.snapshot` reads (in polars, in Rust) and
   `snapshot_rules` judges exactly as it judges a CSV an operator exported by hand.

A database that cannot be reached, refuses the login or the query, or cancels it at the timeout is
`BillingSourceFailed` (exit 7) with the database's own message, one line, the connection string and its password
masked (`safe_text.redact`, `secret_env.scrub`). Nothing is stored by a failed pull: the caller writes under a
temporary name and renames only a complete file (`pulls`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import polars as pl
import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import ExecStatus

from dunning.config import Source
from dunning.errors import BillingSourceFailed, ConfigError
from dunning.ingest.sources.sql_columns import TYPES_QUERY, Column, copy_statement, snapshot_columns
from dunning.safe_text import for_terminal, redact
from dunning.secret_env import read_secret, remember, scrub, shown_name

MAX_MESSAGE = 400  # characters of the database's message in our one line
QUERY_CANCELED = "57014"  # statement_timeout (or a cancel by an administrator)
TRIM_SCALE_SINCE = 130000  # PostgreSQL 13 added `trim_scale(numeric)`


def dsn(settings: Source, environ: Mapping[str, str] = os.environ) -> str:
    """The connection string from `source.dsn_env` (read, checked and masked from here on); ConfigError (exit 2)
    naming the variable, never the value, when it is unset or not a libpq connection string."""
    value = read_secret(settings.dsn_env, "source.dsn_env (source.kind is sql)", environ)
    try:
        password = conninfo_to_dict(value).get("password")
    except (psycopg.Error, ValueError):  # libpq's parse error quotes the text it could not parse: not shown
        raise ConfigError(
            f"source.dsn_env: {shown_name(settings.dsn_env)} does not hold a PostgreSQL connection string "
            "(postgresql://user:password@host:5432/db; the value is not shown: it may hold a password)"
        ) from None
    remember([str(password)] if password else [])
    return value


def query_text(settings: Source) -> str:
    """`source.query`, or the text of `source.query_file` (ConfigError naming the file when it cannot be read), with
    trailing semicolons and white space dropped: it is wrapped in `COPY (...)`."""
    text = settings.query
    if settings.query_file is not None:
        try:
            text = Path(settings.query_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
            raise ConfigError(f"source.query_file {settings.query_file}: cannot be read: {reason}") from None
    stripped = (text or "").strip().rstrip(";").rstrip()
    if not stripped:
        raise ConfigError("source.query: the query is empty")
    return stripped


class Refused(Exception):
    """The database's refusal of a statement: its SQLSTATE, message and hint (from a psycopg error or a result)."""

    def __init__(self, sqlstate: str | None, message: str, hint: str | None = None):
        super().__init__(message)
        self.sqlstate, self.message, self.hint = sqlstate, message, hint

    @classmethod
    def of(cls, error: psycopg.Error) -> Refused:
        diag = error.diag
        return cls(error.sqlstate, diag.message_primary or str(error), diag.message_hint)


def _one_line(text: str, secrets: list[str]) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = scrub(redact("; ".join(lines) or "no reason given", secrets))
    return for_terminal(line[:MAX_MESSAGE])


def _failure(refused: Refused, doing: str, settings: Source, secrets: list[str]) -> BillingSourceFailed:
    """The database's refusal as our one line: what we were doing, its SQLSTATE and its message, masked."""
    message = _one_line(refused.message + (f" (hint: {refused.hint})" if refused.hint else ""), secrets)
    if refused.sqlstate == QUERY_CANCELED:
        return BillingSourceFailed(
            f"source (sql): {doing}: cancelled after source.timeout_seconds ({settings.timeout_seconds:g} s): "
            f"{message}; make the query faster (an index on what it filters) or raise source.timeout_seconds"
        )
    where = f"SQLSTATE {refused.sqlstate}: " if refused.sqlstate else ""
    return BillingSourceFailed(f"source (sql): {doing}: {where}{message}")


def _connect(settings: Source, conninfo: str, secrets: list[str]) -> psycopg.Connection[Any]:
    try:
        connection = psycopg.connect(
            conninfo,
            connect_timeout=max(2, int(settings.timeout_seconds)),
            application_name="dunning",
            client_encoding="UTF8",  # the rows arrive as UTF-8 whatever the database's encoding
        )
    except psycopg.Error as error:  # libpq names the host, port and user, never the password; masked anyway
        raise _failure(
            Refused(error.sqlstate, str(error)),
            f"cannot connect to the billing database in {shown_name(settings.dsn_env)}",
            settings,
            secrets,
        ) from None
    connection.read_only = True  # the transaction below is BEGIN READ ONLY: the query can change nothing
    return connection


def _refusal(result: psycopg.pq.abc.PGresult) -> Refused:
    def field(code: str) -> str | None:
        value = result.error_field(ord(code))
        return value.decode("utf-8", "replace") if value else None

    return Refused(field("C"), field("M") or (result.error_message or b"").decode("utf-8", "replace"), field("H"))


def describe(connection: psycopg.Connection[Any], query: str) -> list[Column]:
    """The query's result columns, from the database's description of the prepared (not executed) statement;
    `Refused` when the database refuses to prepare it."""
    pgconn = connection.pgconn
    prepared = pgconn.prepare(b"", query.encode("utf-8"))
    if prepared.status == ExecStatus.FATAL_ERROR:
        raise _refusal(prepared)
    described = pgconn.describe_prepared(b"")
    if described.status == ExecStatus.FATAL_ERROR:
        raise _refusal(described)
    fields = [
        ((described.fname(i) or b"").decode("utf-8", "replace"), int(described.ftype(i)))
        for i in range(described.nfields)
    ]
    types = {row[0]: row[1:] for row in connection.execute(TYPES_QUERY, [sorted({oid for _, oid in fields})])}
    return [Column(name, *types.get(oid, (oid, "X", f"type {oid}"))) for name, oid in fields]


def copy_to(settings: Source, out: BinaryIO, environ: Mapping[str, str] = os.environ) -> None:
    """The query's rows into `out` as a CSV snapshot (a header of snapshot column names, then a line per row), in
    one read-only transaction. ConfigError (exit 2) for a query of the wrong shape; BillingSourceFailed (exit 7)
    for the database's failures. `out` may hold part of the rows when either is raised: the caller discards it."""
    conninfo = dsn(settings, environ)
    secrets = [conninfo, *(str(p) for p in [conninfo_to_dict(conninfo).get("password")] if p)]
    query = query_text(settings)
    doing = "source.query"
    with contextlib.closing(_connect(settings, conninfo, secrets)) as connection:
        try:
            with connection.transaction():
                timeout_ms = max(1, round(settings.timeout_seconds * 1000))
                connection.execute(
                    "SELECT set_config('statement_timeout', %s, true), set_config('DateStyle', 'ISO, YMD', true)",
                    [f"{timeout_ms}ms"],
                )
                doing = "preparing source.query"
                columns = snapshot_columns(describe(connection, query))
                doing = "running source.query"
                trim_scale = connection.info.server_version >= TRIM_SCALE_SINCE
                with connection.cursor().copy(copy_statement(query, columns, trim_scale)) as copy:
                    for chunk in copy:
                        out.write(chunk)
        except psycopg.Error as error:
            raise _failure(Refused.of(error), doing, settings, secrets) from None
        except Refused as refused:
            raise _failure(refused, doing, settings, secrets) from None


def pull_frame(settings: Source, environ: Mapping[str, str] = os.environ, scratch: Path | None = None) -> pl.DataFrame:
    """The query's rows as a frame of the snapshot's columns, every one text (as `stripe.load_stripe_invoices`
    gives its rows), for a caller that keeps its own file: pulled through a temporary CSV in `scratch` (default the
    system's temporary directory; owner-only), deleted after."""
    with _scratch_file(scratch) as (handle, path):
        copy_to(settings, handle, environ)
        handle.close()
        return pl.read_csv(path, infer_schema=False)


@contextlib.contextmanager
def _scratch_file(directory: Path | None) -> Iterator[tuple[BinaryIO, Path]]:
    descriptor, name = tempfile.mkstemp(prefix=".sql-pull-", suffix=".csv", dir=directory)  # mode 0600
    path = Path(name)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            yield handle, path
    finally:
        path.unlink(missing_ok=True)

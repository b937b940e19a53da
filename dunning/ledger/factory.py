"""The one place that decides which ledger a deployment uses: the `ledger:` section of its config.

`duckdb` (the default) is HOME/dunning.duckdb; `postgres` is the database whose
DSN is in the environment variable `ledger.dsn_env` names. The DSN is read
here and handed to psycopg, and nowhere else: messages name the variable only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import duckdb

from dunning.config import DunningConfig, LedgerSettings
from dunning.errors import UserInputError
from dunning.ledger.base import Ledger
from dunning.secret_env import read_secret

DUCKDB_FILE = "dunning.duckdb"


def postgres_dsn(settings: LedgerSettings) -> str:
    """The DSN from the environment (`secret_env.read_secret`), or a ConfigError naming the variable (never echoing
    a value)."""
    return read_secret(settings.dsn_env, "ledger.dsn_env (ledger.kind is postgres)")


@contextlib.contextmanager
def open_ledger_for(
    settings: DunningConfig | LedgerSettings, home: Path, timeout_seconds: float = 120.0
) -> Iterator[Ledger]:
    """The deployment's ledger, opened (and its schema brought up to date) for the block, closed after."""
    ledger_settings = settings.ledger if isinstance(settings, DunningConfig) else settings
    if ledger_settings.kind == "postgres":
        from dunning.ledger.backends.pg_ledger import open_postgres_ledger

        dsn = postgres_dsn(ledger_settings)
        with open_postgres_ledger(dsn, f"${ledger_settings.dsn_env}", timeout_seconds) as pg_ledger:
            yield pg_ledger
        return
    from dunning.ledger.backends.duckdb_ledger import open_ledger

    with open_ledger(Path(home) / DUCKDB_FILE, timeout_seconds) as duck_ledger:
        yield duck_ledger


@contextlib.contextmanager
def open_ledger_to_read(
    settings: DunningConfig | LedgerSettings, home: Path, timeout_seconds: float = 120.0
) -> Iterator[Ledger]:
    """The deployment's ledger for reading only (`dunning preview`): no migration, no write, and no file created.

    DuckDB: the file opened read-only, or, when there is none yet, an empty ledger in memory (nothing on record);
    PostgreSQL: a session whose transactions are read-only. A ledger whose schema is older than this release is
    refused (UserInputError): reading it would need the migration this must not run."""
    from dunning.ledger.backends.connection import LedgerConnection, connect
    from dunning.ledger.backends.duckdb_ledger import DuckDBLedger
    from dunning.ledger.schema.migrations import LATEST, check_not_newer

    ledger_settings = settings.ledger if isinstance(settings, DunningConfig) else settings
    if ledger_settings.kind == "postgres":
        from dunning.ledger.backends.pg_connection import connect_pg
        from dunning.ledger.backends.pg_ledger import PostgresLedger

        source = f"${ledger_settings.dsn_env}"
        raw = connect_pg(postgres_dsn(ledger_settings), timeout_seconds, source)
        try:
            raw.execute("SET default_transaction_read_only = on")
            pg_ledger = PostgresLedger(raw)
            pg_ledger.label = f"the PostgreSQL ledger named by {source}"
            _current(check_not_newer(pg_ledger.con, source), LATEST, pg_ledger.label)
            yield pg_ledger
        finally:
            raw.close()
        return
    path = Path(home) / DUCKDB_FILE
    if not path.is_file():
        con = duckdb.connect(":memory:")
        try:
            LedgerConnection.prepare(con)  # the current schema, empty: nothing on record yet
            yield DuckDBLedger(con)
        finally:
            con.close()
        return
    with connect(path, timeout_seconds, read_only=True) as con:
        con.execute("SET TimeZone = 'UTC'")
        ledger = DuckDBLedger(con)
        ledger.label = f"ledger {path}"
        _current(check_not_newer(con, str(path)), LATEST, ledger.label)
        yield ledger


def _current(version: int, latest: int, label: str) -> None:
    if version < latest:
        raise UserInputError(
            f"{label} is at schema version {version}, this release reads {latest}: run `dunning status` once to "
            "migrate it (this command never writes)"
        )

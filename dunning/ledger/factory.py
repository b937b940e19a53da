"""The one place that decides which ledger a deployment uses: the `ledger:` section of its config.

`duckdb` (the default) is HOME/dunning.duckdb; `postgres` is the database whose
DSN is in the environment variable `ledger.dsn_env` names. The DSN is read
here and handed to psycopg, and nowhere else: messages name the variable only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from dunning.config import DunningConfig, LedgerSettings
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

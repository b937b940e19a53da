"""The ledger's tables on PostgreSQL: the DuckDB schema's tables and columns, types in PostgreSQL's words.

`PG_DDL` is derived from `schema.DDL` (one description of the tables, two
dialects) plus what only PostgreSQL needs: the index the claim-time cap counts
its window with, and the history's unique key per invoice and day (several
workers merge one day). Migrations are `migrations.MIGRATIONS` (with their
PostgreSQL-only statements), recorded in the same `schema_version` table; a
new database gets the current schema with every migration recorded, and a
database newer than this release is refused.

Several workers may open a new database at once: `migrate_pg` holds an
advisory lock (session level, released at the end, or when the session ends
if the process dies) around the whole check-and-migrate, so one of them
migrates and the others find the schema current.
"""

from __future__ import annotations

import re

from psycopg import errors as pg_errors

from dunning.errors import LedgerBusy, UserInputError
from dunning.ledger.schema.migrations import HISTORY_KEY_INDEX, migrate
from dunning.ledger.schema.tables import DDL
from dunning.ledger.sql import Executes

# DuckDB type -> PostgreSQL type, where the names differ
_TYPES = {r"\bVARCHAR\b": "TEXT", r"\bDOUBLE\b(?! PRECISION)": "DOUBLE PRECISION", r"\bHUGEINT\b": "NUMERIC(38)"}


def pg_statement(statement: str) -> str:
    """One DuckDB DDL statement in PostgreSQL's type names."""
    for pattern, replacement in _TYPES.items():
        statement = re.sub(pattern, replacement, statement)
    return statement


PG_DDL = (
    *(pg_statement(s) for s in DDL),
    # the per-customer cap counts a customer's recent claims inside every claim transaction
    "CREATE INDEX IF NOT EXISTS reminder_ledger_customer_claimed ON reminder_ledger (customer_id, claimed_at)",
    # the day's history merge upserts on it, and every read of one day's history goes through it
    HISTORY_KEY_INDEX,
)

MIGRATION_LOCK = 0x64756E6E696E67  # "dunning": the advisory lock key every worker migrates under


def migrate_pg(con: Executes, source: str, lock_timeout_seconds: float) -> list[int]:
    """Bring the database to the current schema under the advisory lock; returns the versions applied now."""
    con.execute("SELECT set_config('lock_timeout', ?, false)", [f"{max(1, int(lock_timeout_seconds * 1000))}ms"])
    try:
        con.execute("SELECT pg_advisory_lock(?)", [MIGRATION_LOCK])
    except pg_errors.LockNotAvailable:
        raise LedgerBusy(
            f"the PostgreSQL ledger named by {source} is being migrated by another process and was not released "
            f"within {lock_timeout_seconds:.0f}s; try again when it finishes"
        ) from None
    finally:
        con.execute("RESET lock_timeout")
    try:
        return migrate(con, source, PG_DDL, postgres=True)
    except pg_errors.InsufficientPrivilege:
        con.execute("ROLLBACK")
        raise UserInputError(
            f"the PostgreSQL ledger named by {source} needs schema migrations this role may not run (a worker role "
            "without CREATE): run one `dunning status` as the role that owns the schema, then start the workers"
        ) from None
    finally:
        con.execute("SELECT pg_advisory_unlock(?)", [MIGRATION_LOCK])

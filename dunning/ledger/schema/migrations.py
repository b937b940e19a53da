"""Ordered schema migrations, so a ledger made by any earlier release opens, upgraded, with nothing lost.

`schema_version` holds one row per migration applied. A ledger from before
versioning (release 0.1, which only ran `CREATE TABLE IF NOT EXISTS`) has no
such table but has `reminder_ledger`: it is taken as version 1. Migrations run
at open, each in its own transaction, while this process holds DuckDB's
single-writer file lock, so two processes never migrate one file at once. A
ledger newer than this code is refused: an older release must not write
columns and rules it does not know. The PostgreSQL ledger runs the same
migrations (`pg_schema`), under an advisory lock instead of a file lock.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from dunning.errors import UserInputError
from dunning.ledger.schema.desk_tables import DESK_DDL
from dunning.ledger.schema.tables import DDL
from dunning.ledger.sql import Executes


class LedgerTooNew(UserInputError):
    """The ledger was written by a newer release than the one running."""


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]
    postgres_only: tuple[str, ...] = ()  # run after `statements` on PostgreSQL alone


HISTORY_KEY_INDEX = (
    "CREATE UNIQUE INDEX IF NOT EXISTS invoice_history_daily_day_invoice "
    "ON invoice_history_daily (business_date, invoice_id)"
)
_LEDGER_DDL = next(s for s in DDL if "CREATE TABLE IF NOT EXISTS reminder_ledger (" in s)
# the columns reminder_ledger had when migration 7 rebuilt it: the rows are copied by name, so the rebuild takes a
# ledger of release 6 whatever columns later migrations add (they add them again, IF NOT EXISTS)
_LEDGER_COLUMNS_V7 = (
    "idempotency_key, kind, invoice_id, customer_id, customer_email, cycle, stage, status, amount_minor, currency, "
    "email_id, message_id, run_id, claimed_at, sent_at, attempts, last_error, next_attempt_at, outcome_wall_at, "
    "lease_expires_at, provider_message_id"
)
_LEDGER_COLUMNS_V12 = _LEDGER_COLUMNS_V7 + ", settled_run_id"  # what migration 13's rebuild copies
# `safe_text.redact` in SQL both databases run alike (RE2 in DuckDB, PostgreSQL's regular expressions): a URL with a
# path, query or fragment is cut to scheme and host, one with user info loses it, and urllib3's "with url: /path?query"
# (no scheme) loses the path; rows without any are not rewritten
_NO_SPACE = "[:space:]"
SCRUB_RECORDED_URLS = tuple(
    f"UPDATE reminder_ledger SET last_error = regexp_replace(last_error, '{pattern}', '{replacement}', 'g') "
    f"WHERE last_error LIKE '{where}'"
    for pattern, replacement, where in (
        (rf"([A-Za-z][A-Za-z0-9+.-]*://)([^/?#@{_NO_SPACE}]*@)?([^/?#{_NO_SPACE}]*)[/?#][^{_NO_SPACE}]*", r"\1\3/…",
         "%://%"),
        (rf"([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@{_NO_SPACE}]*@([^/?#{_NO_SPACE}]*)", r"\1\2/…", "%://%"),
        (rf"(url: )/[^{_NO_SPACE}]*", r"\1/…", "%url: /%"),
    )
)  # fmt: skip
MIGRATIONS = (
    Migration(1, "baseline: the tables of release 0.1", ()),  # an empty file gets the current DDL below
    Migration(
        2,
        "claim leases: a claim names its owner run and expires, so no worker expires another's live claims",
        ("ALTER TABLE reminder_ledger ADD COLUMN IF NOT EXISTS lease_expires_at TIMESTAMPTZ",),
    ),
    Migration(
        3,
        "snapshot times: a stale snapshot never reopens what a newer one closed",
        (
            "ALTER TABLE invoice_cycles ADD COLUMN IF NOT EXISTS changed_snapshot_at TIMESTAMPTZ",
            next(s for s in DDL if "applied_snapshots" in s),
        ),
    ),
    Migration(
        4,
        "billing source cursors: the newest Stripe event polled, advanced once its notices are claimed",
        (next(s for s in DDL if "CREATE TABLE IF NOT EXISTS source_cursors (" in s),),
    ),
    Migration(
        5,
        "exclusions: customers and invoices held out of dunning, with who, why, since, until and when included",
        (next(s for s in DDL if "CREATE TABLE IF NOT EXISTS exclusions (" in s),),
    ),
    Migration(
        6,
        "idempotent providers: the provider's own message id, and the exact payload of an unknown send to resubmit",
        (
            "ALTER TABLE reminder_ledger ADD COLUMN IF NOT EXISTS provider_message_id VARCHAR",
            next(s for s in DDL if "provider_payloads" in s),
        ),
    ),
    Migration(
        7,
        "invoice emails: kind 'invoice' in the ledger's check (DuckDB cannot alter a CHECK: the table is rebuilt), "
        "and when the feature was turned on",
        (
            _LEDGER_DDL.replace("CREATE TABLE IF NOT EXISTS reminder_ledger (", "CREATE TABLE reminder_ledger_v7 ("),
            f"INSERT INTO reminder_ledger_v7 ({_LEDGER_COLUMNS_V7}) SELECT {_LEDGER_COLUMNS_V7} FROM reminder_ledger",
            "DROP TABLE reminder_ledger",
            "ALTER TABLE reminder_ledger_v7 RENAME TO reminder_ledger",
            next(s for s in DDL if "CREATE TABLE IF NOT EXISTS feature_state (" in s),
        ),
    ),
    Migration(
        8,
        "run inputs: what each live run was given and the ledger's state when it ended, so an unchanged hour is "
        "skipped",
        (next(s for s in DDL if "CREATE TABLE IF NOT EXISTS run_inputs (" in s),),
    ),
    Migration(
        9,
        "PostgreSQL: one history row per invoice and day, under a unique index the day's merge upserts on (runs of "
        "one shard merging at once could both insert a row; duplicates already there are dropped, the newest kept)",
        (),
        postgres_only=(
            """
            DELETE FROM invoice_history_daily a USING invoice_history_daily b
            WHERE a.business_date = b.business_date AND a.invoice_id = b.invoice_id
              AND (a.as_of, a.ctid) < (b.as_of, b.ctid)
            """,
            HISTORY_KEY_INDEX,
        ),
    ),
    Migration(
        10,
        "run scopes: the invoices of each sharded run, so a shard's unchanged hour is judged on its own rows",
        (next(s for s in DDL if "CREATE TABLE IF NOT EXISTS run_scopes (" in s),),
    ),
    Migration(
        11,
        "history writes: one row per merge that changed the daily history, hashed by the hourly no-op instead of "
        "every day's rows",
        (next(s for s in DDL if "CREATE TABLE IF NOT EXISTS history_writes (" in s),),
    ),
    Migration(
        12,
        "resubmission: why a kept request of an unknown send is not resubmitted now (the present forbids it), and "
        "which run settled an unknown key (by lookup or resubmission)",
        (
            "ALTER TABLE provider_payloads ADD COLUMN IF NOT EXISTS held_reason VARCHAR",
            "ALTER TABLE reminder_ledger ADD COLUMN IF NOT EXISTS settled_run_id VARCHAR",
        ),
    ),
    Migration(
        13,
        "the collections schedule and going live: kind 'escalation' in the ledger's check (the table is rebuilt, as "
        "for 7), the policy that governed each key (existing rows: default) and why a stage was skipped (adopted)",
        (
            _LEDGER_DDL.replace("CREATE TABLE IF NOT EXISTS reminder_ledger (", "CREATE TABLE reminder_ledger_v13 ("),
            f"INSERT INTO reminder_ledger_v13 ({_LEDGER_COLUMNS_V12}) "
            f"SELECT {_LEDGER_COLUMNS_V12} FROM reminder_ledger",
            "DROP TABLE reminder_ledger",
            "ALTER TABLE reminder_ledger_v13 RENAME TO reminder_ledger",
        ),
    ),
    Migration(
        14,
        "the collections schedule in the audit: the policy that governed each key, and when a key that waits (a send "
        "window, a holiday, spacing) may go",
        (
            "ALTER TABLE dunning_audit ADD COLUMN IF NOT EXISTS policy VARCHAR",
            "ALTER TABLE dunning_audit ADD COLUMN IF NOT EXISTS waits_until TIMESTAMPTZ",
        ),
    ),
    Migration(
        15,
        "delivery feedback: suppressed addresses (a hard bounce, a complaint, an operator's word) and the delivery "
        "reports they came from",
        (
            next(s for s in DDL if "CREATE TABLE IF NOT EXISTS suppressions (" in s),
            next(s for s in DDL if "CREATE TABLE IF NOT EXISTS suppression_alerts (" in s),
            next(s for s in DDL if "CREATE TABLE IF NOT EXISTS delivery_events (" in s),
        ),
    ),
    Migration(
        16,
        "ingest once: the snapshot rows each run read (a shard: its part of the ingest)",
        ("ALTER TABLE dunning_runs ADD COLUMN IF NOT EXISTS rows_read BIGINT",),
    ),
    Migration(
        17,
        "forged reports: the Message-ID secret, why each delivery report did or did not suppress, and a bounce that "
        "waits behind an operator's temporary suppression instead of lengthening it",
        (
            next(s for s in DDL if "CREATE TABLE IF NOT EXISTS message_secret (" in s),
            "ALTER TABLE delivery_events ADD COLUMN IF NOT EXISTS verdict VARCHAR",
            "ALTER TABLE suppressions ADD COLUMN IF NOT EXISTS pending_reason VARCHAR",
            "ALTER TABLE suppressions ADD COLUMN IF NOT EXISTS pending_source VARCHAR",
            "ALTER TABLE suppressions ADD COLUMN IF NOT EXISTS pending_event_key VARCHAR",
            "ALTER TABLE suppressions ADD COLUMN IF NOT EXISTS pending_at TIMESTAMPTZ",
        ),
    ),
    Migration(
        18,
        "escalations refused for good wait for a human (when, and the one alert raised for it); the error texts "
        "recorded before URLs were cut to their host are scrubbed of every URL's path, query and user info",
        (
            "ALTER TABLE reminder_ledger ADD COLUMN IF NOT EXISTS refused_at TIMESTAMPTZ",
            "ALTER TABLE reminder_ledger ADD COLUMN IF NOT EXISTS refusal_alert_id VARCHAR",
            *SCRUB_RECORDED_URLS,
        ),
    ),
    Migration(
        19,
        "exports that shrank: the invoices of each applied snapshot (the whole snapshot's, also for a shard's part), "
        "which the next snapshot is held against; an earlier run's from its summary (a shard's: its own part, less)",
        (
            "ALTER TABLE applied_snapshots ADD COLUMN IF NOT EXISTS invoice_count BIGINT",
            "UPDATE applied_snapshots SET invoice_count = (SELECT d.snapshot_rows FROM dunning_runs d "
            "WHERE d.run_id = applied_snapshots.run_id) WHERE invoice_count IS NULL",
        ),
    ),
    Migration(
        20,
        "late fees and statutory interest: the charges claimed with their stage's reminder (one per invoice, cycle and "
        "kind) and those waiting for the reference-rate table",
        (
            next(s for s in DDL if "CREATE TABLE IF NOT EXISTS charges (" in s),
            next(s for s in DDL if "CREATE TABLE IF NOT EXISTS charge_waits (" in s),
        ),
    ),
    Migration(
        21,
        "a held key's other reasons: the audit keeps one reason per key, `also_held` the rest (comma-separated), so "
        "`status` counts each reason a key waits for and a data problem never hides behind the send window",
        ("ALTER TABLE dunning_audit ADD COLUMN IF NOT EXISTS also_held VARCHAR",),
    ),
    Migration(
        22,
        "the collections desk: promises to pay and the invoices they cover, customers' replies and their "
        "acknowledgements, notes, IMAP cursors; every address a reminder went to (`reminder_ledger.recipients`)",
        (
            *DESK_DDL,
            "ALTER TABLE reminder_ledger ADD COLUMN IF NOT EXISTS recipients VARCHAR",
        ),
    ),
    Migration(
        23,
        "when each acknowledgement was made on the wall clock (`reply_acks.recorded_wall_at`): an ack answers only "
        "the replies on record when it was made, so a late-imported reply dated before it still pauses",
        ("ALTER TABLE reply_acks ADD COLUMN IF NOT EXISTS recorded_wall_at TIMESTAMPTZ",),
    ),
)
LATEST = MIGRATIONS[-1].version

_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER PRIMARY KEY,
    description VARCHAR NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL
)
"""


def _table_names(con: Executes, duckdb_catalog: bool = False) -> set[str]:
    """Every table's name, in one catalog query: asking for each table, or for a list of them with `IN`, took
    DuckDB 2-16 ms a question (its catalog views are built per query), the list of names 1.5 ms, and 0.9 ms from
    DuckDB's own `duckdb_tables()` (`duckdb_catalog`, for a connection known to be DuckDB's: the ledger's every
    open asks). Only this database's: other files attached to the process's DuckDB (`duckdb_host`) are not its
    tables."""
    if duckdb_catalog:
        query = "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
    else:
        query = "SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database()"
    return {str(row[0]) for row in con.execute(query).fetchall()}


def _rows(con: Executes, table: str) -> int:
    row = next(iter(con.execute(f"SELECT count(*) FROM {table}").fetchall()), None)
    return int(row[0]) if row else 0


def current_version(con: Executes, tables: set[str] | None = None) -> int:
    """0 for an empty file, 1 for a release-0.1 ledger, else the highest version applied. `tables`: the names
    `_table_names` gave, when the caller has them."""
    tables = _table_names(con) if tables is None else tables
    if "schema_version" in tables:
        row = next(iter(con.execute("SELECT max(version) FROM schema_version").fetchall()), None)
        if row and row[0] is not None:
            return int(row[0])
    return 1 if "reminder_ledger" in tables else 0


def check_not_newer(con: Executes, path: str, tables: set[str] | None = None) -> int:
    version = current_version(con, tables)
    if version > LATEST:
        raise LedgerTooNew(
            f"ledger {path} has schema version {version}, newer than this release knows ({LATEST}); "
            "upgrade dunning-pipeline before running it on this ledger"
        )
    return version


@functools.lru_cache(maxsize=4)
def _tables_of(ddl: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", "\n".join(ddl)))


def _schema_is_current(version: int, ddl: Sequence[str], tables: set[str]) -> bool:
    """At the latest version with every table of `ddl` present: nothing to run (where re-running the whole DDL on
    every open cost about a third of opening the ledger)."""
    return version == LATEST and set(_tables_of(tuple(ddl))) <= tables


def migrate(con: Executes, path: str, ddl: Sequence[str] = DDL, postgres: bool = False) -> list[int]:
    """Apply every pending migration in order; returns the versions applied now. `ddl`: the current schema in this
    database's dialect (`schema.DDL` for DuckDB, `pg_schema.PG_DDL` for PostgreSQL, with `postgres` set)."""
    tables = _table_names(con, duckdb_catalog=not postgres)
    version = check_not_newer(con, path, tables)
    applied: list[int] = []
    if _schema_is_current(version, ddl, tables):
        return applied
    con.execute(_VERSION_TABLE)
    if version == 0:  # a new file: the current schema at once, every migration recorded as applied
        con.execute("BEGIN TRANSACTION")
        if postgres:
            for statement in ddl:
                con.execute(statement)
        else:  # one script and one insert: 14 ms where a statement at a time took 25 (DuckDB's round trips)
            con.execute("\n;\n".join(ddl))  # a newline first: a statement ending in a -- comment stays whole
        now = dt.datetime.now(dt.UTC)
        con.execute(
            "INSERT INTO schema_version VALUES " + ", ".join("(?, ?, ?)" for _ in MIGRATIONS),
            [value for m in MIGRATIONS for value in (m.version, m.description, now)],
        )
        con.execute("COMMIT")
        return [m.version for m in MIGRATIONS]
    if version == 1 and not _rows(con, "schema_version"):
        con.execute(
            "INSERT INTO schema_version VALUES (1, ?, ?)",
            [MIGRATIONS[0].description + " (found unversioned)", dt.datetime.now(dt.UTC)],
        )
    for migration in MIGRATIONS:
        if migration.version <= version:
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            for statement in migration.statements + (migration.postgres_only if postgres else ()):
                con.execute(statement)
            con.execute(
                "INSERT INTO schema_version VALUES (?, ?, ?)",
                [migration.version, migration.description, dt.datetime.now(dt.UTC)],
            )
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
        applied.append(migration.version)
    # the current schema: everything for a new file; for an old one, tables it never had
    for statement in ddl:
        con.execute(statement)
    return applied

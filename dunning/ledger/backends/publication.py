"""The analysts' read path: Parquet files plus a small `analytics.duckdb` of views over them.

DuckDB lets one process write a database file and a writer blocks every other
opener, so analysts never open `dunning.duckdb`. After each run the pipeline
copies the history tables to `DIR/analytics/` (each file written to a
temporary name and renamed into place, so a reader sees the old file or the new
one, never half of one) and builds `DIR/analytics.duckdb` the same way: a
file holding only views, which an analyst can keep open for as long as they
like without blocking a run, and which shows the new data on their next query.
It is rebuilt only when its views change or the file was touched since it was
built (`analytics/views.json` records both).

The tables that grow by the day (`PARTITIONED_TABLES`) are published one file
per day, and a run rewrites only the days whose rows changed since the last
publication (found by a fingerprint per day: its row count and the XOR of its
rows' hashes), so publishing costs the changed days, not the whole history.

`analytics.duckdb` is not a place to keep anything: its contents are replaced
by every publication. Analysts keep their own tables in their own DuckDB file
and `ATTACH` this one `(READ_ONLY)`; the views name their Parquet files by
absolute path, so that works from any working directory. Publication makes
sure the file always opens, whatever an analyst did to the file it replaces
(see `_publish_view_file`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import duckdb

from dunning.ledger.backends.duckdb_host import attached
from dunning.ledger.stores.desk.customer_store import CUSTOMER_TIMELINE
from dunning.ledger.stores.history import RECOVERY_BY_STAGE

log = logging.getLogger("dunning.ledger.backends.publication")

VIEW_FILE = "analytics.duckdb"
# Where the analysts' file keeps its write-ahead log: a dangling symbolic link, always. DuckDB (2.0) treats
# it as "no WAL" when it opens the file (read-only or not), and a commit into the file fails loudly
# ("Cannot open file .../analytics.duckdb.wal"), instead of leaving a log of an older file at this path that
# breaks every open of the new one ("WAL does not match database file"). The target names the way out.
WAL_GUARD_TARGET = (
    ".analytics.duckdb.is-replaced-by-each-publication/keep-your-tables-in-your-own-file-and-ATTACH-this-one-READ_ONLY"
)

# table -> the expression naming a row's day; these are published as DIR/analytics/<table>/<day>.parquet
# (rows without a day, if any, as `undated.parquet`)
PARTITIONED_TABLES = {
    "reminder_ledger": "CAST(timezone('UTC', claimed_at) AS DATE)",
    "invoice_history_daily": "business_date",
    "simulated_sends": "business_date",
    "dunning_audit": "CAST(timezone('UTC', as_of) AS DATE)",
}
UNDATED = "undated"
VIEWS_STAMP = "views.json"  # under analytics/: what the view file was built from, and the file as it was left
WHOLE_TABLES_MANIFEST = "published.json"  # under analytics/: the fingerprint of each table published whole
# what the analysts' copy holds, by name: never `message_secret` (the key that makes our Message-IDs unforgeable,
# `ledger.stores.message_secret`), nor any table not listed here
PUBLISHED_TABLES = (
    "reminder_ledger",
    "invoice_history_daily",
    "invoice_cycles",
    "dunning_audit",
    "dunning_runs",
    "alerts",
    "incidents",
    "snapshot_quarantine",
    "billing_events",
    "simulated_sends",
    "pause_state",
    "exclusions",
    "suppressions",
    "suppression_alerts",
    "delivery_events",
    "charges",
    # the collections desk (`dunning.desk`): promises, replies and their answers, notes
    "promises",
    "promise_invoices",
    "customer_replies",
    "reply_acks",
    "customer_notes",
)

# what a dry run writes to the ledger (its audit, its run record, an alert it raised): all a dry run publishes
# (`publish(only=...)`); the history it never writes (the reminders, a million-row day of invoices, the cycles)
# is left as the last live run published it, and a dry run on a new home publishes every table once, empty
DRY_RUN_TABLES = frozenset({"dunning_audit", "dunning_runs", "alerts", "snapshot_quarantine"})

ANALYST_VIEWS = {
    "contact_history": """
        SELECT customer_id, any_value(customer_email) AS customer_email, email_id,
               any_value(message_id) AS message_id,
               any_value(kind) AS kind, string_agg(DISTINCT stage, ',' ORDER BY stage) AS stages,
               count(*) AS keys, string_agg(invoice_id, ',' ORDER BY invoice_id) AS invoices,
               sum(amount_minor) AS amount_minor, any_value(currency) AS currency,
               count(DISTINCT currency) AS currencies,
               any_value(status) AS outcome, min(claimed_at) AS claimed_at, min(sent_at) AS sent_at,
               any_value(policy) AS policy
        FROM reminder_ledger WHERE status <> 'skipped' AND kind <> 'escalation'
        GROUP BY customer_id, email_id""",
    "dunning_funnel": """
        WITH reached AS (
            SELECT l.invoice_id, l.cycle, l.policy, l.stage, min(coalesce(l.sent_at, l.claimed_at)) AS reminded_at
            FROM reminder_ledger l WHERE l.kind = 'reminder' AND l.status IN ('sent', 'unknown') GROUP BY ALL),
        paid AS (
            SELECT invoice_id, min(business_date) AS first_seen_paid FROM invoice_history_daily
            WHERE status = 'paid' OR remaining_minor = 0 GROUP BY invoice_id)
        SELECT r.policy, r.stage, count(*) AS invoices_reached,
               count(p.first_seen_paid) FILTER (WHERE p.first_seen_paid >= r.reminded_at::DATE) AS paid_after,
               round(count(p.first_seen_paid) FILTER (WHERE p.first_seen_paid >= r.reminded_at::DATE) / count(*), 4)
                   AS paid_rate,
               median(date_diff('day', r.reminded_at::DATE, p.first_seen_paid))
                   FILTER (WHERE p.first_seen_paid >= r.reminded_at::DATE) AS median_days_to_pay
        FROM reached r LEFT JOIN paid p USING (invoice_id) GROUP BY r.policy, r.stage""",
    # recovery: a reminder recovered its amount when a later snapshot shows the invoice paid or with nothing left
    "recovery_by_stage": RECOVERY_BY_STAGE,
    # one customer's story, every customer's: emails, skipped stages, escalations, promises, replies, notes
    "customer_timeline": CUSTOMER_TIMELINE,
    "collections_daily": """
        WITH days AS (
            SELECT business_date, currency,
                   count(*) FILTER (WHERE status = 'open' AND remaining_minor > 0) AS open_invoices,
                   count(*) FILTER (WHERE status = 'open' AND remaining_minor > 0 AND days_overdue > 0)
                       AS overdue_invoices,
                   coalesce(sum(remaining_minor) FILTER (WHERE status = 'open' AND days_overdue > 0), 0)
                       AS overdue_amount_minor
            FROM invoice_history_daily GROUP BY ALL),
        sent AS (
            SELECT sent_at::DATE AS business_date, currency, count(*) AS reminders_sent FROM reminder_ledger
            WHERE kind = 'reminder' AND status = 'sent' AND sent_at IS NOT NULL GROUP BY ALL),
        first_paid AS (
            SELECT invoice_id, min(business_date) AS business_date FROM invoice_history_daily
            WHERE status = 'paid' OR remaining_minor = 0 GROUP BY invoice_id),
        recovered AS (
            SELECT f.business_date, r.currency, sum(r.amount_minor) AS amount_recovered_minor
            FROM first_paid f JOIN (
                SELECT invoice_id, any_value(currency) AS currency, arg_max(amount_minor, sent_at) AS amount_minor,
                       min(sent_at::DATE) AS first_sent
                FROM reminder_ledger WHERE kind = 'reminder' AND status = 'sent' AND sent_at IS NOT NULL
                GROUP BY invoice_id) r ON r.invoice_id = f.invoice_id AND f.business_date >= r.first_sent
            GROUP BY ALL)
        SELECT business_date, currency, coalesce(open_invoices, 0) AS open_invoices,
               coalesce(overdue_invoices, 0) AS overdue_invoices,
               coalesce(overdue_amount_minor, 0) AS overdue_amount_minor,
               coalesce(reminders_sent, 0) AS reminders_sent,
               coalesce(amount_recovered_minor, 0) AS amount_recovered_minor
        FROM days FULL JOIN sent USING (business_date, currency) FULL JOIN recovered USING (business_date, currency)""",
    "owed_vs_reminded": """
        WITH owed AS (
            SELECT business_date, currency, count(*) AS owed_invoices, sum(remaining_minor) AS owed_minor
            FROM invoice_history_daily WHERE status = 'open' AND remaining_minor > 0 AND days_overdue > 0 GROUP BY ALL),
        reminded AS (
            SELECT sent_at::DATE AS business_date, currency, count(*) AS reminded_invoices,
                   sum(amount_minor) AS reminded_minor
            FROM reminder_ledger WHERE kind = 'reminder' AND status = 'sent' GROUP BY ALL)
        SELECT business_date, currency, coalesce(owed_invoices, 0) AS owed_invoices,
               coalesce(owed_minor, 0) AS owed_minor,
               coalesce(reminded_invoices, 0) AS reminded_invoices, coalesce(reminded_minor, 0) AS reminded_minor
        FROM owed FULL JOIN reminded USING (business_date, currency)""",
    "open_problems": """
        SELECT idempotency_key, kind, customer_id, invoice_id, stage, status AS problem, last_error AS detail,
               claimed_at AS since, policy, NULL::TIMESTAMPTZ AS waits_until
        FROM reminder_ledger WHERE status IN ('unknown', 'failed')
        UNION ALL
        SELECT a.idempotency_key, a.kind, a.customer_id, a.invoice_id, a.stage, 'held: ' || a.reason, NULL, a.as_of,
               a.policy, a.waits_until
        FROM dunning_audit a
        WHERE a.outcome = 'held' AND NOT a.dry_run
          AND a.run_id = (SELECT run_id FROM dunning_runs WHERE NOT dry_run AND coalesce(outcome, '') <> 'unchanged'
                          ORDER BY finished_wall_at DESC LIMIT 1)""",
    # hand-overs to a collections system (`dunning.send.escalation`): not emails, so not in contact_history
    "escalations": """
        SELECT idempotency_key, invoice_id, customer_id, cycle, policy, status, amount_minor, currency, claimed_at,
               sent_at, attempts, last_error, refused_at
        FROM reminder_ledger WHERE kind = 'escalation'""",
    # delivery feedback: the customers a run held because their address is suppressed, and who must find a new one
    "contacts_to_fix": """
        SELECT a.customer_id, a.email,
               CASE WHEN s.pending_reason IS NOT NULL AND s.until < current_date THEN s.pending_reason
                    ELSE s.reason END AS reason,
               CASE WHEN s.pending_reason IS NOT NULL AND s.until < current_date THEN s.pending_source
                    ELSE s.source END AS source,
               s.created_at AS suppressed_since, a.alerted_at
        FROM suppression_alerts a JOIN suppressions s ON s.active_email = a.email
        WHERE s.until IS NULL OR s.until >= current_date OR s.pending_reason IS NOT NULL""",
    # every exclusion ever made, in force or not: `in_force` judges `until` by the analyst's current date
    "exclusions_overview": """
        SELECT scope, target_id, excluded_by AS who, reason AS why, excluded_at AS since, until_date AS until,
               included_at IS NULL AND (until_date IS NULL OR until_date >= current_date) AS in_force,
               CASE WHEN included_at IS NOT NULL THEN 'included'
                    WHEN until_date < current_date THEN 'until date passed' ELSE 'in force' END AS state,
               updated_at, updated_by, included_at, included_by
        FROM exclusions""",
    "breaker_trips_and_incidents": """
        SELECT created_at AS happened_at, 'breaker trip' AS what, run_id AS reference, message AS detail
        FROM alerts WHERE kind = 'breaker'
        UNION ALL
        SELECT last_recovery_at, 'flood incident', incident_id,
               flooded_customers || ' flooded customer(s), ' || apologies_sent || ' apology(ies) sent'
        FROM incidents""",
}


def _literal(path: Path) -> str:
    """A file path as a SQL string literal (COPY takes no parameter for its target)."""
    return "'" + str(path).replace("'", "''") + "'"


def _count(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    """The value of a `count(*)` query (which always returns a row)."""
    row = next(iter(con.execute(sql).fetchall()), None)
    if row is None:
        raise LookupError(f"query returned no row: {sql}")
    return int(row[0])


def _copy_to(
    con: duckdb.DuckDBPyConnection, source: str, params: list[object] | None = None
) -> Callable[[Path], object]:
    """A writer for `_replace_atomically`: `COPY source TO <path>` as Parquet
    (`source`: a table or a `(SELECT ...)`)."""
    return lambda path: con.execute(f"COPY {source} TO {_literal(path)} (FORMAT parquet)", params)


def _replace_atomically(target: Path, write: Callable[[Path], object]) -> None:
    temporary = target.with_name(f".{target.name}.tmp")
    temporary.unlink(missing_ok=True)
    write(temporary)
    os.replace(temporary, target)


def _whole_manifest(directory: Path) -> dict[str, str]:
    path = directory / WHOLE_TABLES_MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


def _published_rows(directory: Path, table: str, whole: Mapping[str, str]) -> int | None:
    """The rows of `table` as its last publication counted them; None when it has not been published (its
    files or its manifest entry missing)."""
    if table in PARTITIONED_TABLES:
        target = directory / table
        manifest = target / "published.json"
        if not (manifest.exists() and (target / "empty.parquet").exists()):
            return None
        days = json.loads(manifest.read_text())
        if any(not (target / f"{name}.parquet").exists() for name in days):
            return None
        return sum(int(str(f).split(":")[0]) for f in days.values())
    if table not in whole or not (directory / f"{table}.parquet").exists():
        return None
    return int(str(whole[table]).split(":")[0])


def to_republish(home: Path, only: Iterable[str] | None) -> set[str]:
    """The tables a publication limited to `only` (None: every table) must write: those, and any table never
    published (so the analysts' views always have their files)."""
    if only is None:
        return set(PUBLISHED_TABLES)
    directory = Path(os.path.abspath(home)) / "analytics"
    whole = _whole_manifest(directory)
    return set(only) | {t for t in PUBLISHED_TABLES if _published_rows(directory, t, whole) is None}


def publish(
    con: duckdb.DuckDBPyConnection,
    home: Path,
    day_fingerprints: Mapping[str, dict[str, str]] | None = None,
    only: Iterable[str] | None = None,
) -> dict[str, int]:
    """Publish the history tables as Parquet and rebuild the analysts' view file. Returns rows per table.

    `day_fingerprints` (table -> day -> fingerprint, as `day_fingerprints` gives them) are the days of a
    partitioned table as its source counted them, when `con` holds only the rows of the days that changed
    (`changed_days`): a PostgreSQL ledger copies those alone, not the table's whole history. `only`: the tables
    to look at (a dry run's `DRY_RUN_TABLES`); the others keep their files and are counted from their last
    publication, unless they were never published (`to_republish`)."""
    home = Path(os.path.abspath(home))  # the views name their files by absolute path: ATTACH works from anywhere
    directory = home / "analytics"
    directory.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    whole_path = directory / WHOLE_TABLES_MANIFEST
    published = _whole_manifest(directory)
    current: dict[str, str] = {}
    tables = to_republish(home, only)
    for table in PUBLISHED_TABLES:
        if table not in tables:  # as last published: not read, not rewritten
            counts[table] = _published_rows(directory, table, published) or 0
            if table in published:
                current[table] = published[table]
            continue
        if table in PARTITIONED_TABLES:
            given = (day_fingerprints or {}).get(table)
            counts[table] = _publish_by_day(con, table, PARTITIONED_TABLES[table], directory / table, given)
            (directory / f"{table}.parquet").unlink(missing_ok=True)  # the single file of earlier versions
            continue
        # a table published whole is rewritten only when its fingerprint (row count, XOR of its rows' hashes)
        # changed: a dry run or an hour with nothing new rewrites nothing of a million-row invoice_cycles
        rows, content = con.execute(f"SELECT count(*), bit_xor(hash(t)) FROM {table} t").fetchall()[0]
        current[table] = f"{rows}:{content}"
        target = directory / f"{table}.parquet"
        if published.get(table) != current[table] or not target.exists():
            _replace_atomically(target, _copy_to(con, table))
        counts[table] = int(rows)
    _replace_atomically(whole_path, lambda path: path.write_text(json.dumps(current, sort_keys=True)))
    _publish_view_file(home / VIEW_FILE, directory)
    return counts


def day_fingerprints(rows: Iterable[tuple[object, int, object]]) -> dict[str, str]:
    """Day -> fingerprint from (day, row count, content) rows; a day of None is `UNDATED`."""
    return {UNDATED if d is None else str(d): f"{count}:{content}" for d, count, content in rows}


def changed_days(target: Path, current: Mapping[str, str]) -> list[str]:
    """The days of `current` whose published file under `target` is missing or was published from other rows."""
    manifest_path = target / "published.json"
    published = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    return [
        name
        for name, fingerprint in current.items()
        if published.get(name) != fingerprint or not (target / f"{name}.parquet").exists()
    ]


def _publish_by_day(
    con: duckdb.DuckDBPyConnection, table: str, day: str, target: Path, current: dict[str, str] | None = None
) -> int:
    """Rewrite only the days whose fingerprint changed; remove days that no longer exist. Returns the table's rows."""
    target.mkdir(parents=True, exist_ok=True)
    empty = target / "empty.parquet"  # zero rows with the table's columns, so the view works on an empty table
    if not empty.exists():
        _replace_atomically(empty, _copy_to(con, f"(SELECT * FROM {table} LIMIT 0)"))
    manifest_path = target / "published.json"
    published = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if current is None:
        # the fingerprint of a day is its row count and the XOR of its rows' hashes: any insert, delete or
        # update (a status change on an old reminder) changes it; one pass over the table, no copying
        current = day_fingerprints(
            con.execute(f"SELECT {day} AS day, count(*), bit_xor(hash(t)) FROM {table} t GROUP BY ALL").fetchall()
        )
    changed = changed_days(target, current)
    if changed:
        _write_days(con, table, day, target, changed)
    for name in set(published) - set(current):
        (target / f"{name}.parquet").unlink(missing_ok=True)
    _replace_atomically(manifest_path, lambda path: path.write_text(json.dumps(current, sort_keys=True)))
    return sum(int(f.split(":")[0]) for f in current.values())


def _write_days(con: duckdb.DuckDBPyConnection, table: str, day: str, target: Path, days: list[str]) -> None:
    """Write the given days in one pass over the table (PARTITION_BY), then rename each file into place; one day
    (a run's own, the usual case) straight to its file (half the CPU of a partitioned write)."""
    if len(days) == 1:
        _write_day(con, table, day, target, days[0])
        return
    staging = target / ".staging"
    shutil.rmtree(staging, ignore_errors=True)
    dated = [d for d in days if d != UNDATED]
    con.execute(
        f"COPY (SELECT *, {day} AS __day FROM {table} WHERE list_contains(?::DATE[], {day}) OR ({day} IS NULL AND ?)) "
        f"TO {_literal(staging)} (FORMAT parquet, PARTITION_BY (__day))",
        [dated, UNDATED in days],
    )
    for part in staging.iterdir():
        value = part.name.split("=", 1)[1]
        name = UNDATED if value == "__HIVE_DEFAULT_PARTITION__" else value
        files = list(part.glob("*.parquet"))
        if len(files) == 1:
            os.replace(files[0], target / f"{name}.parquet")
        else:  # DuckDB split a large day into several files: write that day alone, as one file
            _write_day(con, table, day, target, name)
    shutil.rmtree(staging, ignore_errors=True)


def _write_day(con: duckdb.DuckDBPyConnection, table: str, day: str, target: Path, name: str) -> None:
    """One day's rows (`UNDATED`: those without a day) to its file, replaced atomically."""
    _replace_atomically(
        target / f"{name}.parquet",
        _copy_to(
            con,
            f"(SELECT * FROM {table} WHERE {day} IS NOT DISTINCT FROM ?::DATE)",
            [None if name == UNDATED else name],
        ),
    )


def _views_digest(directory: Path) -> str:
    """What the view file is built from: the views' text (each names its files under `directory`) and the ledger's
    schema version (a view keeps the column types its files had when it was made)."""
    from dunning.ledger.schema.migrations import LATEST

    text = json.dumps(
        [str(directory), LATEST, PUBLISHED_TABLES, sorted(PARTITIONED_TABLES), sorted(ANALYST_VIEWS.items())]
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _file_state(target: Path) -> list[int] | None:
    try:
        stat = target.stat()
    except OSError:
        return None
    return [stat.st_ino, stat.st_size, stat.st_mtime_ns]


def _guarded(target: Path) -> bool:
    wal = _wal(target)
    return wal.is_symlink() and os.readlink(wal) == WAL_GUARD_TARGET and not wal.exists()


def _views_current(target: Path, directory: Path) -> bool:
    """The view file is as the last publication left it, for the same views, and opens: nothing to rebuild. Its
    views read their Parquet files when queried, so new files (a new day) show without a rebuild. Any change to
    the file since (an analyst who opened it read-write and wrote to it), a log beside it, other views, or an
    analyst holding it read-write: rebuilt."""
    try:
        stamp = json.loads((directory / VIEWS_STAMP).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(stamp, dict)
        and stamp.get("views") == _views_digest(directory)
        and stamp.get("file") == _file_state(target)
        and _guarded(target)
        and _opens_for_reading(target)
    )


def _opens_for_reading(target: Path) -> bool:
    """Another reader can open the file now. An analyst holding it read-write (with no write yet) locks out every
    other process: replacing the file is what frees them, as each publication always did."""
    try:
        with attached(target, read_only=True):
            pass
    except (duckdb.Error, OSError):
        return False
    return True


def _stamp_views(target: Path, directory: Path) -> None:
    stamp = {"views": _views_digest(directory), "file": _file_state(target)}
    _replace_atomically(directory / VIEWS_STAMP, lambda path: path.write_text(json.dumps(stamp)))


def _publish_view_file(target: Path, directory: Path) -> None:
    """Rebuild `analytics.duckdb` unless it is current (`_views_current`: the same views, the file untouched since
    it was built and checked), rename it into place and make sure it opens; raise if it still does not after
    one rebuild. Building and checking it costs three opens of a DuckDB file and its views, about 0.1 s of a
    small run; finding it current, one open.

    An analyst may have opened the old file read-write and written to it, leaving `analytics.duckdb.wal`
    (if their process died, or while it lives). That log belongs to the old file: after the rename DuckDB
    refuses to open the new file with it ("WAL does not match database file"), read-only or not. So any such
    log is removed before and after the rename, and the WAL path is left holding a dangling link
    (`WAL_GUARD_TARGET`): an analyst's process still holding the old (now unlinked) file, which would otherwise
    re-create the log by name on its next write and break every reader of the new file until the next
    publication, gets an error on commit instead. Their own tables in the old file are lost (by design; a
    warning names them).
    """
    if _views_current(target, directory):
        return
    (directory / VIEWS_STAMP).unlink(missing_ok=True)
    _warn_about_analyst_tables(target)
    try:
        _build_view_file(target, directory, guard=True)
        _check_opens(target)
    except (duckdb.Error, OSError) as first:
        log.warning(
            "%s did not open after publication (%s); rebuilding it once more, without the WAL guard", target, first
        )
        try:
            _build_view_file(target, directory, guard=False)
            _check_opens(target)
        except (duckdb.Error, OSError) as second:
            raise RuntimeError(f"the analysts' file {target} does not open after publication: {second}") from second
        return
    try:  # the file is good; a stamp that cannot be written (a full disk) only means the next publication rebuilds
        _stamp_views(target, directory)
    except OSError as error:
        log.warning("could not record %s (%s): the next publication rebuilds the file", directory / VIEWS_STAMP, error)


def _build_view_file(target: Path, directory: Path, guard: bool) -> None:
    temporary = target.with_name(f".{target.name}.tmp")
    _remove_wal(temporary, guard=False)  # the log of a build that died half-way would break this one
    temporary.unlink(missing_ok=True)
    _write_views(temporary, directory)
    _remove_wal(target, guard=guard)  # before the rename: no moment where the new file meets an old log
    os.replace(temporary, target)
    _remove_wal(target, guard=guard)  # after it: a live analyst's process may have written one in between


def _wal(path: Path) -> Path:
    return path.with_name(path.name + ".wal")


def _remove_wal(database: Path, guard: bool) -> None:
    """Remove whatever sits at the database's WAL path (unless it is the guard, and a guard is wanted); then place
    the guard."""
    wal = _wal(database)
    if guard and wal.is_symlink() and os.readlink(wal) == WAL_GUARD_TARGET and not wal.exists():
        return
    if wal.is_dir() and not wal.is_symlink():
        shutil.rmtree(wal)
    else:
        wal.unlink(missing_ok=True)
    if not guard:
        return
    try:
        os.symlink(WAL_GUARD_TARGET, wal)
    except OSError as error:  # a file system without symbolic links: the file still opens, unguarded
        log.warning(
            "could not place the guard at %s (%s): a live analyst's write may break it until the next publication",
            wal,
            error,
        )
        return
    if wal.exists():  # someone made its target: a log written there would be read, so no guard at all
        wal.unlink()
        log.warning("the target of the guard at %s exists; the file is published unguarded", wal)


def _check_opens(path: Path) -> None:
    """Open the published file read-only, as an analyst would, and ask it something; raise if it cannot answer."""
    try:
        with attached(path, read_only=True) as con:
            views = _count(
                con,
                "SELECT count(*) FROM information_schema.tables "
                "WHERE table_type = 'VIEW' AND table_catalog = current_database()",
            )
    except duckdb.IOException as error:
        if "Could not set lock" in str(error):  # an analyst opened it read-write already: it opens
            return
        raise
    if views != len(PUBLISHED_TABLES) + len(ANALYST_VIEWS):
        raise duckdb.InvalidInputException(
            f"{path} holds {views} views, not {len(PUBLISHED_TABLES) + len(ANALYST_VIEWS)}"
        )


def _warn_about_analyst_tables(path: Path) -> None:
    """Warn, naming them, when the file about to be replaced holds tables (not views) an analyst wrote: they will
    be gone.

    Read-only, before any log is removed (so tables still only in a dead analyst's log count too); a file that
    does not open, or is held read-write by an analyst, is skipped: it never stops publication.
    """
    if not path.exists():
        return
    try:
        with attached(path, read_only=True) as con:
            tables = [
                f"{schema}.{name}" if schema != "main" else name
                for schema, name in con.execute(
                    "SELECT table_schema, table_name FROM information_schema.tables "
                    "WHERE table_type = 'BASE TABLE' AND table_catalog = current_database() ORDER BY ALL"
                ).fetchall()
            ]
    except (duckdb.Error, OSError) as error:  # a broken or locked old file must never stop publication
        log.debug("could not look inside %s before replacing it: %s", path, error)
        return
    if tables:
        log.warning(
            "%s holds table(s) the pipeline did not create: %s. Publication replaces the file and they are lost; "
            "keep your own tables in your own DuckDB file and ATTACH this one READ_ONLY",
            path,
            ", ".join(tables),
        )


def _write_views(path: Path, directory: Path) -> None:
    with attached(path) as views:
        for table in PUBLISHED_TABLES:
            files = directory / table / "*.parquet" if table in PARTITIONED_TABLES else directory / f"{table}.parquet"
            views.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet({_literal(files)})")
        for name, sql in ANALYST_VIEWS.items():
            views.execute(f"CREATE VIEW {name} AS {sql}")

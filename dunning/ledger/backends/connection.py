"""Opening the DuckDB file safely, and transactions that can be simulated.

DuckDB lets one process open a file read-write; a second process gets an
IOException about the lock. `open_ledger` waits for it with backoff, gives up
with a clear message, and always lets the file go when its block ends (the
lock goes with it: `duckdb_host` attaches the file to the in-memory DuckDB it
keeps for that file, for the block only). Transactions nest: an inner
`transaction()` joins the outer one, which is
how `simulation()` runs a whole cycle's writes and then rolls them all back
(`sql.SqlConnection`, shared with the PostgreSQL ledger).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import duckdb
import polars as pl

from dunning.errors import LedgerBusy, LedgerUnreadable
from dunning.ledger.backends.duckdb_host import attached
from dunning.ledger.schema.migrations import migrate
from dunning.ledger.sql import PROBE_INSERT, SqlConnection, quote_identifier

CHECKPOINT_THRESHOLD = "1GB"


@contextlib.contextmanager
def connect(path: Path, timeout_seconds: float, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
    """The DuckDB file at `path` for the block (`duckdb_host.attached`), waiting with backoff while another process
    holds its lock."""
    deadline = time.monotonic() + timeout_seconds
    delay = 0.05
    with contextlib.ExitStack() as stack:
        while True:
            try:
                con = stack.enter_context(attached(path, read_only=read_only))
                break
            except duckdb.ResourceInUseException:
                # this process opened the file with `duckdb.connect` (a notebook, a script): join that instance
                con = stack.enter_context(contextlib.closing(duckdb.connect(str(path), read_only=read_only)))
                break
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower():
                    raise _unreadable(path, exc) from None
                if time.monotonic() >= deadline:
                    raise LedgerBusy(
                        f"ledger {path} is held by another process (another dunning run or an open analyst "
                        f"session) and was not released within {timeout_seconds:.0f}s; try again when it finishes"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            except duckdb.ConnectionException:
                raise  # this process holds the file read-only and asks to write, or the reverse (`duckdb_host`)
            except duckdb.Error as exc:  # DuckDB refused the file itself: a checksum that does not match, ...
                raise _unreadable(path, exc) from None
        yield con


def _unreadable(path: Path, error: duckdb.Error) -> LedgerUnreadable:
    reason = str(error).removeprefix("IO Error: ").strip()  # DuckDB's own words
    return LedgerUnreadable(
        f"ledger {path} cannot be opened as a DuckDB database ({reason}); nothing was read or changed: restore it "
        "from your copy (docs/operations.md, Backups), or move it away for a new, empty ledger"
    )


class LedgerConnection(SqlConnection):
    """The ledger's connection on a DuckDB file."""

    lost_claim_errors = (duckdb.TransactionException, duckdb.ConstraintException)
    database_errors: tuple[type[BaseException], ...] = (duckdb.Error,)
    anti_join_new_keys = True
    con: duckdb.DuckDBPyConnection

    def __init__(self, con: duckdb.DuckDBPyConnection):
        super().__init__(con)

    @staticmethod
    def prepare(con: duckdb.DuckDBPyConnection, path: str = ":memory:", memory_limit: str = "2GB") -> None:
        """Session settings, then the schema brought up to date (`migrations`)."""
        con.execute("SET TimeZone = 'UTC'")
        # DuckDB would otherwise cache up to 80% of RAM next to the polars frames; past this it spills to disk
        con.execute("SET memory_limit = ?", [memory_limit])
        # every commit is written and synced to the write-ahead log either way; past this much log DuckDB also
        # checkpoints, rewriting the tables' changed row groups and their whole unique index: at the default 16 MB a
        # new 1M deployment's send checkpointed at nearly every one of its 18 claim commits (commits 8.3 CPU-s of the
        # claims, 2.4 s with this and one checkpoint when the ledger closes)
        con.execute("SET checkpoint_threshold = ?", [CHECKPOINT_THRESHOLD])
        migrate(con, path)

    def frame(self, sql: str, params: Sequence[object] | None = None) -> pl.DataFrame:
        result: pl.DataFrame = self.con.sql(sql, params=params or None).pl()  # `.pl()` is typed Any (it may be lazy)
        return result

    @contextlib.contextmanager
    def _register(self, name: str, frame: pl.DataFrame) -> Iterator[None]:
        self.con.register(name, frame.to_arrow())
        try:
            yield
        finally:
            self.con.unregister(name)

    def interval_of_microseconds(self, expression: str) -> str:
        return f"to_microseconds({expression})"

    def changed_rows(self, sql: str, params: Sequence[object]) -> int:
        row = self.con.execute(sql, list(params)).fetchone()  # DuckDB answers a DML statement with its row count
        return int(row[0]) if row else 0

    def table_digest_sql(self, table: str, where: str = "TRUE") -> str:
        rows = f"SELECT * FROM {quote_identifier(table)} WHERE {where}"
        return f"SELECT count(*), coalesce(bit_xor(hash(t)), 0)::VARCHAR FROM ({rows}) AS t"

    def database_path(self) -> str | None:
        """The file this ledger lives in (None in memory)."""
        rows = self.con.execute(
            "SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchall()  # fmt: skip
        return str(rows[0][0]) if rows and rows[0][0] else None

    def refuses_duplicate_key(self) -> bool:
        probe = f"guard-probe:{uuid.uuid4().hex}"
        try:
            with self.simulation():
                self.con.execute(PROBE_INSERT, [probe])
                self.con.execute(PROBE_INSERT, [probe])
        except (duckdb.ConstraintException, duckdb.TransactionException):
            return True
        return False

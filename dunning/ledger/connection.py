"""Opening the DuckDB file safely, and transactions that can be simulated.

DuckDB lets one process open a file read-write; a second process gets an
IOException about the lock. `open_ledger` waits for it with backoff, gives up
with a clear message, and always closes the connection (the lock goes with
it). Transactions nest: an inner `transaction()` joins the outer one, which is
how `simulation()` runs a whole cycle's writes and then rolls them all back.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import duckdb
import polars as pl

from dunning.errors import LedgerBusy
from dunning.ledger.migrations import migrate


def connect(path: Path, timeout_seconds: float, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + timeout_seconds
    delay = 0.05
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower() or time.monotonic() >= deadline:
                raise LedgerBusy(
                    f"ledger {path} is held by another process (another dunning run or an open analyst "
                    f"session) and was not released within {timeout_seconds:.0f}s; try again when it finishes"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


class _Rollback(Exception):
    pass


class LedgerConnection:
    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.con = con
        self._depth = 0

    @staticmethod
    def prepare(con: duckdb.DuckDBPyConnection, path: str = ":memory:", memory_limit: str = "2GB") -> None:
        """Session settings, then the schema brought up to date (`migrations`)."""
        con.execute("SET TimeZone = 'UTC'")
        # DuckDB would otherwise cache up to 80% of RAM next to the polars frames; past this it spills to disk
        con.execute("SET memory_limit = ?", [memory_limit])
        migrate(con, path)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        if self._depth:
            self._depth += 1
            try:
                yield self.con
            finally:
                self._depth -= 1
            return
        self.con.execute("BEGIN TRANSACTION")
        self._depth = 1
        try:
            yield self.con
        except BaseException:
            self._depth = 0
            self.con.execute("ROLLBACK")
            raise
        self._depth = 0
        self.con.execute("COMMIT")

    @contextlib.contextmanager
    def simulation(self) -> Iterator[None]:
        """Everything written inside is rolled back at the end, whatever happens."""
        try:
            with self.transaction():
                yield
                raise _Rollback
        except _Rollback:
            pass

    def frame(self, sql: str, params: Sequence[object] | None = None) -> pl.DataFrame:
        result: pl.DataFrame = self.con.sql(sql, params=params or None).pl()  # `.pl()` is typed Any (it may be lazy)
        return result

    def scalar(self, sql: str, params: Sequence[object] | None = None) -> object:
        """The first value of the first row, for a query that always returns one (an aggregate)."""
        row = next(iter(self.con.execute(sql, params or []).fetchall()), None)
        if row is None:
            raise LookupError(f"query returned no row: {sql}")
        return row[0]

    @contextlib.contextmanager
    def registered(self, name: str, frame: pl.DataFrame) -> Iterator[str]:
        self.con.register(name, frame.to_arrow())
        try:
            yield name
        finally:
            self.con.unregister(name)

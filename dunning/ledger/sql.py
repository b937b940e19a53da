"""What the ledger's SQL needs from a database connection, whichever database it is.

The claim, operations and state mixins are written once against this class:
`con.execute(sql, params).fetchall()` with `?` placeholders, `frame()` for a
polars frame, `registered(name, frame)` to use a frame as a table in the next
statements, `insert_by_name()` to insert such a frame by column names, and
transactions that nest (an inner `transaction()` joins the outer one, which is
how `simulation()` runs a whole cycle's writes and then rolls them all back).
DuckDB (`connection.LedgerConnection`) and PostgreSQL
(`pg_connection.PgConnection`) implement the parts that differ.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import polars as pl


class Rows(Protocol):
    def fetchall(self) -> list[tuple[Any, ...]]: ...


class Executes(Protocol):
    """A connection whose `execute` takes `?` placeholders and returns something to fetch rows from."""

    def execute(self, query: str, parameters: Any = None, /) -> Any: ...


# the guard's probe: a row no cycle would write, inserted twice inside a rolled-back transaction
PROBE_INSERT = (
    "INSERT INTO reminder_ledger (idempotency_key, kind, customer_id, status) "
    "VALUES (?, 'reminder', 'guard-probe', 'skipped')"
)


class _Rollback(Exception):
    pass


def quote_identifier(name: str) -> str:
    """A table or column name as a quoted SQL identifier (both databases double a double quote inside)."""
    return '"' + name.replace('"', '""') + '"'


def sql_string(text: str) -> str:
    """A name from the schema (never data) as a SQL string literal, for the places that take no parameter."""
    return "'" + text.replace("'", "''") + "'"


class SqlConnection:
    """A ledger connection: nested transactions, simulations, and frames used as tables."""

    # errors that mean "another writer won this claim": the chunk is lost, nothing of it is sent
    lost_claim_errors: tuple[type[BaseException], ...] = ()
    # any error of the database itself (a server gone, a file that cannot be written): the send stops at the first
    database_errors: tuple[type[BaseException], ...] = ()
    # what names this ledger in a message: its file, or the environment variable its DSN came from
    label = "the ledger"
    # whether `insert_by_name(..., new_keys_only=...)` leaves out the rows already there by an anti-join rather than by
    # ON CONFLICT DO NOTHING: on DuckDB (one writer process) the conflict check cost 2.5x the insert it guarded
    # (740,100 skipped stages of a new 1M deployment: 4.2 s against 1.7 s plain, 2.7 s with the anti-join)
    anti_join_new_keys = False
    # whether invoice_history_daily has its unique (business_date, invoice_id) index: on PostgreSQL, where runs of
    # one shard may merge the same day at once, the day is upserted on it (DuckDB has one writer process, and an
    # index over every day's rows would cost it more than the merge's hash joins)
    history_keyed = False

    def __init__(self, con: Executes):
        self.con = con
        self._depth = 0
        self._columns: dict[str, list[str]] = {}  # the columns of each registered frame, by name
        self.simulating = False  # inside `simulation()`: what is written goes, so nothing may leave (an alert)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Executes]:
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
        """Everything written inside is rolled back at the end, whatever happens; `simulating` meanwhile, so that
        nothing leaves that the rollback cannot take back (`dunning.send.alerts` delivers no alert)."""
        outer, self.simulating = self.simulating, True
        try:
            with self.transaction():
                yield
                raise _Rollback
        except _Rollback:
            pass
        finally:
            self.simulating = outer

    def frame(self, sql: str, params: Sequence[object] | None = None) -> pl.DataFrame:
        raise NotImplementedError

    def records(self, sql: str, params: Sequence[object] | None = None) -> list[dict[str, Any]]:
        """The rows as dicts, for a query of a few rows, without a frame: DuckDB makes a polars frame through Arrow,
        imported at the first one (0.15 s that an hour with nothing new, which reads one row, should not pay)."""
        result = self.con.execute(sql, list(params or []))
        names = [column[0] for column in result.description or []]
        return [dict(zip(names, row, strict=True)) for row in result.fetchall()]

    def scalar(self, sql: str, params: Sequence[object] | None = None) -> object:
        """The first value of the first row, for a query that always returns one (an aggregate)."""
        row = next(iter(self.con.execute(sql, list(params or [])).fetchall()), None)
        if row is None:
            raise LookupError(f"query returned no row: {sql}")
        return row[0]

    @contextlib.contextmanager
    def registered(self, name: str, frame: pl.DataFrame) -> Iterator[str]:
        """`frame` usable as the table `name` until the block ends."""
        self._columns[name] = list(frame.columns)
        try:
            with self._register(name, frame):
                yield name
        finally:
            self._columns.pop(name, None)

    def _register(self, name: str, frame: pl.DataFrame) -> contextlib.AbstractContextManager[object]:
        raise NotImplementedError

    def insert_by_name(
        self,
        table: str,
        view: str,
        *,
        on_conflict_do_nothing: bool = False,
        returning: str | None = None,
        order_by: str | None = None,
        new_keys_only: str | None = None,
    ) -> list[tuple[Any, ...]]:
        """Insert every row of the registered frame `view` into `table`, matching columns by name (columns the
        frame lacks get their default); `order_by` is a column of the frame: rows go in, and take their locks, in
        that order. Returns the `returning` column of the rows inserted (empty when not asked).

        `new_keys_only` (the table's unique key column, unique within the frame): rows whose key the table already
        holds are left out, as `on_conflict_do_nothing` does: by an anti-join where the backend has one writer
        (`anti_join_new_keys`: a row another transaction commits meanwhile makes this one fail on the unique
        constraint, which a claim counts as lost), by ON CONFLICT DO NOTHING elsewhere."""
        columns = ", ".join(quote_identifier(c) for c in self._columns[view])
        sql = f"INSERT INTO {quote_identifier(table)} ({columns}) SELECT {columns} FROM {quote_identifier(view)}"
        if new_keys_only is not None and self.anti_join_new_keys:
            key, rows = quote_identifier(new_keys_only), quote_identifier(view)
            sql += f" WHERE NOT EXISTS (SELECT 1 FROM {quote_identifier(table)} t WHERE t.{key} = {rows}.{key})"
        elif new_keys_only is not None:
            on_conflict_do_nothing = True
        if order_by is not None and not (new_keys_only is not None and self.anti_join_new_keys):  # no lock to order
            sql += f" ORDER BY {quote_identifier(order_by)}"
        if on_conflict_do_nothing:
            sql += " ON CONFLICT DO NOTHING"
        if returning is None:
            self.con.execute(sql, [])
            return []
        return list(self.con.execute(sql + f" RETURNING {quote_identifier(returning)}", []).fetchall())

    def interval_of_microseconds(self, expression: str) -> str:
        """SQL for the interval of `expression` (a BIGINT of microseconds): the one function the dialects name
        differently."""
        raise NotImplementedError

    def changed_rows(self, sql: str, params: Sequence[object]) -> int:
        """Run an INSERT, UPDATE or DELETE and return how many rows it changed, without RETURNING: on DuckDB an
        UPDATE ... RETURNING rewrote every column of every matched row (0.4 s for 2,000 outcomes, 20 times the
        UPDATE alone)."""
        raise NotImplementedError

    def copy_new_rows(self, table: str, rows: pl.DataFrame) -> bool:
        """Append `rows` to `table` by the database's bulk path, all or nothing; False, with nothing written, when
        one of them is already there (a unique key: another writer was first). Only where `history_keyed`."""
        raise NotImplementedError

    def table_digest_sql(self, table: str, where: str = "TRUE") -> str:
        """SQL for one row: the row count of `table`'s rows meeting `where` and text that changes whenever any of
        them changes, whatever their order (`dunning.ledger.stores.run_inputs`)."""
        raise NotImplementedError

    def database_path(self) -> str | None:
        """The file this ledger lives in (None when it is not a file of this machine)."""
        return None

    def refuses_duplicate_key(self) -> bool:
        """Whether `reminder_ledger` refuses a second row for one idempotency_key; proven by trying, inside a
        transaction that is rolled back (the guard's first proof)."""
        raise NotImplementedError

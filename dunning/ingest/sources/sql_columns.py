"""Which column types a `kind: sql` query may return, and the SQL that turns each into the snapshot's text.

The query's result is described by the database before it runs (`sql.describe`): each column's name and type. A
required column missing, or a column of a type that cannot mean what the snapshot column means (an amount in
`double precision`, a `due_date` that is a timestamp), is the operator's mistake in `source.query`: `ConfigError`
(exit 2) naming every such column and the cast that fixes it, before a row is read.

Accepted, by column (types by their category in `pg_type`, so `varchar(n)`, `char(n)`, `name`, `citext`, enums and
domains over them count as text):

- `invoice_id`, `customer_id`: text, any integer type, `uuid` (written as their text);
- `amount_due`, `amount_paid`: any integer type, or `numeric`: a value without a fraction as its integer, one with
  a fraction as it is, which the snapshot's rules reject as they reject `12.5` in a CSV (the row is quarantined);
- `due_date`: `date` (written `YYYY-MM-DD`) or text (`YYYY-MM-DD`, parsed and judged as in a CSV);
- `snapshot_at`: `timestamptz`, `timestamp` (taken as UTC) or text; `auto_advance`: `boolean` or text;
  `invoice_lines`: `json`, `jsonb` or text;
- every other snapshot column (`customer_email`, `currency`, `status`, the optional ones): text.

Columns the snapshot does not know are not pulled at all. Every value becomes text on the server, so the file the
run reads is a CSV snapshot like any other, and `dunning.ingest.snapshot` normalizes it the one way it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from dunning.errors import ConfigError
from dunning.ingest.sources.base import OPTIONAL_COLUMNS, REQUIRED_COLUMNS
from dunning.safe_text import for_terminal

INTEGERS = frozenset({20, 21, 23})  # int8, int2, int4
NUMERIC, DATE, BOOLEAN, UUID, BPCHAR = 1700, 1082, 16, 2950, 1042
TIMESTAMPS = frozenset({1114, 1184})  # timestamp, timestamptz
JSON = frozenset({114, 3802})  # json, jsonb
TEXT_CATEGORIES = frozenset({"S", "E"})  # string types (text, varchar, bpchar, name, citext) and enums

# `WITH RECURSIVE` down a domain's chain of base types: a domain over text is text
TYPES_QUERY = """
WITH RECURSIVE chain(oid, base) AS (
    SELECT oid, oid FROM pg_catalog.pg_type WHERE oid = ANY(%s::oid[])
    UNION ALL
    SELECT chain.oid, t.typbasetype FROM chain JOIN pg_catalog.pg_type t ON t.oid = chain.base WHERE t.typtype = 'd'
)
SELECT chain.oid::int8, t.oid::int8, t.typcategory::text, pg_catalog.format_type(chain.oid, NULL)
FROM chain JOIN pg_catalog.pg_type t ON t.oid = chain.base
WHERE t.typtype <> 'd'
"""

IDS = ("invoice_id", "customer_id")
AMOUNTS = ("amount_due", "amount_paid")


@dataclass(frozen=True)
class Column:
    """One column of the query's result as the database described it."""

    name: str
    base_oid: int  # the type's OID, a domain's resolved to the type it is built on
    category: str  # `pg_type.typcategory` of that base type
    type_name: str  # as the database spells it (`double precision`), for the message

    @property
    def is_text(self) -> bool:
        return self.category in TEXT_CATEGORIES


def _accepted(column: Column) -> bool:
    name, oid = column.name, column.base_oid
    if name in IDS:
        return column.is_text or oid in INTEGERS or oid == UUID
    if name in AMOUNTS:
        return oid in INTEGERS or oid == NUMERIC
    if name == "due_date":
        return oid == DATE or column.is_text
    if name == "snapshot_at":
        return oid in TIMESTAMPS or column.is_text
    if name == "auto_advance":
        return oid == BOOLEAN or column.is_text
    if name == "invoice_lines":
        return oid in JSON or column.is_text
    return column.is_text


_WANTED = {
    "ids": "a text type, an integer or a uuid",
    "amounts": "an integer type (minor units), or numeric without a fraction",
    "due_date": "a date, or text YYYY-MM-DD",
    "snapshot_at": "a timestamp(tz) or text",
    "auto_advance": "a boolean or text",
    "invoice_lines": "json, jsonb or text",
}


def _wanted(name: str) -> str:
    if name in IDS:
        return _WANTED["ids"]
    if name in AMOUNTS:
        return _WANTED["amounts"] + f" (e.g. `round(price * 100)::bigint AS {name}`)"
    return _WANTED.get(name, f"a text type (e.g. `x::text AS {name}`)")


def snapshot_columns(columns: Sequence[Column]) -> list[Column]:
    """The query's columns the snapshot reads, in the snapshot's order; ConfigError (exit 2) naming every column
    missing, listed twice or of a type it cannot be, with what it should be."""
    known = (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS)
    names = [c.name for c in columns]
    twice = sorted({n for n in names if names.count(n) > 1 and n in known})
    missing = [n for n in REQUIRED_COLUMNS if n not in names]
    wrong = [c for c in columns if c.name in known and not _accepted(c)]
    problems = []
    if missing:
        problems.append(
            f"it returns no column {', '.join(missing)} (name each with an alias: `SELECT email AS customer_email`)"
        )
    if twice:
        problems.append(f"it returns {', '.join(twice)} more than once")
    problems += [f"column {c.name} is {c.type_name}: it must be {_wanted(c.name)}" for c in wrong]
    if problems:
        raise ConfigError(for_terminal("source.query: " + "; ".join(problems)))
    by_name = {c.name: c for c in columns}
    return [by_name[n] for n in known if n in by_name]


def as_text(column: Column, trim_scale: bool = True) -> sql.Composable:
    """`column` (of the wrapped query `q`) as the snapshot's text, aliased to its name. Most types are written by
    their own output function (COPY's, the cheapest there is: casting every column to `text` first made the pull
    1.5x slower): text and enums as they are, integers, uuids and json as their text, dates as `YYYY-MM-DD` under
    `DateStyle` ISO (`sql.copy_to` sets it). Only these are rewritten: `numeric` (1250.00 is 1250, 12.50 stays a
    fraction for the snapshot's rule to reject as in a CSV; `trim_scale` on PostgreSQL 13+, else a CASE),
    timestamps (ISO 8601 in UTC), booleans (`true`/`false`, not COPY's `t`/`f`) and `char(n)` (its padding
    dropped)."""
    ident = sql.SQL("q.{}").format(sql.Identifier(column.name))
    oid = column.base_oid
    if oid == NUMERIC:
        template = "trim_scale({0})" if trim_scale else "CASE WHEN {0} = trunc({0}) THEN trunc({0}) ELSE {0} END"
        expr = sql.SQL(template).format(ident)
    elif oid == 1184:
        expr = sql.SQL("""to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')""").format(ident)
    elif oid == 1114:
        expr = sql.SQL("""to_char({}, 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')""").format(ident)
    elif oid in (BOOLEAN, BPCHAR):
        expr = sql.SQL("{}::text").format(ident)
    else:
        expr = ident
    return sql.SQL("{} AS {}").format(expr, sql.Identifier(column.name))


def copy_statement(query: str, columns: Sequence[Column], trim_scale: bool = True) -> sql.Composed:
    """`COPY` of the wrapped query's snapshot columns, as text, to the client in CSV with a header. The query goes in
    on lines of its own, so a trailing `--` comment in it cannot swallow the closing parenthesis."""
    return sql.SQL("COPY (SELECT {} FROM (\n{}\n) AS q) TO STDOUT (FORMAT csv, HEADER true)").format(
        sql.SQL(", ").join(as_text(c, trim_scale) for c in columns),
        sql.SQL(query),
    )

"""A CSV file that polars refuses, read record by record: what can be split is kept, each broken line named.

Polars reads a CSV in one fast pass and refuses the whole file at the first
line it cannot take: a line with more fields than the header, a stray quote,
bytes that are not UTF-8. Refusing the file lost every good invoice in it, so
`snapshot.read_snapshot` falls back to this reader, which splits the file into
records itself (a record ends at a line end outside quotes: the quotes of a
line are counted, `""` counting twice), then parses each record alone:

- a record with another number of fields than the header, a quote misplaced
  inside a field, or bytes that are not UTF-8 is kept with its problem and
  line number (`line_problem`), for the quarantine; the other records go on;
- a quote that never closes would swallow every line after it into one
  field: the file cannot be split safely, and it is refused naming the line
  where that quote opened.

Only files polars refused come here: a Python pass over a million lines takes
about a second, which the fast path does not pay.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import polars as pl

from dunning.errors import SnapshotError

LINE_PROBLEM = "line_problem"
_LINES = re.compile(r"[^\n]*\n|[^\n]+\Z")  # lines end at LF (a CR before it stays with the line), as polars reads them
MAX_KEPT = 1000  # characters of a broken field kept as evidence


def _records(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each record; SnapshotError when a quote is left open at the end."""
    records: list[tuple[int, str]] = []
    pending: list[str] = []
    start, odd = 0, False
    for number, line in enumerate(_LINES.findall(text), start=1):
        if not pending:
            start = number
        pending.append(line)
        if line.count('"') % 2:
            odd = not odd
        if not odd:
            records.append((start, "".join(pending)))
            pending = []
    if pending:
        raise SnapshotError(
            f"line {start}: a quote opened there never closes, so every line after it would be one field: the file "
            "cannot be split into rows safely; close the quote and run again"
        )
    return records


def _fields(record: str) -> list[str]:
    return next(csv.reader([record.rstrip("\r\n")], strict=True), [])


def _clean(value: str) -> str:
    """A field as evidence: bytes that were not UTF-8 shown as U+FFFD, cut to `MAX_KEPT` characters."""
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")[:MAX_KEPT]


def read_by_line(path: Path) -> pl.DataFrame:
    """Every record as text columns named by the header, plus `line_problem` (null for a good line)."""
    text = path.read_bytes().decode("utf-8", "surrogateescape")
    try:
        records = _records(text)
    except SnapshotError as error:
        raise SnapshotError(f"snapshot {path}: {error}") from None
    if not records:
        raise SnapshotError(f"snapshot {path} is empty")
    try:
        header = [name.strip() for name in _fields(records[0][1].lstrip("\ufeff"))]
    except csv.Error as error:
        raise SnapshotError(f"snapshot {path}: line 1 (the header) cannot be read: {error}") from None
    if any(_clean(name) != name for name in header) or len(set(header)) != len(header):
        raise SnapshotError(f"snapshot {path}: line 1 (the header) has names that are not UTF-8 or repeat")
    rows: list[list[str | None]] = []
    problems: list[str | None] = []
    for line, record in records[1:]:
        if not record.strip():
            continue
        problem = None
        try:
            fields: list[str] = _fields(record)
        except csv.Error as error:
            fields, problem = [record.rstrip("\r\n")], f"line {line} cannot be read as CSV ({error})"
        if problem is None and len(fields) != len(header):
            problem = f"line {line} has {len(fields)} field(s), the header has {len(header)}"
        if problem is None and any(_clean(f) != f for f in fields):
            problem = f"line {line} is not valid UTF-8"
        kept: list[str | None] = [_clean(f) for f in fields[: len(header)]]
        rows.append(kept + [None] * (len(header) - len(kept)))
        problems.append(problem)
    frame = pl.DataFrame(rows, schema={name: pl.String for name in header}, orient="row")
    return frame.with_columns(pl.Series(LINE_PROBLEM, problems, dtype=pl.String))

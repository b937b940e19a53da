"""What the rejected rows of a snapshot are made of, for a person: the rules broken, the first rows, and a count
explained on its line.

"8 rejected" beside a generator's "7 malformed" reads as a bug until one knows that both copies of an invoice id
given twice with different values are rejected (neither can be trusted). `explain` says it on the count's line;
`breakdown` gives the rules and the first rows alike to a live run, a dry run (which stores nothing in
`snapshot_quarantine`) and `preview`. Rules are fixed text; an invoice id is data and is shown through `repr`.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from dunning.ingest.snapshot_rules import DUPLICATED, decimal_hints

FIRST_ROWS = 5


def breakdown(rejected: pl.DataFrame, limit: int = FIRST_ROWS) -> dict[str, Any]:
    """`by_rule` (rule -> rows, most first), `first_rows` ([line, invoice_id, rule] of the first `limit`),
    `copies` (rows rejected as copies of a duplicated id) and `duplicated_ids` (how many ids those are)."""
    if rejected.is_empty():
        return {"by_rule": {}, "first_rows": [], "copies": 0, "duplicated_ids": 0, "hints": []}
    rules = rejected.select(pl.col("rule").str.split("; ")).explode("rule").group_by("rule").len()
    by_rule = {str(r): int(n) for r, n in rules.sort(["len", "rule"], descending=[True, False]).iter_rows()}
    copies = rejected.filter(pl.col("rule").str.contains(DUPLICATED, literal=True))
    first = rejected.head(limit).select("source_row", "invoice_id", "rule").rows()
    return {
        "by_rule": by_rule,
        "first_rows": [[int(row), inv, str(rule)] for row, inv, rule in first],
        "copies": copies.height,
        "duplicated_ids": int(copies.get_column("invoice_id").n_unique()) if copies.height else 0,
        "hints": decimal_hints(rejected),
    }


def explain(total: int, copies: int, duplicated_ids: int) -> str:
    """`8 rejected (6 rows breaking a rule, 2 copies of 1 invoice id given with different values)`."""
    if not total:
        return "0 rejected"
    if not copies:
        return f"{total} rejected ({total} row(s) breaking a rule)"
    parts = [f"{total - copies} row(s) breaking a rule"] if total > copies else []
    parts.append(f"{copies} copies of {duplicated_ids} invoice id(s) given with different values, each copy rejected")
    return f"{total} rejected ({', '.join(parts)})"


def detail_lines(detail: dict[str, Any], indent: str = "  ") -> list[str]:
    """The rules broken and the first rows, one line each."""
    if not detail.get("by_rule"):
        return []
    lines = [indent + "rules broken: " + "; ".join(f"{r} ({n})" for r, n in detail["by_rule"].items())]
    lines.append(
        indent + "first rows: "
        + "; ".join(f"row {row} (invoice_id={inv!r}): {rule}" for row, inv, rule in detail["first_rows"])
    )  # fmt: skip
    lines += [indent + hint for hint in detail.get("hints", [])]
    return lines

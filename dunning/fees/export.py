"""`dunning fees export`: the charges as a CSV for an accounting system (`post_to: none`).

Every cell comes from data (invoice and customer ids from a snapshot, the basis in words) and a spreadsheet runs a
cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage return as a formula: such a cell is written with a
leading `'` (OWASP's advice on CSV injection), and control characters are never written at all.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import polars as pl

from dunning.safe_text import CONTROL

EXPORT_COLUMNS = (
    "charge_key", "invoice_id", "customer_id", "cycle", "kind", "amount_minor", "currency", "status", "basis",
    "external_id", "claimed_at", "decided_at", "posted_at",
)  # fmt: skip
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def cell(value: object) -> str:
    """One value as a CSV cell no spreadsheet runs."""
    text = "" if value is None else (value.isoformat() if hasattr(value, "isoformat") else str(value))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return text  # a number is a number, also a negative one
    if text.startswith(FORMULA_STARTS):
        text = "'" + text
    return CONTROL.sub(" ", text)


def export_csv(charges: pl.DataFrame, path: Path) -> int:
    """Write `charges` to `path` (replaced whole); returns the rows written."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(EXPORT_COLUMNS)
    for row in charges.iter_rows(named=True):
        writer.writerow([cell(row.get(c)) for c in EXPORT_COLUMNS])
    path.write_text(out.getvalue(), encoding="utf-8")
    return charges.height

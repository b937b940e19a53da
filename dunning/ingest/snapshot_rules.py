"""The snapshot's row rules in words an operator can act on, and the limits they check.

The pandera model that checks them is `snapshot_model`, imported only by a run
that validates a snapshot (pandera's import is a fifth of a second that a
skipped hour, `--version` or a desk command never needs).
"""

from __future__ import annotations

from decimal import Decimal

import polars as pl

STATUSES = ("draft", "open", "paid", "void", "uncollectible")
# longest accepted text per column: ids stay short enough for keys (<= 256) and SMTP lines (<= 998)
MAX_LENGTH = {"invoice_id": 200, "customer_id": 200, "customer_email": 254, "customer_name": 256, "billing_period": 64}
TEXT_COLUMNS = ("invoice_id", "customer_id", "customer_email", "customer_name", "billing_period", "currency", "status")

# (column, pandera check name) -> the rule as the operator reads it
RULES = {
    ("invoice_id", "not_nullable"): "invoice_id is missing",
    ("invoice_id", "non_empty"): "invoice_id is missing",
    ("customer_id", "not_nullable"): "customer_id is missing",
    ("customer_id", "non_empty"): "customer_id is missing",
    ("amount_due", "not_nullable"): "amount_due is not an integer",
    ("amount_due", "greater_than_or_equal_to(0)"): "amount_due is negative",
    ("amount_paid", "not_nullable"): "amount_paid is not an integer",
    ("amount_paid", "greater_than_or_equal_to(0)"): "amount_paid is negative",
    ("due_date", "not_nullable"): "due_date is not a YYYY-MM-DD date",
    ("status", "not_nullable"): "status is missing",
    ("status", f"isin({list(STATUSES)})"): "status is not one of " + "|".join(STATUSES),
    ("currency", "not_nullable"): "currency is missing",
    ("currency", "known_currency"): "currency is not an ISO 4217 code",
    **{(c, "no_control_characters"): f"{c} contains a line break or control character" for c in TEXT_COLUMNS},
    **{(c, "within_length_limit"): f"{c} is longer than {n} characters" for c, n in MAX_LENGTH.items()},
    ("SnapshotRows", "paid_not_above_due"): "amount_paid is greater than amount_due",
    ("SnapshotRows", "unique_invoice_id"): "invoice_id is duplicated with different values",
}


def all_distinct(ids: pl.Series) -> bool:
    """True only when every id is distinct: as many distinct 64-bit hashes as ids proves it (equal ids hash alike)
    at a fifteenth of the cost of `is_duplicated` over ten million strings; any two equal hashes (a duplicate, two
    nulls, or a rare collision) leave the answer to the exact check."""
    return ids.hash().n_unique() == ids.len()


def rule_in_words(column: str, check: str) -> str:
    return RULES.get((column, check), f"{column}: {check}")


DUPLICATED = "invoice_id is duplicated with different values"
REPEATED = "invoice_id is repeated: an identical earlier row was kept, this copy is not"


def split_repeats(frame: pl.DataFrame, ids_distinct: bool) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(`frame` with rows repeated exactly kept once, at the first; the later copies). Every column but
    `source_row` alike is an export that listed an invoice twice: its invoice is dunned once, and the copy is
    quarantined to say so. Rows of one invoice id that differ all stay, for the duplicate rule to reject.
    `ids_distinct`: what `all_distinct` said of the frame's invoice ids (the caller asks once, for the row rules
    too)."""
    if ids_distinct:
        return frame, frame.head(0)
    alike = [c for c in frame.columns if c != "source_row"]
    first = frame.select(pl.struct(alike).is_first_distinct()).to_series()
    return frame.filter(first), frame.filter(~first)


_DECIMAL = r"^-?[0-9]{1,15}[.,][0-9]{1,3}$"


def decimal_hints(rejected: pl.DataFrame) -> list[str]:
    """For an amount rejected as not an integer that is a decimal (`1190.00`): that amounts are integers in minor
    units, and the value it would be (`119000`), from the first such row of each amount column."""
    import babel.numbers

    hints = []
    for column in ("amount_due", "amount_paid"):
        raw = f"{column}_raw"
        if raw not in rejected.columns:
            continue
        found = rejected.filter(
            pl.col("rule").str.contains(f"{column} is not an integer", literal=True)
            & pl.col(raw).str.contains(_DECIMAL)
        ).head(1)
        if found.is_empty():
            continue
        row, text, currency = found.select("source_row", raw, "currency").row(0)
        try:
            digits = babel.numbers.get_currency_precision(str(currency).upper())
        except (ValueError, TypeError, LookupError):
            digits = 2
        value = Decimal(str(text).replace(",", ".")).scaleb(digits)
        expected = f", which is {int(value)} in minor units" if value == value.to_integral_value() else ""
        hints.append(
            f"amounts are integers in minor units of the currency (cents): {column} {str(text)!r} in row {row}"
            f"{expected} ({str(text)} {str(currency)[:3]!s})"
        )
    return hints


def summarize_rejections(rejected: pl.DataFrame, limit: int = 10) -> str:
    """A short operator-facing summary: how many rows, which rules, the first rows by line."""
    if rejected.is_empty():
        return "no rows rejected"
    by_rule = (
        rejected.select(pl.col("rule").str.split("; "))
        .explode("rule")
        .group_by("rule")
        .len()
        .sort("len", descending=True)
    )
    rules = ", ".join(f"{r} ({n})" for r, n in by_rule.rows())
    rows = "; ".join(
        f"row {row} (invoice_id={inv!r}): {rule}"
        for row, inv, rule in rejected.head(limit).select("source_row", "invoice_id", "rule").rows()
    )
    more = f"; and {rejected.height - limit} more" if rejected.height > limit else ""
    hints = "".join(f". {hint}" for hint in decimal_hints(rejected))
    return f"{rejected.height} row(s) rejected by rule: {rules}. {rows}{more}{hints}"

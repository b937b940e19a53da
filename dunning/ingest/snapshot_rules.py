"""The snapshot's row rules, as a pandera model over the typed polars frame.

Validation runs eagerly with `lazy=True` so one pass collects every broken
rule on every row (a LazyFrame would only check the schema). The failure cases
are turned into one quarantine record per rejected input row, naming each rule
in words an operator can act on.
"""

from __future__ import annotations

from decimal import Decimal

import pandera.polars as pa
import polars as pl

from dunning.currencies import CURRENCIES
from dunning.ingest.csv_lines import LINE_PROBLEM
from dunning.safe_text import CONTROL_CLASS

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


class SnapshotRows(pa.DataFrameModel):
    """One row per invoice as the billing system reported it."""

    invoice_id: str = pa.Field(nullable=False)
    customer_id: str = pa.Field(nullable=False)
    customer_email: str = pa.Field(nullable=True)
    currency: str = pa.Field(nullable=False)
    amount_due: pl.Int64 = pa.Field(nullable=False, ge=0)
    amount_paid: pl.Int64 = pa.Field(nullable=False, ge=0)
    due_date: pl.Date = pa.Field(nullable=False)
    status: str = pa.Field(nullable=False, isin=list(STATUSES))
    customer_name: str = pa.Field(nullable=True)
    billing_period: str = pa.Field(nullable=True)

    class Config:
        strict = False  # optional and *_raw columns ride along
        coerce = False

    @pa.check("invoice_id", "customer_id", name="non_empty")
    def _non_empty(cls, data: pa.PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col(data.key).str.len_chars() > 0)

    @pa.check(*TEXT_COLUMNS, name="no_control_characters")
    def _no_control_characters(cls, data: pa.PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(~pl.col(data.key).str.contains(f"[{CONTROL_CLASS}]").fill_null(False))

    @pa.check(*MAX_LENGTH, name="within_length_limit")
    def _within_length_limit(cls, data: pa.PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select((pl.col(data.key).str.len_chars() <= MAX_LENGTH[data.key]).fill_null(True))

    @pa.check("currency", name="known_currency")
    def _known_currency(cls, data: pa.PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col(data.key).is_in(CURRENCIES))

    @pa.dataframe_check(name="paid_not_above_due")
    def _paid_not_above_due(cls, data: pa.PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            ((pl.col("amount_paid") <= pl.col("amount_due")) | (pl.col("amount_due") < 0)).fill_null(True)
        )

    @pa.dataframe_check(name="unique_invoice_id")
    def _unique_invoice_id(cls, data: pa.PolarsData) -> pl.LazyFrame:
        ids = pl.col("invoice_id")
        if _all_distinct(data.lazyframe.select(ids).collect().get_column("invoice_id")):
            return data.lazyframe.select(pl.repeat(True, pl.len()).alias("invoice_id"))
        return data.lazyframe.select(ids.is_null() | ~ids.is_duplicated())


def _all_distinct(ids: pl.Series) -> bool:
    """True only when every id is distinct: as many distinct 64-bit hashes as ids proves it (equal ids hash alike)
    at a fifteenth of the cost of `is_duplicated` over ten million strings; any two equal hashes (a duplicate, two
    nulls, or a rare collision) leave the answer to the exact check."""
    return ids.hash().n_unique() == ids.len()


def _rule(column: str, check: str) -> str:
    return RULES.get((column, check), f"{column}: {check}")


DUPLICATED = "invoice_id is duplicated with different values"
REPEATED = "invoice_id is repeated: an identical earlier row was kept, this copy is not"


def split_repeats(frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(`frame` with rows repeated exactly kept once, at the first; the later copies). Every column but
    `source_row` alike is an export that listed an invoice twice: its invoice is dunned once, and the copy is
    quarantined to say so. Rows of one invoice id that differ all stay, for the duplicate rule to reject."""
    if _all_distinct(frame.get_column("invoice_id")):
        return frame, frame.head(0)
    alike = [c for c in frame.columns if c != "source_row"]
    first = frame.select(pl.struct(alike).is_first_distinct()).to_series()
    return frame.filter(first), frame.filter(~first)


def validate_snapshot(frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split `frame` into (valid rows, rejected rows with a `rule` column listing every broken rule).

    Lines the reader could not take (`csv_lines.LINE_PROBLEM`) are rejected with their problem; an invoice listed
    twice alike is kept once (the copy rejected, `REPEATED`); ids listed with different values are all rejected
    (`DUPLICATED`)."""
    broken = frame.head(0).with_columns(pl.lit(None, dtype=pl.String).alias("rule"))
    if LINE_PROBLEM in frame.columns:
        broken = frame.filter(pl.col(LINE_PROBLEM).is_not_null()).rename({LINE_PROBLEM: "rule"})
        frame = frame.filter(pl.col(LINE_PROBLEM).is_null()).drop(LINE_PROBLEM)
    kept, copies = split_repeats(frame)
    valid, rejected = _validated(kept)
    extra = [
        broken.select(rejected.columns),
        copies.with_columns(pl.lit(REPEATED).alias("rule")).select(rejected.columns),
    ]
    if any(part.height for part in extra):
        rejected = pl.concat([rejected, *extra], how="vertical").sort("source_row")
    return valid, rejected


def _validated(frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    try:
        SnapshotRows.validate(frame, lazy=True)
    except pa.errors.SchemaErrors as errors:
        cases = errors.failure_cases
    else:
        return frame, frame.head(0).with_columns(pl.lit(None, dtype=pl.String).alias("rule"))
    schema_level = cases.filter(pl.col("index").is_null())
    if schema_level.height:
        raise ValueError(f"snapshot columns have the wrong types: {schema_level.select('column', 'check').rows()}")
    rules = (
        cases.select(
            pl.col("index").cast(pl.Int64).alias("_row"),
            pl.struct("column", "check")
            .map_elements(lambda s: _rule(s["column"], s["check"]), return_dtype=pl.String)
            .alias("rule"),
        )
        .unique(maintain_order=True)
        .group_by("_row", maintain_order=True)
        .agg(pl.col("rule").unique(maintain_order=True).str.join("; "))
    )
    indexed = frame.with_row_index("_row").with_columns(pl.col("_row").cast(pl.Int64))
    rejected = indexed.join(rules, on="_row", how="inner").drop("_row").sort("source_row")
    valid = indexed.join(rules, on="_row", how="anti").drop("_row")
    return valid, rejected


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

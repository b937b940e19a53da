"""A synthetic invoice snapshot, so the pipeline can be tried without a billing system.

`make run` needs a snapshot to dun before anyone has connected real data, and the
tests and benchmarks need snapshots of any size whose shape is known in advance.
This module produces one: customers with several invoices each, a realistic mix
of statuses and currencies, open invoices spread across the reminder stages, and
(by default) a handful of malformed rows so the validation path is exercised too.

Everything is vectorised polars: each "random" number is a hash of the row index,
the seed and a stream number, so the same seed gives the same frame (within one
polars version; `Expr.hash` is not stable across versions) and 10 million rows
take seconds, not minutes.
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from polars.expr.whenthen import ChainedThen, Then

INVALID_ROW_COUNT = 7

STATUS_SHARES = (("paid", 0.55), ("open", 0.33), ("void", 0.04), ("draft", 0.04), ("uncollectible", 0.04))
CURRENCY_SHARES = (("USD", 0.45), ("EUR", 0.40), ("JPY", 0.15))
EMAIL_MISSING_SHARE = 0.01
PARTIAL_SHARE_OF_OPEN = 0.25
MIN_AMOUNT, MAX_AMOUNT = 500, 500_000  # minor units (cents, or whole yen)

_NAME_HEADS = (
    "Northwind",
    "Blue Harbor",
    "Alder",
    "Kestrel",
    "Quarry Lane",
    "Meridian",
    "Tamarack",
    "Sakura",
    "Halvorsen",
    "Copperfield",
    "Lindqvist",
    "Orchard",
    "Vantage",
    "Brightwater",
)
_NAME_TRADES = (
    "Logistics",
    "Bakery",
    "Studio",
    "Analytics",
    "Dental",
    "Freight",
    "Outfitters",
    "Robotics",
    "Printing",
    "Consulting",
    "Foods",
    "Architects",
)
_NAME_FORMS = ("Ltd", "GmbH", "Inc.", "SAS", "K.K.", "LLC", "B.V.")

SNAPSHOT_SCHEMA = {
    "invoice_id": pl.Utf8,
    "customer_id": pl.Utf8,
    "customer_email": pl.Utf8,
    "customer_name": pl.Utf8,
    "currency": pl.Utf8,
    "amount_due": pl.Int64,
    "amount_paid": pl.Int64,
    "due_date": pl.Date,
    "status": pl.Utf8,
    "billing_period": pl.Utf8,
}


def _uniform(seed: int, stream: int) -> pl.Expr:
    """A U[0, 1) draw per row: a pure function of (row index, seed, stream)."""
    key = (seed * 1_000_003 + stream) % (1 << 64)
    bits = pl.int_range(pl.len(), dtype=pl.UInt64).hash(key) % (1 << 53)
    return bits.cast(pl.Float64) * 2.0**-53


def _pick(u: pl.Expr, shares: tuple[tuple[str, float], ...]) -> pl.Expr:
    """Map a uniform draw onto labels with the given shares."""
    (first, cut), *rest = shares
    chain: Then | ChainedThen = pl.when(u < cut).then(pl.lit(first))
    for label, share in rest[:-1]:
        cut += share
        chain = chain.when(u < cut).then(pl.lit(label))
    return chain.otherwise(pl.lit(rest[-1][0]))


def _pick_name(u: pl.Expr, names: tuple[str, ...]) -> pl.Expr:
    index = (u * len(names)).cast(pl.Int64)
    return index.replace_strict(dict(enumerate(names)), return_dtype=pl.Utf8)


def _customers(n_customers: int, seed: int) -> pl.DataFrame:
    """One row per customer; currency and email are decided here, once per customer."""
    width = max(6, len(str(n_customers)))
    customer_id = pl.lit("cus_") + (pl.col("n") + 1).cast(pl.Utf8).str.zfill(width)
    return pl.select(n=pl.int_range(n_customers, dtype=pl.Int64)).select(
        customer_id=customer_id,
        customer_email=pl.when(_uniform(seed, 1) >= EMAIL_MISSING_SHARE).then(
            pl.lit("billing+") + customer_id + pl.lit("@example.com")
        ),
        customer_name=pl.concat_str(
            [
                _pick_name(_uniform(seed, 2), _NAME_HEADS),
                _pick_name(_uniform(seed, 3), _NAME_TRADES),
                _pick_name(_uniform(seed, 4), _NAME_FORMS),
            ],
            separator=" ",
        ),
        currency=_pick(_uniform(seed, 5), CURRENCY_SHARES),
    )


def generate_snapshot(
    n_invoices: int, *, as_of: dt.date, seed: int = 7, invoices_per_customer: float = 5.0
) -> pl.DataFrame:
    """A deterministic invoice snapshot of `n_invoices` rows as seen on `as_of` (columns: SNAPSHOT_SCHEMA)."""
    if n_invoices < 0:
        raise ValueError(f"n_invoices must be >= 0, got {n_invoices}")
    if invoices_per_customer <= 0:
        raise ValueError(f"invoices_per_customer must be > 0, got {invoices_per_customer}")
    n_customers = max(1, round(n_invoices / invoices_per_customer))
    # u**1.5 skews invoices towards low customer numbers: a few big customers, a long tail of small ones.
    frame = pl.select(n=pl.int_range(n_invoices, dtype=pl.Int64)).with_columns(
        customer_n=(_uniform(seed, 10).pow(1.5) * n_customers).cast(pl.Int64).clip(0, n_customers - 1),
        status=_pick(_uniform(seed, 11), STATUS_SHARES),
        amount_due=(MIN_AMOUNT * (MAX_AMOUNT / MIN_AMOUNT) ** _uniform(seed, 12))
        .round()
        .cast(pl.Int64)
        .clip(MIN_AMOUNT, MAX_AMOUNT),
    )
    customer_cols = _customers(n_customers, seed).select(pl.all().gather(frame["customer_n"]))

    is_partial = (pl.col("status") == "open") & (_uniform(seed, 13) < PARTIAL_SHARE_OF_OPEN)
    # Among partial payments, about 30% have paid 90% or more (the "almost settled" case).
    paid_fraction = (
        pl.when(_uniform(seed, 14) < 0.3)
        .then(0.90 + 0.09 * _uniform(seed, 15))
        .otherwise(0.05 + 0.85 * _uniform(seed, 15))
    )
    partial_amount = (pl.col("amount_due") * paid_fraction).floor().cast(pl.Int64)
    u_days = _uniform(seed, 16)
    due_offset_days = (
        pl.when(pl.col("status") == "open")
        .then(-40 + (u_days * 61).floor())  # 40 days overdue .. 20 ahead
        .when(pl.col("status") == "draft")
        .then(5 + (u_days * 26).floor())  # 5 .. 30 days ahead
        .otherwise(-(u_days * 91).floor())  # 90 .. 0 days ago
    ).cast(pl.Int64)
    width = max(7, len(str(n_invoices)))

    return (
        pl.concat([frame, customer_cols], how="horizontal")
        .with_columns(
            invoice_id=pl.lit("in_") + (pl.col("n") + 1).cast(pl.Utf8).str.zfill(width),
            amount_paid=pl.when(pl.col("status") == "paid")
            .then(pl.col("amount_due"))
            .when(is_partial)
            .then(partial_amount.clip(1, pl.col("amount_due") - 1))
            .otherwise(0)
            .cast(pl.Int64),
            due_date=pl.lit(as_of, dtype=pl.Date) + pl.duration(days=due_offset_days),
        )
        .with_columns(
            billing_period=pl.col("due_date").dt.month_start().dt.offset_by("-1mo").dt.strftime("%Y-%m"),
        )
        .select([pl.col(name).cast(dtype) for name, dtype in SNAPSHOT_SCHEMA.items()])
    )


def with_invalid_rows(df: pl.DataFrame, *, seed: int = 7) -> pl.DataFrame:
    """`df` with every column as text and INVALID_ROW_COUNT malformed rows appended, one broken rule each.

    In order: null invoice_id, negative amount_due, amount_paid > amount_due, unknown status,
    unknown currency, an invoice_id duplicating an existing open invoice, unparsable due_date.
    (The negative-amount row has amount_paid "0"; nothing non-negative can be <= -500.)
    """
    if df.is_empty():
        raise ValueError("with_invalid_rows needs at least one row to model the malformed rows on")
    text = df.select(pl.all().cast(pl.Utf8))
    open_rows = text.filter(pl.col("status") == "open")
    pool = open_rows if not open_rows.is_empty() else text
    template = pool.sample(1, seed=seed).row(0, named=True) | {"status": "open", "amount_paid": "0"}
    duplicate_id = pool.sample(1, seed=seed + 1)["invoice_id"][0]

    width = max(7, len(str(text.height)))  # the same padding generate_snapshot uses
    start = text.height + 1
    while text["invoice_id"].is_in([f"in_{start + k:0{width}d}" for k in range(INVALID_ROW_COUNT)]).any():
        start += INVALID_ROW_COUNT
    fresh_ids = [f"in_{start + k:0{width}d}" for k in range(INVALID_ROW_COUNT)]

    due = int(template["amount_due"])
    breakages: list[dict[str, str | None]] = [
        {"invoice_id": None},
        {"amount_due": "-500"},
        {"amount_paid": str(due + 100)},
        {"status": "overdue"},
        {"currency": "ZZZ"},
        {"invoice_id": duplicate_id},
        {"due_date": "2026-13-45"},
    ]
    assert len(breakages) == INVALID_ROW_COUNT
    bad_rows = [
        template | {"invoice_id": fresh_id} | broken for fresh_id, broken in zip(fresh_ids, breakages, strict=True)
    ]
    bad = pl.DataFrame(bad_rows, schema={name: pl.Utf8 for name in text.columns}, orient="row")
    return pl.concat([text, bad], how="vertical")


def write_snapshot(df: pl.DataFrame, path: Path) -> Path:
    """Write `df` as CSV or Parquet, chosen by the file suffix; returns `path`."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise ValueError(f"unsupported snapshot suffix {path.suffix!r}: use .csv or .parquet")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".csv":
        df.write_csv(path)
    else:
        df.write_parquet(path)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dunning.demo", description="Write a synthetic invoice snapshot.")
    parser.add_argument("--out", type=Path, required=True, help="output file, .csv or .parquet")
    parser.add_argument("--invoices", type=int, default=2000, help="number of valid invoices (default 2000)")
    parser.add_argument(
        "--as-of", type=dt.date.fromisoformat, default=None, help="snapshot date YYYY-MM-DD (default: today, UTC)"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-invalid", action="store_true", help="do not append malformed rows")
    args = parser.parse_args(argv)
    if args.invoices < 1:
        parser.error("--invoices must be at least 1")
    if args.out.suffix.lower() not in (".csv", ".parquet"):
        parser.error(f"--out must end in .csv or .parquet, got {args.out.suffix!r}")
    as_of = args.as_of or dt.datetime.now(dt.UTC).date()

    df = generate_snapshot(args.invoices, as_of=as_of, seed=args.seed)
    malformed = 0
    if not args.no_invalid:
        df, malformed = with_invalid_rows(df, seed=args.seed), INVALID_ROW_COUNT
    path = write_snapshot(df, args.out)
    # one malformed row repeats an open invoice's id with other values: both copies are rejected, so a run says
    # one more rejected row than there are malformed ones
    why = (
        f" ({malformed} malformed: {malformed - 1} breaking a rule, 1 repeating an invoice id with other values; a run "
        f"rejects {malformed + 1}, since both copies of that id are rejected)"
        if malformed
        else " (0 malformed)"
    )
    print(f"demo snapshot: {df.height} rows{why} -> {path}")


if __name__ == "__main__":
    main()

"""Every contact of a customer: the snapshot's optional `customer_cc` (addresses separated by commas) copied on
each reminder, each address judged on its own.

- Each copy address is held to the rule `customer_email` is held to (`safe_text.is_address`, at most
  MAX_ADDRESS characters): one that breaks it is left out and counted (`cc_dropped`), never the reason a reminder
  is not sent; the primary address and repeats (any case) are left out too; at most MAX_CC copies.
- A suppressed address (guarantee 15) is left out. When the primary is suppressed and a copy address is not, the
  first such address becomes `To` (`primary_email` keeps the primary, so the `contact_suppressed` alert still asks
  for a new one); all suppressed: the key is held `suppressed` as before.
- `recipients`: every address the message goes to, `To` first, what `reminder_ledger.recipients` records.

Recipients change nothing else: the breaker counts per customer, the keys are the invoices'.
"""

from __future__ import annotations

from collections.abc import Iterable

import polars as pl

from dunning.safe_text import is_address
from dunning.vocabulary import MAX_CC

MAX_ADDRESS = 254
MAX_CC_TEXT = 4096


def split_cc(text: str | None, primary: str | None) -> tuple[list[str], int]:
    """The valid copy addresses of `text` in order, without the primary and repeats, and how many were dropped."""
    if not text:
        return [], 0
    kept: list[str] = []
    dropped = 0
    seen = {primary.strip().lower()} if primary else set()
    parts = text[:MAX_CC_TEXT].split(",")
    for part in parts:
        address = part.strip()
        if "<" in address and address.endswith(">"):  # `Bob <bob@example.com>`, as `customer_email` is read
            address = address[address.rfind("<") + 1 : -1].strip()
        if not address:
            continue
        if len(address) > MAX_ADDRESS or not is_address(address):
            dropped += 1
            continue
        if address.lower() in seen:
            continue
        if len(kept) == MAX_CC:
            dropped += 1
            continue
        seen.add(address.lower())
        kept.append(address)
    return kept, dropped


SCHEMA = {
    "customer_email": pl.String, "customer_cc": pl.String, "primary_email": pl.String, "recipients": pl.String,
    "cc_dropped": pl.Int32,
}  # fmt: skip


def resolve(cycled: pl.DataFrame, suppressed: Iterable[str]) -> pl.DataFrame:
    """`cycled` with each row's recipients decided (module docstring): `customer_email` the `To`, `customer_cc`
    the copies (comma-separated, or null), `primary_email` the snapshot's primary when a copy took its place,
    `recipients`, and `cc_dropped`."""
    held = {s.lower() for s in suppressed}
    order = [c for c in cycled.columns if c not in SCHEMA] + list(SCHEMA)
    if "customer_cc" not in cycled.columns:
        cycled = cycled.with_columns(pl.lit(None, dtype=pl.String).alias("customer_cc"))
    with_cc = cycled.filter(pl.col("customer_cc").is_not_null() & (pl.col("customer_cc").str.strip_chars() != ""))
    if with_cc.is_empty():
        return cycled.with_columns(
            pl.lit(None, dtype=pl.String).alias("customer_cc"),
            pl.lit(None, dtype=pl.String).alias("primary_email"),
            pl.col("customer_email").alias("recipients"),
            pl.lit(0, dtype=pl.Int32).alias("cc_dropped"),
        ).select(order)
    pairs = with_cc.select("customer_email", "customer_cc").unique()
    decided = []
    for primary, given in pairs.iter_rows():
        copies, dropped = split_cc(given, primary)
        live = [a for a in copies if a.lower() not in held]
        to, moved = primary, None
        if primary and primary.lower() in held and live:
            to, moved, live = live[0], primary, live[1:]
        recipients = ",".join([a for a in (to, *live) if a])
        decided.append((primary, given, to, ",".join(live) or None, moved, recipients or None, dropped))
    resolved = pl.DataFrame(
        decided,
        schema={"_primary": pl.String, "_given": pl.String, **SCHEMA},
        orient="row",
    )
    out = cycled.rename({"customer_email": "_primary", "customer_cc": "_given"}).join(
        resolved, on=["_primary", "_given"], how="left", nulls_equal=True, maintain_order="left"
    )
    return out.with_columns(
        pl.when(pl.col("_given").is_null() | (pl.col("_given").str.strip_chars() == ""))
        .then(pl.col("_primary"))
        .otherwise(pl.col("customer_email"))
        .alias("customer_email"),
        pl.col("recipients").fill_null(pl.col("_primary")),
        pl.col("cc_dropped").fill_null(0),
    ).select(order)

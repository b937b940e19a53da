"""The circuit breaker as a pandera rule over per-customer email counts.

The counts join the send batch (emails this cycle would send, per customer)
with the ledger's emails in the rolling window that ends at the cycle's clock.
Validation is eager with `lazy=True`, so one failure lists every customer over
the cap, with their count, for the alert and the operator.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from dunning.config import Breaker

if TYPE_CHECKING:
    import pandera.polars as pa

BREAKER_CHECK = "emails_per_customer_within_cap"


def breaker_schema(breaker: Breaker) -> pa.DataFrameSchema:
    import pandera.polars as pa  # imported by a run that checks a batch only (a fifth of a second of every start)

    return pa.DataFrameSchema(
        {
            "customer_id": pa.Column(str, nullable=False, unique=True),
            "emails_in_window": pa.Column(
                pl.Int64,
                pa.Check.le(
                    breaker.max_emails,
                    name=BREAKER_CHECK,
                    error=f"more than {breaker.max_emails} emails in {breaker.window_hours} h",
                ),
            ),
        },
        name="customer_email_counts",
    )


@dataclass(frozen=True)
class BreakerVerdict:
    passed: bool
    counts: pl.DataFrame  # customer_id, batch_emails, recent_emails, emails_in_window
    offenders: pl.DataFrame  # the rows of `counts` over the cap
    breaker: Breaker

    def describe(self, limit: int = 20) -> str:
        if self.passed:
            return "breaker: every customer within the cap"
        names = ", ".join(
            f"{c} ({n} emails: {r} already sent + {b} in this batch)"
            for c, n, r, b in self.offenders.head(limit)
            .select("customer_id", "emails_in_window", "recent_emails", "batch_emails")
            .rows()
        )
        more = f" and {self.offenders.height - limit} more" if self.offenders.height > limit else ""
        return (
            f"circuit breaker tripped: {self.offenders.height} customer(s) would receive more than "
            f"{self.breaker.max_emails} emails in {self.breaker.window_hours} h: {names}{more}"
        )


def email_counts(batch: pl.DataFrame, recent: pl.DataFrame) -> pl.DataFrame:
    """`batch`: sendable due rows with `customer_id`, `email_group`; `recent`: customer_id, emails."""
    in_batch = batch.group_by("customer_id").agg(pl.col("email_group").n_unique().cast(pl.Int64).alias("batch_emails"))
    return (
        in_batch.join(
            recent.select("customer_id", pl.col("emails").cast(pl.Int64).alias("recent_emails")),
            on="customer_id",
            how="left",
        )
        .with_columns(pl.col("recent_emails").fill_null(0))
        .with_columns((pl.col("batch_emails") + pl.col("recent_emails")).alias("emails_in_window"))
        .sort("emails_in_window", "customer_id", descending=[True, False])
    )


def evaluate_breaker(batch: pl.DataFrame, recent: pl.DataFrame, breaker: Breaker) -> BreakerVerdict:
    import pandera.polars as pa  # as in `breaker_schema`

    counts = email_counts(batch, recent)
    try:
        breaker_schema(breaker).validate(counts, lazy=True)
    except pa.errors.SchemaErrors as errors:
        rows = errors.failure_cases.filter(pl.col("column") == "emails_in_window").get_column("index").cast(pl.Int64)
        offenders = counts.with_row_index("_i").filter(pl.col("_i").cast(pl.Int64).is_in(rows.implode())).drop("_i")
        return BreakerVerdict(False, counts, offenders, breaker)
    return BreakerVerdict(True, counts, counts.head(0), breaker)


def breaker_window(as_of: dt.datetime, breaker: Breaker) -> tuple[dt.datetime, dt.datetime]:
    """(as_of - window, as_of + window]: emails stamped after the clock count too, so a run whose clock is
    earlier than sends already on record (a re-run with an older --as-of, a worker with a skewed clock)
    still sees them and holds the cap."""
    width = dt.timedelta(hours=breaker.window_hours)
    return as_of - width, as_of + width

"""Prepared homes for benchmarks: a snapshot plus a ledger that already holds 30 earlier daily cycles.

The history is what the policy itself would have recorded: every reminder
that was due up to `HISTORY_LAG_DAYS` before the benchmark's clock, claimed on
the day it became due (so spread over the 30 days before), with the cycle
state to match. `history_factor` adds closed cycles of invoices that left the
snapshot (paid long ago), so the ledger can be doubled without changing the
work that is new today.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl

from dunning.config import DunningConfig
from dunning.demo import generate_snapshot, write_snapshot
from dunning.ingest.snapshot import read_snapshot
from dunning.ledger.backends.duckdb_ledger import open_ledger
from dunning.ledger.schema.tables import LEDGER_COLUMNS
from dunning.plan.policy import STATE_SCHEMA, assign_cycles, plan_reminders

HISTORY_LAG_DAYS = 7  # about 10% of invoices newly due on the benchmark day


def _history_rows(plan: pl.DataFrame, as_of: dt.datetime, factor: int) -> pl.DataFrame:
    sent_day = pl.col("due_date").cast(pl.Datetime("us", "UTC")) + pl.duration(days=pl.col("stage_days"))
    earliest = as_of - dt.timedelta(days=30 + HISTORY_LAG_DAYS)
    rows = plan.with_columns(
        pl.when(pl.col("role") == "due").then(pl.lit("sent")).otherwise(pl.lit("skipped")).alias("status"),
        pl.lit("history").alias("run_id"),
        pl.max_horizontal(sent_day, pl.lit(earliest)).alias("claimed_at"),
        pl.col("idempotency_key").alias("email_id"),
        pl.lit(None, dtype=pl.String).alias("message_id"),
    ).select(LEDGER_COLUMNS)
    fillers = [
        rows.with_columns(
            pl.concat_str([pl.lit(f"dunning:old{n}_"), pl.col("invoice_id"), pl.lit(":1:"), pl.col("stage")]).alias(
                "idempotency_key"
            ),
            pl.concat_str([pl.lit(f"old{n}_"), pl.col("invoice_id")]).alias("invoice_id"),
            (pl.col("claimed_at") - pl.duration(days=60 * n)).alias("claimed_at"),
        )
        for n in range(1, factor)
    ]
    return pl.concat([rows, *fillers]).with_columns(pl.col("claimed_at").alias("sent_at"))


def prepare_home(home: Path, n_invoices: int, as_of: dt.datetime, history_factor: int = 1) -> dict:
    """Write HOME/bench-snapshot.parquet and HOME/dunning.duckdb with the history; returns sizes."""
    home.mkdir(parents=True, exist_ok=True)
    snapshot_path = write_snapshot(generate_snapshot(n_invoices, as_of=as_of.date()), home / "bench-snapshot.parquet")
    config = DunningConfig()
    valid = read_snapshot(snapshot_path, config.zone).drop(
        "amount_due_raw", "amount_paid_raw", "due_date_raw", strict=False
    )
    before = as_of - dt.timedelta(days=HISTORY_LAG_DAYS)
    cycled = assign_cycles(valid, pl.DataFrame(schema=STATE_SCHEMA), before, config)
    plan = plan_reminders(cycled, config)
    history = _history_rows(plan, as_of, history_factor)
    state = plan.filter(pl.col("role") == "due").select(
        "invoice_id",
        "cycle",
        pl.lit(True).alias("cycle_open"),
        pl.lit(before).alias("opened_at"),
        pl.lit(None, dtype=pl.Datetime("us", "UTC")).alias("closed_at"),
        pl.col("stage").alias("last_stage"),
        pl.col("stage_days").alias("last_stage_days"),
    )
    opened = (
        cycled.filter(pl.col("cycle_action") == "open")
        .join(state, on="invoice_id", how="anti")
        .select(
            "invoice_id",
            "cycle",
            pl.lit(True).alias("cycle_open"),
            pl.lit(before).alias("opened_at"),
            pl.lit(None, dtype=pl.Datetime("us", "UTC")).alias("closed_at"),
            pl.lit(None, dtype=pl.String).alias("last_stage"),
            pl.lit(None, dtype=pl.Int32).alias("last_stage_days"),
        )
    )
    with open_ledger(home / "dunning.duckdb") as ledger:
        with ledger.registered("history", history), ledger.registered("state", pl.concat([state, opened])):
            ledger.con.execute(
                f"INSERT INTO reminder_ledger ({', '.join(LEDGER_COLUMNS)}, sent_at) SELECT * FROM history"
            )
            ledger.con.execute("INSERT INTO invoice_cycles BY NAME SELECT * FROM state")
        ledger.con.execute("CHECKPOINT")
    return {"invoices": n_invoices, "ledger_rows": history.height, "snapshot": str(snapshot_path)}

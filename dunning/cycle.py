"""One dunning cycle as plain functions, so Dagster assets, the resume guard and tests share them.

Each step takes what the previous one returned; none of them knows about
Dagster. The ledger is passed in, so a caller can run a whole cycle inside a
transaction and roll it back (the guard's simulated pass).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from checks.snapshot_schema import summarize_rejections, validate_snapshot
from dunning.config import DunningConfig
from dunning.ledger.base import Ledger
from dunning.policy import assign_cycles, plan_reminders, stages_frame
from dunning.sending import with_email_ids
from dunning.snapshot import read_snapshot


@dataclass(frozen=True)
class ValidatedSnapshot:
    valid: pl.DataFrame
    rejected: pl.DataFrame

    @property
    def summary(self) -> str:
        return summarize_rejections(self.rejected)


def load_snapshot(path: str | Path, config: DunningConfig) -> ValidatedSnapshot:
    """Read and validate; raises SnapshotError only when the file itself is unusable."""
    valid, rejected = validate_snapshot(read_snapshot(path, config.zone))
    return ValidatedSnapshot(valid.drop("amount_due_raw", "amount_paid_raw", "due_date_raw"), rejected)


def cycle_snapshot(ledger: Ledger, valid: pl.DataFrame, config: DunningConfig, as_of: dt.datetime) -> pl.DataFrame:
    """The valid snapshot with each invoice's cycle, days overdue and whether it is owed and sendable."""
    return assign_cycles(valid, ledger.invoice_state(), as_of, config)


def plan_cycle(cycled: pl.DataFrame, config: DunningConfig) -> pl.DataFrame:
    """Every reminder key this cycle must record, `role` due or skipped; due rows carry their email ids."""
    planned = plan_reminders(cycled, config)
    due = with_email_ids(planned.filter(pl.col("role") == "due"), config)
    skipped = planned.filter(pl.col("role") == "skipped").with_columns(
        pl.lit(None, dtype=pl.String).alias("email_group"),
        pl.lit(None, dtype=pl.String).alias("email_id"),
        pl.lit(None, dtype=pl.String).alias("message_id"),
    )
    return pl.concat([due, skipped.select(due.columns)], how="vertical") if due.height or skipped.height else due


def due_rows(plan: pl.DataFrame) -> pl.DataFrame:
    return plan.filter(pl.col("role") == "due")


def sendable_due(plan: pl.DataFrame) -> pl.DataFrame:
    return plan.filter((pl.col("role") == "due") & pl.col("sendable"))


def skipped_rows(plan: pl.DataFrame) -> pl.DataFrame:
    return plan.filter(pl.col("role") == "skipped")


def stage_names(config: DunningConfig) -> list[str]:
    return stages_frame(config).get_column("stage").to_list()

"""Where things are kept, and for how long: `ledger:` (DuckDB or PostgreSQL), `store:` (the snapshot store of
`dunning ingest`) and `retention:` (what the hourly job and `dunning prune` let go; never the ledger)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from dunning.config.base import Count, EnvName, Strict
from dunning.urls import store_url_problem


class LedgerSettings(Strict):
    """Where the ledger lives: `duckdb` (HOME/dunning.duckdb, one machine) or `postgres` (shared by several homes
    and workers). The PostgreSQL DSN is read only from the environment variable named by `dsn_env`, never from
    this file: it may hold a password."""

    kind: Literal["duckdb", "postgres"] = "duckdb"
    """`duckdb`: HOME/dunning.duckdb, one machine. `postgres`: a PostgreSQL database shared by several homes and shard
    workers."""
    dsn_env: EnvName = "DUNNING_POSTGRES_DSN"
    """`postgres`: the name of the environment variable holding the libpq URL (it may hold a password, so never this
    file)."""


class Store(Strict):
    """Where `dunning ingest` leaves the validated snapshot split by shard, for the shard runs to read."""

    url: str | None = Field(default=None, min_length=1, max_length=4096)
    """A directory, or `s3://bucket/prefix` (credentials and endpoint from the AWS environment variables, never this
    file: a URL with credentials in it is refused); none: `HOME/store`."""

    @field_validator("url")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        problem = store_url_problem(value) if value is not None else None
        if problem is not None:
            raise ValueError(f"{problem} (the value is not shown: it may hold a credential)")
        return value


class Retention(Strict):
    """What the hourly job and `dunning prune` let go, judged on the wall clock (never on `--as-of`). Decisions are
    kept a year and more: the ledger (keys, outcomes, the audit, alerts, suppressions) is never pruned; the machinery
    around it (Dagster's runs, ingests, journals, inbox leftovers) only weeks."""

    runs_days: Count = Field(default=30, ge=1, le=3660)
    """Dagster runs (with their event logs and compute logs) and schedule and sensor ticks older than this many days
    are deleted, except failures (`failed_runs_days`)."""
    failed_runs_days: Count = Field(default=90, ge=1, le=3660)
    """Failed and canceled Dagster runs, and failed ticks, are kept this many days."""
    ingests_keep: Count = Field(default=48, ge=1, le=100_000)
    """The newest ingests kept in the snapshot store (`dunning ingest`); older ones are deleted, never the one a
    shard of the current hour may read."""
    inbox_days: Count = Field(default=30, ge=1, le=3660)
    """Files the webhook inbox set aside as unreadable (`HOME/inbox/webhooks/unreadable/`), and temporary files a
    receiver left, older than this many days are deleted."""
    delivery_events_days: Count = Field(default=365, ge=1, le=36_600)
    """`delivery_events` rows (bounce and complaint reports) recorded more than this many days ago are deleted, but
    never one that was allowed to suppress (so importing it again stays a repeat); suppressions are never deleted."""

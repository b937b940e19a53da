"""The ledger interface the pipeline depends on; DuckDB implements it today.

Assets and the send loop call only these methods, so a PostgreSQL backend
(`INSERT ... ON CONFLICT DO NOTHING RETURNING` works the same there) can be
added without touching them.
"""

from __future__ import annotations

import datetime as dt
from typing import Protocol

import polars as pl


class Ledger(Protocol):
    def invoice_state(self) -> pl.DataFrame: ...

    def record_snapshot(self, run_id: str, as_of: dt.datetime, cycled: pl.DataFrame) -> None: ...

    def quarantine(self, run_id: str, source: str, rejected: pl.DataFrame, at: dt.datetime) -> None: ...

    def expire_stale_claims(self, run_id: str, now: dt.datetime) -> int: ...

    def claim(self, due: pl.DataFrame, skipped: pl.DataFrame, run_id: str, claimed_at: dt.datetime) -> set[str]: ...

    def record_outcomes(self, outcomes: pl.DataFrame, sent_at: dt.datetime | None, wall: dt.datetime) -> None: ...

    def unknown_with_message_ids(self) -> pl.DataFrame: ...

    def open_problems(self) -> pl.DataFrame: ...

    def emails_in_window(self, since: dt.datetime, until: dt.datetime) -> pl.DataFrame: ...

    def add_alert(self, kind: str, message: str, at: dt.datetime, run_id: str | None = None,
                  details: str | None = None, severity: str = "critical") -> str: ...

    def write_audit(self, run_id: str, audit: pl.DataFrame, counts: dict[str, int], as_of: dt.datetime,
                    dry_run: bool, snapshot_rows: int) -> None: ...

"""The local mirror of a billing source's invoices, kept under the home: `HOME/sources/<kind>/mirror.parquet`.

The first pull of a source is complete and becomes the mirror. After that each pull asks only for what changed
since the cursor (`base.Pull`) and `merged` folds it in: a changed invoice's row replaces its old one, an id the
source says was deleted drops out, every other row stays. Every `source.full_sync_hours` a complete pull replaces
the mirror whole, which also drops an invoice deleted without a trace and catches anything an incremental pull
missed. A changed row that knows less about its customer than the mirror did (Stripe's events carry the customer as
an id, not the expanded object with its language and segment) keeps what the mirror knew of the same customer.

The cursor and the time of the last full pull are kept in the Parquet file's own metadata, so the mirror and its
cursor are written together, under a temporary name renamed over the old file: a cursor never moves unless its
pull is stored, and a pull that failed leaves the mirror and its cursor as they were.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from dunning.errors import SnapshotError
from dunning.ingest.sources.base import Pull
from dunning.ingest.sources.normalize import MIRROR_SCHEMA, conform, frame
from dunning.private_files import private_dir

MIRROR_DIR = "sources"
FORMAT = "1"
# what a row may know less of than the mirror did about the same customer (an event's unexpanded customer)
CUSTOMER_FACTS = ("customer_locale", "segment", "customer_name", "customer_cc", "customer_timezone")


@dataclass(frozen=True)
class Mirror:
    rows: pl.DataFrame  # MIRROR_SCHEMA, one row per invoice id
    cursor: str | None  # where the next incremental pull starts
    full_at: dt.datetime | None  # when the last complete pull was stored


def mirror_path(home: Path, kind: str) -> Path:
    return home / MIRROR_DIR / kind / "mirror.parquet"


def load(home: Path, kind: str) -> Mirror | None:
    """The stored mirror of `kind`, or None before its first pull; SnapshotError naming the file when unreadable (a
    full pull replaces it: delete it, or wait for `full_sync_hours`)."""
    path = mirror_path(home, kind)
    if not path.is_file():
        return None
    try:
        meta = pl.read_parquet_metadata(path)
        rows = pl.read_parquet(path)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise SnapshotError(f"the mirror {path} cannot be read ({type(exc).__name__}); delete it to pull all") from None
    full_at = meta.get("dunning_full_at")
    return Mirror(
        rows=conform(rows),
        cursor=meta.get("dunning_cursor") or None,
        full_at=dt.datetime.fromisoformat(full_at) if full_at else None,
    )


def needs_full(mirror: Mirror | None, wall: dt.datetime, full_sync_hours: int, incremental: bool) -> bool:
    """Whether this pull must be complete: no mirror yet, no cursor, the source cannot pull changes, or the last
    complete pull is `full_sync_hours` old."""
    if mirror is None or mirror.cursor is None or mirror.full_at is None or not incremental:
        return True
    return wall - mirror.full_at >= dt.timedelta(hours=full_sync_hours)


def _dedupe(rows: pl.DataFrame) -> pl.DataFrame:
    return rows.unique("invoice_id", keep="last", maintain_order=True)


def merged(mirror: Mirror | None, pull: Pull) -> pl.DataFrame:
    """The mirror with `pull` applied (module docstring)."""
    new = _dedupe(conform(pull.frame) if pull.frame is not None else frame(pull.rows))
    if pull.complete or mirror is None:
        return new.filter(~pl.col("invoice_id").is_in(pl.Series(pull.deleted, dtype=pl.String).implode()))
    old = mirror.rows
    known = old.select("invoice_id", "customer_id", *[pl.col(c).alias(f"_old_{c}") for c in CUSTOMER_FACTS])
    new = (
        new.join(known, on=["invoice_id", "customer_id"], how="left")
        .with_columns(*[pl.coalesce(pl.col(c), pl.col(f"_old_{c}")).alias(c) for c in CUSTOMER_FACTS])
        .select(MIRROR_SCHEMA.names())
    )
    gone = pl.Series([*pull.deleted, *new.get_column("invoice_id").to_list()], dtype=pl.String).implode()
    kept = old.filter(~pl.col("invoice_id").is_in(gone))
    removed = set(pull.deleted)
    return pl.concat(
        [kept, new.filter(~pl.col("invoice_id").is_in(pl.Series(sorted(removed), dtype=pl.String).implode()))]
    )


def store(home: Path, kind: str, rows: pl.DataFrame, cursor: str | None, full_at: dt.datetime | None) -> Path:
    """Write the mirror and its cursor together (module docstring)."""
    path = mirror_path(home, kind)
    private_dir(path.parent)
    partial = path.with_name(f".{path.name}.part")
    metadata = {"dunning_mirror": FORMAT, "dunning_cursor": cursor or "",
                "dunning_full_at": full_at.isoformat() if full_at else ""}  # fmt: skip
    try:
        rows.select(MIRROR_SCHEMA.names()).write_parquet(partial, metadata=metadata)
        with partial.open("rb") as written:
            os.fsync(written.fileno())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def merge_rows(home: Path, kind: str, rows: list[dict[str, str | None]]) -> bool:
    """Invoices fetched back for webhooks merged into the stored mirror, its cursor and full pull's time unchanged;
    False when there is no mirror yet (the first pull brings them)."""
    current = load(home, kind)
    if current is None:
        return False
    store(home, kind, merged(current, Pull(rows, complete=False, cursor=None)), current.cursor, current.full_at)
    return True

"""`dunning ingest`: validate the hour's snapshot once, and leave it in the store split by shard.

With `--shard K/N` every shard used to read and validate the whole snapshot, then keep its customers: N shards did
N times the ingest. Now one ingest run does the reading, the validation, the quarantine of rejected rows, the
stale-snapshot and halt decisions, once; it writes one Parquet part per shard (the accepted rows of that shard's
customers, with the snapshot's time in `snapshot_at`) and, last, the manifest (`dunning.ingest.store`). A shard run
then reads only its part (`shard_snapshot`): 1/N of the rows, validated again in passing (cheap at 1/N, and the
same code path as any snapshot file), with nothing rejected and the ingest's snapshot time for the stale rule.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from dunning.config import DunningConfig
from dunning.errors import InvalidRowsHalt, SnapshotError, SnapshotRefused
from dunning.ingest.snapshot import OPTIONAL_COLUMNS, REQUIRED_COLUMNS
from dunning.ingest.store import Manifest, Part, SnapshotStore, choose_manifest, parquet_bytes, part_path
from dunning.ledger.base import Ledger
from dunning.run import cycle, snapshot_guard, steps
from dunning.sharding import shard_of


@dataclass(frozen=True)
class IngestResult:
    manifest: Manifest
    store_url: str


def store_url(config: DunningConfig, home: Path) -> str:
    return config.store.url or str(home / "store")


def split_by_shard(valid: pl.DataFrame, shards: int) -> dict[int, pl.DataFrame]:
    """The accepted rows per shard: each distinct customer hashed once (`dunning.sharding.shard_of`); a row without a
    customer id is shard 0's, as `Shard.keep` has it."""
    ids = valid.get_column("customer_id").cast(pl.String).drop_nulls().unique()
    owners = pl.DataFrame({"customer_id": ids, "_shard": [shard_of(i, shards) for i in ids.to_list()]},
                          schema={"customer_id": pl.String, "_shard": pl.Int32})  # fmt: skip
    tagged = valid.join(owners, on="customer_id", how="left").with_columns(pl.col("_shard").fill_null(0))
    parts = tagged.partition_by("_shard", as_dict=True, include_key=False)
    return {k: parts.get((k,), valid.clear()) for k in range(shards)}


def part_frame(rows: pl.DataFrame, taken_at: dt.datetime) -> pl.DataFrame:
    """A part as a snapshot file: the input columns the snapshot had, typed, and `snapshot_at` the ingest's."""
    columns = [c for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if c in rows.columns and c != "snapshot_at"]
    return rows.select(*columns).with_columns(pl.lit(taken_at, dtype=pl.Datetime("us", "UTC")).alias("snapshot_at"))


def ingest(
    ledger: Ledger, path: str, config: DunningConfig, home: Path, *, as_of: dt.datetime, wall: dt.datetime,
    run_id: str, allow_stale: bool = False, allow_shrink: bool = False, source: str | None = None,
) -> IngestResult:  # fmt: skip
    """Validate `path` once and store it split into `config.shards` parts (module docstring). The whole snapshot's
    size is judged here, once (`snapshot_guard`: `source` names the billing source it was pulled from)."""
    whole = cycle.load_snapshot(path, config)
    taken_at = cycle.snapshot_taken_at(whole.valid, as_of)
    read = whole.valid.height + whole.rejected.height
    snapshot_guard.refuse_empty(ledger, read, path, config, source=source, live=True, run_id=run_id, as_of=as_of)
    snapshot_guard.refuse_stale(ledger, taken_at, allow_stale)
    snapshot_guard.refuse_shrunk(ledger, whole.valid.height, path, config, allow_shrink=allow_shrink, source=source,
                                 live=True, run_id=run_id, as_of=as_of)  # fmt: skip
    if whole.rejected.height and config.on_invalid_rows == "halt":
        raise InvalidRowsHalt(f"snapshot rejected (on_invalid_rows: halt): {whole.summary}")
    if whole.rejected.height and whole.valid.is_empty():
        raise SnapshotRefused(f"snapshot {path}: none of its rows was accepted: {whole.summary}")
    if whole.rejected.height:  # quarantined once, here, not by every shard
        ledger.quarantine(run_id, path, whole.rejected, wall)
        steps.alert_duplicates(ledger, whole.rejected, config, as_of, run_id)  # the parts hold none of them
    ingest_id = f"{as_of.astimezone(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:8]}"  # its as-of, in UTC
    data, parts = {}, []
    for shard, rows in split_by_shard(whole.valid, config.shards).items():
        blob = parquet_bytes(part_frame(rows, taken_at), taken_at, whole.valid.height)
        data[shard] = blob
        parts.append(
            Part(shard, part_path(ingest_id, shard, config.shards), rows.height, hashlib.sha256(blob).hexdigest())
        )
    manifest = Manifest(ingest_id, as_of, taken_at, config.shards, whole.valid.height, whole.rejected.height,
                        str(path), tuple(parts), written_at=dt.datetime.now(dt.UTC))  # fmt: skip
    store = SnapshotStore(store_url(config, home))
    store.write_ingest(manifest, data)
    return IngestResult(manifest, store.url)


def reads_the_store(config: DunningConfig, home: Path) -> bool:
    """Whether a shard run given no snapshot reads its part of an ingest: with a store configured or already used,
    or with no billing source to pull from (the manifest wins over pulling the source)."""
    return config.store.url is not None or (home / "store").is_dir() or config.source.kind == "none"


def cron_interval(config: DunningConfig, as_of: dt.datetime) -> dt.timedelta:
    """The interval of `schedule.cron` that ends at `as_of`: from the tick before the one at or before `as_of` to
    that tick, in real time (UTC), so a daylight-saving change neither shrinks nor doubles it. How old an ingest a
    shard may read: Friday's 09:00 for Monday's 09:00 under `0 9 * * 1-5`."""
    from croniter import croniter

    local = as_of.astimezone(config.zone) + dt.timedelta(seconds=1)  # a tick at `as_of` itself is "at or before"
    ticks = croniter(config.schedule.cron, local)
    last: dt.datetime = ticks.get_prev(dt.datetime)
    before: dt.datetime = ticks.get_prev(dt.datetime)
    return max(last.astimezone(dt.UTC) - before.astimezone(dt.UTC), dt.timedelta(minutes=1))


def shard_snapshot(config: DunningConfig, home: Path, shards: int, index: int, as_of: dt.datetime) -> Path:
    """The local file of part `index` of the newest ingest this shard run may read (downloaded once under
    HOME/snapshots/), or SnapshotError naming the ingest that is missing."""
    store = SnapshotStore(store_url(config, home))
    within = cron_interval(config, as_of)
    manifest = choose_manifest(store.manifests(since=as_of - within, until=as_of), as_of, shards, within)
    if manifest is None:
        raise SnapshotError(
            f"shard {index}/{shards}: no ingest of {shards} parts in {store.url} taken at or before "
            f"{as_of.isoformat()} and within {within} of it; run `dunning ingest` for this hour first"
        )
    local = home / "snapshots" / f"ingest-{manifest.ingest_id}-part-{index}-of-{shards}.parquet"
    if not local.exists():
        data = store.read_part(manifest, index)
        local.parent.mkdir(parents=True, exist_ok=True)
        temporary = local.with_suffix(".partial")
        temporary.write_bytes(data)
        temporary.replace(local)
    return local

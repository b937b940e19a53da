"""Retention: what a home lets go, so it does not grow for ever (`retention:`; the hourly job and `dunning prune`).

Decisions are kept and machinery is not. The ledger (keys, outcomes, the audit, alerts, suppressions, exclusions,
quarantines) is never pruned; of it only `delivery_events` rows go, after `delivery_events_days` (a year), the
suppressions they caused staying. The machinery goes after weeks: Dagster's runs (`pipelines.instance`), the
ingests beyond the newest `ingests_keep` and their local copies, the hand-over journals of finished runs, and the
webhook inbox's leftovers. Pulled snapshots keep `source.snapshot_retention_days`, as each pull prunes them.

Every age is judged on the wall clock (`now`), like claim leases, never on a run's `--as-of`: a backfill or a run
replayed for a past hour must not delete what today still needs. Each part is pruned on its own; one that fails is
reported (`Pruned.errors`) and the others still run, so the caller decides whether a failure matters (the hourly
job logs it: pruning never fails or holds up a send).

What must never go:
- the ingest a shard of the current hour may read, and any written for an hour since the interval began;
- the journal of a run that still holds claims (a later run reads it to tell `unknown` from never handed over,
  `dunning.send.handover`), of a run Dagster reports live, or one written within the claim lease.
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dunning.config import DunningConfig
from dunning.ingest.sources.pulls import snapshots_dir
from dunning.ingest.store import SnapshotStore, choose_manifest
from dunning.ledger.base import Ledger
from dunning.run import ingest
from dunning.run.inbox import inbox_dir
from dunning.send.handover import JOURNAL_DIR, SUFFIX, journal_path


@dataclass(frozen=True)
class Removal:
    """One kind of thing let go: how many, and the bytes they held on disk (0 where it cannot be told: rows)."""

    what: str
    count: int
    size: int = 0


@dataclass
class Pruned:
    dry_run: bool
    removals: list[Removal] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one line per part that failed: its name and the error
    ledger_busy: bool = False  # the ledger stayed locked: its parts (journals, delivery events) waited

    @property
    def freed(self) -> int:
        return sum(r.size for r in self.removals)

    def lines(self) -> list[str]:
        """What went (or, dry, would go) and what it freed, for a person."""
        verb = "would remove" if self.dry_run else "removed"
        shown = [r for r in self.removals if r.count]
        lines = [f"{verb}: {r.count} {r.what}" + (f" ({human_bytes(r.size)})" if r.size else "") for r in shown]
        if not shown:
            lines.append(f"{verb}: nothing (everything is within retention:)")
        lines.append(f"{'would free' if self.dry_run else 'freed'} {human_bytes(self.freed)} in all")
        lines += [f"not pruned: {e}" for e in self.errors]
        return lines


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def file_size(path: Path) -> int:
    """The bytes of a file, or of every file under a directory (0 for what is gone)."""
    try:
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return path.stat().st_size
    except OSError:
        return 0


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def older_than(paths: Iterable[Path], cutoff: dt.datetime) -> list[Path]:
    """The paths last written before `cutoff` (by their modification time)."""
    found = []
    for path in paths:
        try:
            if dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC) < cutoff:
                found.append(path)
        except OSError:
            continue
    return found


def let_go(what: str, paths: Sequence[Path], dry_run: bool) -> Removal:
    size = sum(file_size(p) for p in paths)
    if not dry_run:
        for path in paths:
            remove(path)
    return Removal(what, len(paths), size)


def prune_ingests(config: DunningConfig, home: Path, now: dt.datetime, dry_run: bool) -> list[Removal]:
    """The ingests beyond the newest `ingests_keep`, never one a shard of the current hour may read nor one for an
    hour since its interval began; and the local copies of parts (HOME/snapshots/ingest-*) of ingests not kept."""
    if config.store.url is None and not (home / "store").is_dir():
        return []  # this home never ingested
    store = SnapshotStore(ingest.store_url(config, home))
    ids = store.ingest_ids()  # oldest first: an id starts with its as-of
    within = ingest.cron_interval(config, now)
    current = choose_manifest(store.manifests(since=now - within, until=now), now, config.shards, within)
    recent = (now - within).astimezone(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    kept = set(ids[-config.retention.ingests_keep :]) | {i for i in ids if i[:16] >= recent}
    if current is not None:
        kept.add(current.ingest_id)
    old = [i for i in ids if i not in kept]
    size = 0
    for ingest_id in old:
        size += sum(n for _, n in store.ingest_objects(ingest_id)) if dry_run else store.delete_ingest(ingest_id)
    copies = [p for p in snapshots_dir(home).glob("ingest-*-part-*.parquet")
              if p.name.removeprefix("ingest-").split("-part-")[0] not in kept]  # fmt: skip
    return [
        Removal(f"ingest(s) in {store.url}", len(old), size),
        let_go("local copies of their parts", copies, dry_run),
    ]


def prune_journals(
    home: Path, claim_owners: Sequence[str], live_runs: Callable[[list[str]], set[str]], now: dt.datetime,
    lease: dt.timedelta, dry_run: bool,
) -> Removal:  # fmt: skip
    """The journals of finished runs that hold no claims (module docstring)."""
    directory = home / JOURNAL_DIR
    journals = sorted(directory.glob("*" + SUFFIX)) if directory.is_dir() else []
    holding = {journal_path(directory, owner).name for owner in claim_owners}
    candidates = [p for p in older_than(journals, now - lease) if p.name not in holding]
    live = live_runs([p.name[: -len(SUFFIX)] for p in candidates]) if candidates else set()
    finished = [p for p in candidates if p.name[: -len(SUFFIX)] not in live]
    return let_go("hand-over journal(s) of finished runs", finished, dry_run)


def prune_inbox(home: Path, config: DunningConfig, now: dt.datetime, dry_run: bool) -> Removal:
    """Files the inbox set aside as unreadable, and temporary files a receiver left, older than `inbox_days`."""
    directory = inbox_dir(home)
    leftovers = [*directory.glob("unreadable/*"), *directory.glob(".incoming-*")] if directory.is_dir() else []
    cutoff = now - dt.timedelta(days=config.retention.inbox_days)
    return let_go("webhook inbox leftover(s) (unreadable, temporary)", older_than(leftovers, cutoff), dry_run)


def prune_delivery_events(ledger: Ledger, config: DunningConfig, now: dt.datetime, dry_run: bool) -> Removal:
    cutoff = now - dt.timedelta(days=config.retention.delivery_events_days)
    with ledger.transaction():
        count = ledger.delivery_events_before(cutoff) if dry_run else ledger.delete_delivery_events(cutoff)
    return Removal("delivery_events row(s)", count)


def prune_home(
    ledger: Ledger | None, home: Path, config: DunningConfig, now: dt.datetime, *, dry_run: bool,
    live_runs: Callable[[list[str]], set[str]], pruned: Pruned | None = None,
) -> Pruned:  # fmt: skip
    """Prune everything of the home but Dagster's storage (`pipelines.instance.prune_instance`) into `pruned`.
    Without a ledger (busy), the parts that need it (journals, delivery events) wait for the next time."""
    pruned = pruned if pruned is not None else Pruned(dry_run)
    lease = dt.timedelta(minutes=config.claim_lease_minutes)
    parts: list[tuple[str, Callable[[], list[Removal]]]] = [
        ("ingests", lambda: prune_ingests(config, home, now, dry_run)),
        ("webhook inbox", lambda: [prune_inbox(home, config, now, dry_run)]),
    ]
    if ledger is not None:
        parts += [
            ("journals", lambda: [prune_journals(home, ledger.claim_owners(""), live_runs, now, lease, dry_run)]),
            ("delivery events", lambda: [prune_delivery_events(ledger, config, now, dry_run)]),
        ]
    for name, part in parts:
        try:
            pruned.removals += part()
        except Exception as error:  # noqa: BLE001 - one part's failure never stops the others
            pruned.errors.append(f"{name}: {type(error).__name__}: {str(error)[:300]}")
    return pruned

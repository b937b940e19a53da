"""Pulling from the billing source (`source: {kind: stripe|chargebee|recurly}`) into files under HOME/snapshots/, so a
run can be replayed from exactly what it saw.

- `pull_invoices`: the source's invoices since the mirror's cursor (all of them on the first pull and every
  `source.full_sync_hours`), merged into the mirror (`mirror`: stored with its cursor first), and the mirror as it
  then stands written as the run's snapshot, `HOME/snapshots/<UTC wall time>-<kind>.parquet` (snapshot columns as
  text, which `dunning run --snapshot FILE` reads as it is); then the pulled files older than
  `source.snapshot_retention_days` (by the time in their name) are deleted. Nothing else in the directory is
  touched.
- `poll_events`: the billing events newer than the ledger's cursor (Stripe: `invoice.payment_failed` and the
  payment signals, a dispute looked up to its invoice; Chargebee and Recurly: `base.BillingSource.signals`),
  written as a JSON array to `<UTC wall time>-<kind>-events.json` (`--events FILE` reads it), with the cursor to
  stage.

Files are written under a temporary name and renamed, so a failed pull leaves
no half file behind.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from zoneinfo import ZoneInfo

import polars as pl

from dunning.config import Source
from dunning.errors import BillingSourceFailed
from dunning.ingest.sources import mirror, open_source
from dunning.ingest.sources.base import BillingSource
from dunning.private_files import private_dir
from dunning.safe_text import has_control

SNAPSHOTS_DIR = "snapshots"
EVENTS_CURSOR = "stripe:invoice.payment_failed"  # the `source_cursors` row of the payment-failed poll
_STAMP = "%Y-%m-%dT%H%M%S.%fZ"
UTC = ZoneInfo("UTC")
PULLED_NAME = re.compile(
    r"^(\d{4}-\d{2}-\d{2}T\d{6}\.\d{6}Z)-(stripe|chargebee|recurly|sql)(-events)?\.(json|parquet|csv)$"
)
MAX_EVENT_ID = 200
EVENT_KINDS = ("stripe", "chargebee", "recurly")  # the sources with payment signals to poll (`sql` has none)


def snapshots_dir(home: Path) -> Path:
    return home / SNAPSHOTS_DIR


def events_cursor(settings: Source) -> str:
    """The `source_cursors` row of the source's events poll (Stripe's keeps its old name)."""
    return EVENTS_CURSOR if settings.kind == "stripe" else f"{settings.kind}:events"


def _new_path(directory: Path, wall: dt.datetime, suffix: str, extension: str = "json") -> Path:
    """A name no earlier pull of this home took (two pulls in one microsecond: the later one a microsecond on)."""
    at = wall.astimezone(dt.UTC)
    while True:
        path = directory / f"{at.strftime(_STAMP)}-{suffix}.{extension}"
        if not path.exists():
            return path
        at += dt.timedelta(microseconds=1)


def _write_atomically(path: Path, chunks: Iterable[str]) -> None:
    partial = path.with_name(f".{path.name}.part")
    try:
        with partial.open("w", encoding="utf-8") as out:
            for chunk in chunks:
                out.write(chunk)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


@contextlib.contextmanager
def _atomically(path: Path) -> Iterator[BinaryIO]:
    """A file written under a temporary name and renamed to `path` only when the block ends without an error."""
    partial = path.with_name(f".{path.name}.part")
    try:
        with partial.open("wb") as out:
            yield out
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _write_frame_atomically(path: Path, rows: pl.DataFrame) -> None:
    partial = path.with_name(f".{path.name}.part")
    try:
        rows.write_parquet(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def pull_invoices(
    settings: Source,
    home: Path,
    wall: dt.datetime,
    environ: Mapping[str, str] = os.environ,
    *,
    zone: ZoneInfo = UTC,
    source: BillingSource | None = None,
) -> Path:
    """The source's changes (or everything) merged into its mirror, and the mirror written as a new pulled snapshot
    file; returns its path. BillingSourceFailed (exit 7) when the API fails (nothing stored, no cursor moved),
    ConfigError (exit 2) when the key's variable is unset. `zone`: the business timezone, which due dates are in.
    A `sql` source is a table the operator keeps: every pull is its whole query, streamed by `COPY` straight into
    the run's CSV snapshot (`sources.sql`), with no mirror to merge into."""
    if settings.kind == "sql":
        return _pull_sql(settings, home, wall, environ)
    source = source or open_source(settings, environ)
    current = mirror.load(home, settings.kind)
    full = mirror.needs_full(current, wall, settings.full_sync_hours, source.incremental)
    pull = source.pull(None if full or current is None else current.cursor, zone)
    rows = mirror.merged(None if full else current, pull)
    cursor = pull.cursor if pull.cursor is not None or full or current is None else current.cursor
    full_at = wall if full or current is None else current.full_at
    mirror.store(home, settings.kind, rows, cursor, full_at)  # the pull is stored: its cursor with it
    directory = private_dir(snapshots_dir(home))  # whole customer records: the owner's alone
    path = _new_path(directory, wall, settings.kind, "parquet")
    _write_frame_atomically(path, rows)
    prune_pulled(directory, wall, settings.snapshot_retention_days)
    return path


def _pull_sql(settings: Source, home: Path, wall: dt.datetime, environ: Mapping[str, str]) -> Path:
    from dunning.ingest.sources import sql  # here: psycopg is not every command's import

    directory = private_dir(snapshots_dir(home))  # customers' addresses and balances: the owner's alone
    path = _new_path(directory, wall, "sql", "csv")
    with _atomically(path) as out:
        sql.copy_to(settings, out, environ)
    prune_pulled(directory, wall, settings.snapshot_retention_days)
    return path


def pulled_at(path: Path) -> dt.datetime | None:
    """When a pulled file was pulled (from its name), or None for any other file."""
    match = PULLED_NAME.match(path.name)
    if match is None:
        return None
    try:
        return dt.datetime.strptime(match.group(1), _STAMP).replace(tzinfo=dt.UTC)
    except ValueError:
        return None


def prune_pulled(directory: Path, wall: dt.datetime, retention_days: int) -> list[Path]:
    """Delete the pulled files (named by `pull_invoices` / `poll_events`) pulled more than `retention_days` before
    `wall`; every other file stays. A file that cannot be deleted now is left for the next pull."""
    cutoff = wall - dt.timedelta(days=retention_days)
    removed = []
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        at = pulled_at(path)
        if at is None or at >= cutoff or not path.is_file():
            continue
        try:
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


@dataclass(frozen=True)
class PolledEvents:
    path: Path | None  # the events file; None when there was nothing new
    newest_id: str | None  # the cursor once their notices are claimed
    count: int


def poll_events(
    settings: Source,
    home: Path,
    cursor: str | None,
    as_of: dt.datetime,
    wall: dt.datetime,
    environ: Mapping[str, str] = os.environ,
) -> PolledEvents:
    """The payment-failed events newer than `cursor` and created within `events_lookback_days` before `as_of`, kept
    in a new events file."""
    since = as_of - dt.timedelta(days=settings.events_lookback_days)
    if settings.kind != "stripe":
        signals = open_source(settings, environ).signals(cursor, since)
        events, newest = signals.events, signals.cursor
    else:
        from dunning.ingest.sources import stripe_api  # here: the SDK is a tenth of a second of a run's start

        key = stripe_api.api_key(settings, environ)
        with stripe_api.api_errors(settings, "polling payment-failed events"):
            events = stripe_api.new_payment_failed_events(stripe_api.client(settings, key), cursor, since)
        if any(e.get("type") == "charge.dispute.created" for e in events):
            from dunning.ingest.sources.stripe_source import StripeSource

            events = StripeSource(settings, environ).disputes_with_invoices(events)
        newest = events[-1]["id"] if events else None
    if not events:
        return PolledEvents(None, newest if settings.kind != "stripe" else None, 0)
    if newest is None or len(newest) > MAX_EVENT_ID or has_control(newest):
        raise BillingSourceFailed(
            "polling payment-failed events: the newest event's id is not a usable cursor (too long or a control "
            "character); the API's answer is malformed"
        )
    directory = private_dir(snapshots_dir(home))  # whole customer objects: the owner's alone
    path = _new_path(directory, wall, f"{settings.kind}-events")
    _write_atomically(path, [json.dumps(events, sort_keys=True)])
    return PolledEvents(path, newest, len(events))


def newest_event(settings: Source, as_of: dt.datetime, environ: Mapping[str, str] = os.environ) -> str | None:
    """The newest payment-failed event id within the lookback (the sensor's question, one small request)."""
    from dunning.ingest.sources import stripe_api  # here: the SDK is a tenth of a second of every run's start otherwise

    key = stripe_api.api_key(settings, environ)
    since = as_of - dt.timedelta(days=settings.events_lookback_days)
    with stripe_api.api_errors(settings, "asking for new payment-failed events"):
        return stripe_api.newest_payment_failed_event(stripe_api.client(settings, key), since)


def pulls_from_source(settings: Source, snapshot_given: bool, reads_live_state: bool) -> bool:
    """Whether a run pulls its invoices and polls its events: a billing source and no snapshot given (`--snapshot`
    always wins: a run given a file talks to no API), and not a backfill (a past day is not in today's API)."""
    return settings.kind != "none" and not snapshot_given and reads_live_state


def polls_events(settings: Source, snapshot_given: bool, reads_live_state: bool) -> bool:
    """Whether a run also polls the source's payment signals: a pulling source that has them (not `sql`)."""
    return settings.kind in EVENT_KINDS and pulls_from_source(settings, snapshot_given, reads_live_state)

"""Pulling from the billing source (`source: {kind: stripe | sql}`) into files under HOME/snapshots/, so a run can be
replayed from exactly what it saw.

- `pull_invoices`: every invoice. Stripe: written as the body of `GET /v1/invoices`
  (a Stripe list envelope, which `dunning run --snapshot FILE` reads as it is) to
  `HOME/snapshots/<UTC wall time>-stripe.json`; SQL: the query's rows as a CSV
  snapshot (`sources.sql`) in `<UTC wall time>-sql.csv`. Then the pulled files
  older than `source.snapshot_retention_days` (by the time in their name) are
  deleted. Nothing else in the directory is touched.
- `poll_events`: the `invoice.payment_failed` events newer than the ledger's
  cursor, written as a JSON array to `<UTC wall time>-stripe-events.json`
  (`--events FILE` reads it), with the newest id for the cursor.

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
from typing import Any, BinaryIO

import polars as pl

from dunning.config import Source
from dunning.errors import BillingSourceFailed
from dunning.ingest.events import EVENTS_SCHEMA
from dunning.private_files import private_dir
from dunning.safe_text import has_control
from dunning.vocabulary import SetAside

SNAPSHOTS_DIR = "snapshots"
EVENTS_CURSOR = "stripe:invoice.payment_failed"  # the `source_cursors` row of the payment-failed poll
_STAMP = "%Y-%m-%dT%H%M%S.%fZ"
PULLED_NAME = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{6}\.\d{6}Z)-(?:stripe(?:-events)?\.json|sql\.csv)$")
MAX_EVENT_ID = 200
PULLED_KINDS = ("stripe", "sql")  # the kinds of source a run without --snapshot pulls its invoices from


def snapshots_dir(home: Path) -> Path:
    return home / SNAPSHOTS_DIR


def _new_path(directory: Path, wall: dt.datetime, suffix: str, extension: str = "json") -> Path:
    """A name no earlier pull of this home took (two pulls in one microsecond: the later one a microsecond on)."""
    at = wall.astimezone(dt.UTC)
    while True:
        path = directory / f"{at.strftime(_STAMP)}-{suffix}.{extension}"
        if not path.exists():
            return path
        at += dt.timedelta(microseconds=1)


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


def _write_atomically(path: Path, chunks: Iterable[str]) -> None:
    with _atomically(path) as out:
        for chunk in chunks:
            out.write(chunk.encode("utf-8"))


def _list_body(invoices: Iterable[dict[str, Any]]) -> Iterator[str]:
    yield '{"object": "list", "url": "/v1/invoices", "has_more": false, "data": [\n'
    for n, invoice in enumerate(invoices):
        yield (",\n" if n else "") + json.dumps(invoice, sort_keys=True)
    yield "\n]}\n"


def pull_invoices(settings: Source, home: Path, wall: dt.datetime, environ: Mapping[str, str] = os.environ) -> Path:
    """Every invoice of the source into a new pulled snapshot file; returns its path. BillingSourceFailed (exit 7)
    when the API or database fails, ConfigError (exit 2) when the key's variable is unset (or, `sql`, the query
    returns the wrong columns)."""
    if settings.kind == "sql":
        return _pull_sql(settings, home, wall, environ)
    from dunning.ingest import stripe_api  # here: the SDK is a tenth of a second of every run's start otherwise

    key = stripe_api.api_key(settings, environ)
    directory = private_dir(snapshots_dir(home))  # whole customer objects: the owner's alone
    path = _new_path(directory, wall, "stripe")
    with stripe_api.api_errors(settings, "pulling invoices"):
        _write_atomically(path, _list_body(stripe_api.invoices(stripe_api.client(settings, key))))
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
    from dunning.ingest import stripe_api  # here: the SDK is a tenth of a second of every run's start otherwise

    key = stripe_api.api_key(settings, environ)
    since = as_of - dt.timedelta(days=settings.events_lookback_days)
    with stripe_api.api_errors(settings, "polling payment-failed events"):
        events = stripe_api.new_payment_failed_events(stripe_api.client(settings, key), cursor, since)
    if not events:
        return PolledEvents(None, None, 0)
    newest = events[-1]["id"]
    if len(newest) > MAX_EVENT_ID or has_control(newest):
        raise BillingSourceFailed(
            "polling payment-failed events: the newest event's id is not a usable cursor (too long or a control "
            "character); the API's answer is malformed"
        )
    directory = private_dir(snapshots_dir(home))  # whole customer objects: the owner's alone
    path = _new_path(directory, wall, "stripe-events")
    _write_atomically(path, [json.dumps(events, sort_keys=True)])
    return PolledEvents(path, newest, len(events))


def newest_event(settings: Source, as_of: dt.datetime, environ: Mapping[str, str] = os.environ) -> str | None:
    """The newest payment-failed event id within the lookback (the sensor's question, one small request)."""
    from dunning.ingest import stripe_api  # here: the SDK is a tenth of a second of every run's start otherwise

    key = stripe_api.api_key(settings, environ)
    since = as_of - dt.timedelta(days=settings.events_lookback_days)
    with stripe_api.api_errors(settings, "asking for new payment-failed events"):
        return stripe_api.newest_payment_failed_event(stripe_api.client(settings, key), since)


def pulls_from_source(settings: Source, snapshot_given: bool, reads_live_state: bool) -> bool:
    """Whether a run pulls its invoices: a `stripe` or `sql` source and no snapshot given (`--snapshot` always wins:
    a run given a file talks to no API), and not a backfill (a past day is not in today's API)."""
    return settings.kind in PULLED_KINDS and not snapshot_given and reads_live_state


def polls_events(settings: Source, snapshot_given: bool, reads_live_state: bool) -> bool:
    """Whether a run also polls the source's payment-failed events: only a pulling `stripe` source has them."""
    return settings.kind == "stripe" and pulls_from_source(settings, snapshot_given, reads_live_state)


def with_pending(events: pl.DataFrame, pending: pl.DataFrame) -> pl.DataFrame:
    """This run's events and the stored payment-failed events still without a notice, one row per event id."""
    if pending.is_empty():
        return events
    pending = pending.select(EVENTS_SCHEMA.names()).cast(EVENTS_SCHEMA)
    return pl.concat([events, pending]).unique("event_id", keep="first", maintain_order=True)


def expired_rows(expired: pl.DataFrame, lookback_days: int, as_of: dt.datetime) -> pl.DataFrame:
    """Stored payment-failed events past the lookback without their notice (`event_id`, `type`, `created_at`,
    `payload`) as `event_quarantine` rows: they get no notice, and the run summary and `status` say so."""
    reason = (
        f"{SetAside.EXPIRED}: created {{}}, more than source.events_lookback_days ({lookback_days}) before the run's "
        f"clock {as_of.astimezone(dt.UTC).isoformat()}: no notice"
    )
    return expired.select(
        "event_id",
        "type",
        pl.format(reason, pl.col("created_at").dt.strftime("%Y-%m-%dT%H:%M:%SZ")).alias("reason"),
        "payload",
    )

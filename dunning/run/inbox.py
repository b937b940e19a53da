"""The webhook inbox: events the receiver (`dunning serve-webhooks`) accepted, kept durably until a run applies them.

The receiver must answer within seconds and must never wait on a run's ledger lock (a DuckDB file has one writer),
so it writes each verified event as one file under `HOME/inbox/webhooks/`, named by its provider and id:
written to a temporary name, flushed to disk, then linked to its final name, which fails when an event of that id is
already there (a redelivery: answered 200, stored once). Only then does the receiver answer 2xx.

The next live run applies the inbox first (`apply_inbox`): Resend events become delivery reports (trusted: they are
signed by Resend, `dunning.run.feedback`), Stripe events are stored in `billing_events` like polled and file events,
unique on the event id, and feed the same payment-failed path. A file is removed only after what it holds is
committed; a run that dies in between leaves it for the next, which records nothing twice. Files waiting in the
inbox keep an hour from being skipped as unchanged.

Chargebee and Recurly notifications are triggers, not facts (`VENDORS`): a run whose `source.kind` is that vendor
fetches each back from the API (`BillingSource.fetch_back`), stores the events that answer says (`billing_events`,
unique on their ids, so a notification and the poll of the same payment make one notice) and merges the invoices
into the source's mirror, then removes the files. Another source's notifications wait, counted by nothing.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dunning.config import DunningConfig
from dunning.ingest.delivery_reports import Reading, resend_event
from dunning.ingest.events import split_events
from dunning.ingest.sources import mirror, open_source
from dunning.ingest.sources.base import Notification
from dunning.ledger.base import Ledger
from dunning.run import feedback

INBOX = Path("inbox") / "webhooks"
PROVIDERS = ("resend", "stripe")
VENDORS = ("chargebee", "recurly")  # triggers, fetched back by a run of that source


def inbox_dir(home: Path) -> Path:
    return home / INBOX


def file_name(provider: str, event_id: str) -> str:
    """The inbox name of an event: its provider and a hash of its id (an id is data; a file name must be safe)."""
    return f"{provider}-{hashlib.sha256(event_id.encode('utf-8', 'surrogateescape')).hexdigest()[:40]}.json"


def store(home: Path, provider: str, event_id: str, body: bytes, received_at: dt.datetime) -> bool:
    """Keep one verified event durably; False when an event of that id was already kept (a redelivery)."""
    directory = inbox_dir(home)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / file_name(provider, event_id)
    if final.exists():
        return False
    record = json.dumps({"provider": provider, "event_id": event_id, "received_at": received_at.isoformat(),
                         "body": body.decode("utf-8")}).encode()  # fmt: skip
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".incoming-")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(record)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(temporary, final)  # atomic, and refuses an existing name: unique on the event's id
        except FileExistsError:
            return False
        directory_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(directory_fd)
        finally:
            os.close(directory_fd)
        return True
    finally:
        os.unlink(temporary)


def pending(home: Path, kind: str | None = None) -> list[Path]:
    """The files waiting: Resend's and Stripe's, and the notifications of `kind` when it is a vendor's."""
    directory = inbox_dir(home)
    if not directory.is_dir():
        return []
    wanted = (*PROVIDERS, kind) if kind in VENDORS else PROVIDERS
    return sorted(p for p in directory.glob("*.json") if p.name.split("-", 1)[0] in wanted)


@dataclass
class InboxResult:
    files: int = 0
    stripe_events: int = 0
    new_stripe_events: int = 0
    rejected_stripe_events: int = 0
    feedback: feedback.FeedbackResult = field(default_factory=feedback.FeedbackResult)
    unreadable: list[str] = field(default_factory=list)
    fetched_back: int = 0  # vendor notifications asked of the API


def _read(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_bytes())
        body = json.loads(record["body"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return {**record, "event": body} if isinstance(record, dict) else None


def apply_inbox(
    ledger: Ledger, home: Path, config: DunningConfig, run_id: str, at: dt.datetime, fetch_back: bool = True
) -> InboxResult:
    """Apply every event waiting in the inbox (module docstring), then remove the files applied. `fetch_back`: also
    the notifications of the configured vendor (never in the receiver: its answer must not wait on the API)."""
    files = pending(home, config.source.kind if fetch_back else None)
    result = InboxResult(files=len(files))
    if not files:
        return result
    stripe_events, reading, applied, notes = [], Reading(), [], []
    for path in files:
        record = _read(path)
        try:
            if record is None:
                raise ValueError("not an inbox record")
            if record["provider"] in VENDORS:
                notes.append(Notification(record["provider"], record["event_id"], record["event"]))
            elif record["provider"] == "stripe":
                stripe_events.append(record["event"])
            else:
                reading.reports += resend_event(record["event"], "resend_webhook", trusted=True) or []
        except Exception:  # noqa: BLE001 - set aside for a human, so it neither blocks every run nor repeats
            result.unreadable.append(path.name)
            (path.parent / "unreadable").mkdir(exist_ok=True)
            path.replace(path.parent / "unreadable" / path.name)
            continue
        applied.append(path)
    if notes:
        fetched = open_source(config.source).fetch_back(notes, config.zone)  # exit 7 when the API fails: kept
        result.fetched_back = len(notes)
        stripe_events += fetched.events
        if fetched.rows:
            mirror.merge_rows(home, config.source.kind, fetched.rows)
    if stripe_events:
        loaded = split_events(stripe_events)
        result.stripe_events = loaded.accepted.height
        result.rejected_stripe_events = loaded.rejected.height
        with ledger.transaction():
            result.new_stripe_events = ledger.store_events(loaded.accepted, run_id, at)
            if loaded.rejected.height:
                ledger.quarantine_events(loaded.rejected, run_id, at)
    if reading.reports:
        result.feedback = feedback.apply_reports(ledger, reading, config, home, at)
    for path in applied:  # committed above: the files may go
        path.unlink(missing_ok=True)
    return result

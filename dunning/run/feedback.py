"""Importing delivery feedback: reports matched to our emails, recorded once, and the addresses they condemn
suppressed (guarantee 15).

`dunning feedback` reads a mailbox (mbox or Maildir, the standard `mailbox` package) or a file of Resend events;
`dunning serve-webhooks` stores signed events in an inbox that the next run applies through the same function
(`apply_reports`). Each report becomes one `delivery_events` row, unique on its `event_key`, so importing the same
file twice changes nothing, and only a report recorded for the first time may suppress: an address an operator
lifted is not suppressed again by an old file imported once more.

Who may suppress:
- a hard bounce or a complaint that matches our email: its Message-ID (or Resend's email id) is one we sent, to the
  address the report names;
- any hard bounce or complaint from Resend itself (its event export, a signed webhook);
- an unmatched mailbox report only with `feedback.trust_unmatched: true`: anyone can mail the bounce address, and a
  forged DSN must not silence a customer.
Soft bounces and deliveries are recorded, never suppressing. Unreadable messages are recorded as such and kept
under `HOME/feedback/unreadable/` for a human.
"""

from __future__ import annotations

import datetime as dt
import mailbox
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from dunning.config import DunningConfig
from dunning.errors import UserInputError
from dunning.ingest.delivery_reports import (
    MAX_MESSAGE_BYTES,
    SUPPRESSING,
    Reading,
    Report,
    read_message,
    read_resend_events,
)
from dunning.ledger.base import Ledger
from dunning.ledger.stores.suppressions import DELIVERY_EVENT_SCHEMA

UNREADABLE_DIR = Path("feedback") / "unreadable"
MAX_FILE_BYTES = 2 * 1024**3  # a file of Resend events is read whole; a mailbox is read message by message


@dataclass
class FeedbackResult:
    read: int = 0  # reports in the file
    recorded: int = 0  # of them, new (not recorded by an earlier import)
    by_kind: dict[str, int] = field(default_factory=dict)  # new reports by kind
    matched: int = 0  # new reports matched to one of our emails
    suppressed: list[str] = field(default_factory=list)  # addresses newly suppressed
    not_trusted: int = 0  # new hard bounces and complaints that suppressed nothing: unmatched mailbox reports
    unreadable: int = 0
    unreadable_new: int = 0
    not_reports: int = 0
    kept_in: str | None = None


def mailbox_messages(path: Path, kind: str) -> Iterator[bytes]:
    """Each message of an mbox file or a Maildir directory, as bytes; UserInputError naming what is wrong."""
    if kind == "mbox":
        if not path.is_file():
            raise UserInputError(f"--mbox {path}: not a file")
        box: mailbox.Mailbox = mailbox.mbox(path, create=False)
    else:
        if not (path / "cur").is_dir() and not (path / "new").is_dir():
            raise UserInputError(f"--maildir {path}: not a Maildir (no cur/ or new/ directory)")
        box = mailbox.Maildir(path, factory=None, create=False)
    try:
        for key in box.iterkeys():
            try:
                with box.get_file(key) as message:  # read no more than one byte past the limit: a huge one is bounded
                    yield message.read(MAX_MESSAGE_BYTES + 1)
            except (OSError, KeyError):  # a message removed while we read: the next import has it or not
                continue
    finally:
        box.close()


def read_file(path: Path, kind: str) -> Reading:
    """The reports of one file: `kind` is mbox, maildir or resend."""
    if kind == "resend":
        if not path.is_file():
            raise UserInputError(f"--resend-events {path}: not a file")
        if path.stat().st_size > MAX_FILE_BYTES:
            raise UserInputError(f"--resend-events {path}: larger than {MAX_FILE_BYTES} bytes")
        return read_resend_events(path.read_bytes(), "resend_file")
    reading = Reading()
    for raw in mailbox_messages(path, kind):
        reading.add(read_message(raw, kind))
    return reading


def _matches(ledger: Ledger, reports: list[Report]) -> dict[str, dict[str, Any]]:
    """Report event key -> our email it is about (`idempotency_keys`, `customer_id`, `customer_email`)."""
    found: dict[str, dict[str, Any]] = {}
    for column, ids in (
        ("message_id", {r.message_id for r in reports if r.message_id}),
        ("provider_message_id", {r.provider_email_id for r in reports if r.provider_email_id}),
    ):
        if not ids:
            continue
        ours = {row["id"]: row for row in ledger.emails_by_id(sorted(ids), column).to_dicts()}
        for report in reports:
            value = report.message_id if column == "message_id" else report.provider_email_id
            if value in ours and report.event_key not in found:
                found[report.event_key] = ours[value]
    return found


def _may_suppress(report: Report, ours: dict[str, Any] | None, config: DunningConfig) -> bool:
    if report.kind not in SUPPRESSING or report.email is None:
        return False
    if report.trusted or config.feedback.trust_unmatched:
        return True
    return ours is not None and str(ours.get("customer_email") or "").lower() == report.email


def apply_reports(
    ledger: Ledger, reading: Reading, config: DunningConfig, home: Path, at: dt.datetime
) -> FeedbackResult:
    """Record `reading`'s reports and unreadable messages once, and suppress what they allow (module docstring)."""
    result = FeedbackResult(read=len(reading.reports), unreadable=len(reading.unreadable),
                            not_reports=reading.not_reports)  # fmt: skip
    ours = _matches(ledger, reading.reports)
    rows: list[dict[str, Any]] = []
    suppress: dict[str, tuple[str, str, str, dict[str, Any] | None]] = {}
    for report in reading.reports:
        match = ours.get(report.event_key)
        # the address is the report's own, never filled in from the email it names: a Message-ID can be guessed,
        # so a report suppresses only an address it states and that email went to
        email = report.email
        allowed = _may_suppress(report, match, config)
        rows.append({
            "event_key": report.event_key, "kind": report.kind, "source": report.source, "email": email,
            "message_id": report.message_id or report.provider_email_id,
            "idempotency_keys": match["idempotency_keys"] if match else None,
            "customer_id": match["customer_id"] if match else None, "status_code": report.status_code,
            "detail": report.detail, "reported_at": report.reported_at, "recorded_at": at,
            "matched": match is not None, "suppressed": allowed,
        })  # fmt: skip
        if allowed and email:
            suppress[report.event_key] = (email, SUPPRESSING[report.kind], report.source, match)
    for item in reading.unreadable:
        rows.append({
            "event_key": item.event_key, "kind": "unreadable", "source": item.source, "email": None,
            "message_id": None, "idempotency_keys": None, "customer_id": None, "status_code": None,
            "detail": item.why, "reported_at": None, "recorded_at": at, "matched": False, "suppressed": False,
        })  # fmt: skip
    with ledger.transaction():  # recorded and suppressed together: a report is never on record without its effect
        new = ledger.record_delivery_events(pl.DataFrame(rows, schema=DELIVERY_EVENT_SCHEMA, orient="row"))
        result.suppressed = _suppress_new(ledger, rows, new, suppress, result, at)
    _keep_unreadable(reading, new, home, result)
    return result


def _suppress_new(
    ledger: Ledger, rows: list[dict[str, Any]], new: set[str],
    suppress: dict[str, tuple[str, str, str, dict[str, Any] | None]], result: FeedbackResult, at: dt.datetime,
) -> list[str]:  # fmt: skip
    """Count the reports recorded for the first time, and suppress the addresses those may condemn."""
    by_key = {row["event_key"]: row for row in rows}
    condemned: list[dict[str, Any]] = []
    for key in sorted(new):
        row = by_key[key]
        if row["kind"] == "unreadable":
            result.unreadable_new += 1
            continue
        result.recorded += 1
        result.by_kind[row["kind"]] = result.by_kind.get(row["kind"], 0) + 1
        result.matched += int(row["matched"])
        if row["kind"] in SUPPRESSING and not row["suppressed"]:
            result.not_trusted += 1
        if key in suppress:
            email, reason, source, match = suppress[key]
            condemned.append({"email": email, "reason": reason, "source": source, "event_key": key,
                              "customer_id": match["customer_id"] if match else None})  # fmt: skip
    schema = {"email": pl.String, "reason": pl.String, "source": pl.String, "event_key": pl.String,
              "customer_id": pl.String}  # fmt: skip
    return ledger.suppress_many(pl.DataFrame(condemned, schema=schema, orient="row"), at)


def _keep_unreadable(reading: Reading, new: set[str], home: Path, result: FeedbackResult) -> None:
    kept = [u for u in reading.unreadable if u.event_key in new and u.raw]
    if kept:
        directory = home / UNREADABLE_DIR
        directory.mkdir(parents=True, exist_ok=True)
        for item in kept:
            (directory / f"{item.event_key.replace(':', '-')}.eml").write_bytes(item.raw)
        result.kept_in = str(directory)

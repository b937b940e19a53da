"""Importing delivery feedback: reports matched to our emails, recorded once, and the addresses they condemn
suppressed (guarantee 15).

`dunning feedback` reads a mailbox (mbox or Maildir, the standard `mailbox` package) or a file of Resend events;
`dunning serve-webhooks` stores signed events in an inbox that the next run applies through the same function
(`apply_reports`). Reading (`read_file`, bounded per message: `dunning.ingest.delivery_reports`) needs no ledger;
only `apply_reports` writes, so the Dagster job parses outside the ledger's pool slot. Each report becomes one
`delivery_events` row, unique on its `event_key`, so importing the same file twice changes nothing, and only a
report recorded for the first time may suppress: an address an operator lifted is not suppressed again by an old
file imported once more.

Who may suppress (each row's `verdict` says which case it was):
- `verified`: a mailbox report (DSN, ARF) whose Message-ID is a signed one of ours (`keys.MessageIds.verifies`,
  an HMAC of the email's keys under the deployment's secret, so no outsider can compute one), naming an address
  that email went to;
- `provider`: a hard bounce or complaint from Resend itself (its event export, a signed webhook);
- `legacy_trusted`: a report quoting a Message-ID minted before they were signed, with its recipient, only with
  `feedback.trust_legacy_message_ids: true` (anyone can compute those);
- anything else only with `feedback.trust_unmatched: true`: anyone can mail the bounce address, and a forged DSN
  must not silence a customer. Without it the report is recorded and counted as unmatched: `legacy`,
  `not_ours` (a Message-ID we did not mint or cannot verify), `other_recipient` (ours, about an address it did
  not go to), `no_message_id`, `no_recipient`. `dunning status` lists the `no_message_id` and `legacy` ones about
  an address not suppressed, for a human to confirm with `dunning suppress`.

A report never lengthens an operator's suppression: about an address an operator suppressed until a date, it is
kept behind that date and holds the address for good after it (`ledger.stores.suppressions`). Soft bounces and
deliveries are recorded, never suppressing. Unreadable messages are recorded as such and kept under
`HOME/feedback/unreadable/` for a human.
"""

from __future__ import annotations

import datetime as dt
import mailbox
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from dunning.config import DunningConfig
from dunning.desk import replies
from dunning.desk.replies import RepliesResult
from dunning.email.message_ids import message_ids
from dunning.errors import UserInputError
from dunning.ingest.delivery_reports import (
    MAX_MESSAGE_BYTES,
    SUPPRESSING,
    Reading,
    Report,
    read_message,
    read_resend_events,
)
from dunning.keys import LEGACY_FORM, SIGNED_FORM, MessageIds, legacy_verifies, message_id_form
from dunning.ledger.base import Ledger
from dunning.ledger.stores.suppressions import DELIVERY_EVENT_SCHEMA, Condemned

UNREADABLE_DIR = Path("feedback") / "unreadable"
MAX_FILE_BYTES = 2 * 1024**3  # a file of Resend events is read whole; a mailbox is read message by message


VERIFIED, PROVIDER, LEGACY_TRUSTED = "verified", "provider", "legacy_trusted"
LEGACY, NOT_OURS, OTHER_RECIPIENT, NO_MESSAGE_ID, NO_RECIPIENT = (
    "legacy", "not_ours", "other_recipient", "no_message_id", "no_recipient"
)  # fmt: skip
PROVEN = (VERIFIED, PROVIDER, LEGACY_TRUSTED)  # verdicts that let a hard bounce or complaint suppress
TO_CONFIRM = (NO_MESSAGE_ID, LEGACY)  # unmatched reports that may be genuine: `dunning status` lists them


@dataclass
class FeedbackResult:
    read: int = 0  # reports in the file
    recorded: int = 0  # of them, new (not recorded by an earlier import)
    by_kind: dict[str, int] = field(default_factory=dict)  # new reports by kind
    matched: int = 0  # new reports proven to be about one of our emails
    suppressed: list[str] = field(default_factory=list)  # addresses newly suppressed
    after_operator: list[str] = field(default_factory=list)  # suppressed by an operator until a date: held after it
    not_trusted: int = 0  # new hard bounces and complaints that suppressed nothing: unmatched mailbox reports
    unmatched: dict[str, int] = field(default_factory=dict)  # of those, by verdict
    to_confirm: int = 0  # of those, listed in `dunning status` for a human (TO_CONFIRM)
    unreadable: int = 0
    unreadable_new: int = 0
    not_reports: int = 0
    kept_in: str | None = None
    replies: RepliesResult = field(default_factory=RepliesResult)


@dataclass(frozen=True)
class OurEmail:
    """An email of ours a report names: the keys it covered, its customer, every address it went to."""

    keys: tuple[str, ...]
    customer_id: str | None
    recipients: frozenset[str]


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


WENT = ("sent", "unknown", "claimed")  # a key in one of these may have reached its recipient


def _emails(ledger: Ledger, ids: set[str], column: str) -> dict[str, OurEmail]:
    """Our emails on record under each of `ids` in `column` (`message_id`, `provider_message_id`) that may have gone:
    every key each was minted for (one that failed for good included: the Message-ID is signed over all of them)."""
    if not ids:
        return {}
    found: dict[str, list[dict[str, Any]]] = {}
    for row in ledger.emails_by_id(sorted(ids), column).to_dicts():
        found.setdefault(row["id"], []).append(row)
    return {
        value: OurEmail(
            tuple(r["idempotency_key"] for r in rows),
            min((r["customer_id"] for r in rows if r["customer_id"]), default=None),
            frozenset(
                address.strip().lower()
                for r in rows
                for address in (r.get("recipients") or r["customer_email"] or "").split(",")
                if address.strip()
            ),
        )
        for value, rows in found.items()
        if any(r["status"] in WENT for r in rows)
    }


def _verdict(
    report: Report, by_message_id: dict[str, OurEmail], by_provider_id: dict[str, OurEmail],
    ids: Callable[[], MessageIds], config: DunningConfig,
) -> tuple[str, OurEmail | None]:  # fmt: skip
    """Why `report` may or may not suppress (module docstring), and the email of ours it names, if it is proven to
    name one. The address is the report's own, never filled in from the email: a report suppresses only an address
    it states and that email went to."""
    if report.trusted:  # the provider's own word, signed or exported by it
        return PROVIDER, by_provider_id.get(report.provider_email_id or "")
    if report.message_id is None:
        return NO_MESSAGE_ID, None
    ours = by_message_id.get(report.message_id)
    form = message_id_form(report.message_id)
    if ours is None:
        return NOT_OURS, None
    if form == SIGNED_FORM and ids().verifies(report.message_id, ours.keys):
        verdict = VERIFIED
    elif form == LEGACY_FORM and legacy_verifies(report.message_id, ours.keys):
        verdict = LEGACY_TRUSTED if config.feedback.trust_legacy_message_ids else LEGACY
    else:  # on record, yet not a Message-ID we can prove we minted (a placeholder, a secret no longer configured)
        return NOT_OURS, None
    if report.email is None:
        return NO_RECIPIENT, ours
    if report.email not in ours.recipients:
        return OTHER_RECIPIENT, ours
    return verdict, ours


def _may_suppress(report: Report, verdict: str, config: DunningConfig) -> bool:
    if report.kind not in SUPPRESSING or report.email is None:
        return False
    return verdict in PROVEN or config.feedback.trust_unmatched


def apply_reports(
    ledger: Ledger, reading: Reading, config: DunningConfig, home: Path, at: dt.datetime
) -> FeedbackResult:
    """Record `reading`'s reports and unreadable messages once, and suppress what they allow (module docstring)."""
    result = FeedbackResult(read=len(reading.reports), unreadable=len(reading.unreadable),
                            not_reports=reading.not_reports)  # fmt: skip
    by_message_id = _emails(ledger, {r.message_id for r in reading.reports if r.message_id and not r.trusted},
                            "message_id")  # fmt: skip
    by_provider_id = _emails(ledger, {r.provider_email_id for r in reading.reports
                                      if r.provider_email_id and r.trusted}, "provider_message_id")  # fmt: skip
    minted: list[MessageIds] = []

    def ids() -> MessageIds:  # read once, and only when a signed Message-ID needs verifying
        if not minted:
            minted.append(message_ids(ledger, config))
        return minted[0]

    rows: list[dict[str, Any]] = []
    suppress: dict[str, tuple[str, str, str, str | None]] = {}
    for report in reading.reports:
        verdict, ours = _verdict(report, by_message_id, by_provider_id, ids, config)
        allowed = _may_suppress(report, verdict, config)
        rows.append({
            "event_key": report.event_key, "kind": report.kind, "source": report.source, "email": report.email,
            "message_id": report.message_id or report.provider_email_id,
            "idempotency_keys": ",".join(sorted(ours.keys)) if ours else None,
            "customer_id": ours.customer_id if ours else None, "status_code": report.status_code,
            "detail": report.detail, "reported_at": report.reported_at, "recorded_at": at,
            "matched": ours is not None and verdict in PROVEN, "suppressed": allowed, "verdict": verdict,
        })  # fmt: skip
        if allowed and report.email:
            customer = ours.customer_id if ours and verdict in PROVEN else None
            suppress[report.event_key] = (report.email, SUPPRESSING[report.kind], report.source, customer)
    for item in reading.unreadable:
        rows.append({
            "event_key": item.event_key, "kind": "unreadable", "source": item.source, "email": None,
            "message_id": None, "idempotency_keys": None, "customer_id": None, "status_code": None,
            "detail": item.why, "reported_at": None, "recorded_at": at, "matched": False, "suppressed": False,
            "verdict": None,
        })  # fmt: skip
    with ledger.transaction():  # recorded and suppressed together: a report is never on record without its effect
        new = ledger.record_delivery_events(pl.DataFrame(rows, schema=DELIVERY_EVENT_SCHEMA, orient="row"))
        condemned = _suppress_new(ledger, rows, new, suppress, result, at)
    result.suppressed, result.after_operator = condemned.suppressed, condemned.after_operator
    _keep_unreadable(reading, new, home, result)
    if reading.replies:  # the messages that were not reports: customers' answers (`dunning.desk.replies`)
        result.replies = replies.apply_replies(ledger, reading.replies, config, at)
    return result


def _suppress_new(
    ledger: Ledger, rows: list[dict[str, Any]], new: set[str],
    suppress: dict[str, tuple[str, str, str, str | None]], result: FeedbackResult, at: dt.datetime,
) -> Condemned:  # fmt: skip
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
            result.unmatched[row["verdict"]] = result.unmatched.get(row["verdict"], 0) + 1
            result.to_confirm += int(row["verdict"] in TO_CONFIRM and row["email"] is not None)
        if key in suppress:
            email, reason, source, customer_id = suppress[key]
            condemned.append({"email": email, "reason": reason, "source": source, "event_key": key,
                              "customer_id": customer_id})  # fmt: skip
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

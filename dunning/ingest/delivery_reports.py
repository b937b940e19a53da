"""Reading what came back after a send: bounce and complaint reports from a mailbox, and Resend's webhook events.

Every report is hostile input: anyone can mail the bounce address. A message is read with the standard `email`
package (`compat32`: it keeps a malformed header as text instead of raising), bounded before parsing: its size
(`MAX_MESSAGE_BYTES`), and its depth and parts on the raw bytes (`mime_bounds`: the parser's cost is lines times
depth, so a limit checked on the finished tree came after 200 s), then fed to the parser in chunks under a time
budget per message (`MESSAGE_SECONDS`), and bounded again while walking the tree; whatever fails is one
`Unreadable` with the reason, never an exception out of here. Such a message is still read for what its header
block (the first `HEADER_BYTES`) says: a customer's answer with a scanned remittance attached is larger than any
bounce, and must still pause the chasing (`_headers_only`).
Addresses pass the recipient rule (`safe_text.is_address`) or are dropped; free text (a diagnostic) loses its
control characters and is cut. Nothing here decides what to suppress: `dunning.run.feedback` does, knowing which
reports match our own emails.

- RFC 3464 delivery status notifications (`multipart/report; report-type=delivery-status`): one report per
  recipient block. `Action: failed` with a `5.x.x` status is a hard bounce; a `4.x.x` status or `Action: delayed`
  a soft bounce (counted, never suppressing); `delivered`, `relayed` and `expanded` are recorded as delivered.
- RFC 5965 ARF complaints (`multipart/report; report-type=feedback-report`): the recipient is the report's
  `Original-Rcpt-To`, else the original message's `To`.
- Resend webhook events (one object, an array, or JSON Lines): `email.bounced` (a hard bounce only when
  `bounce.type` is `Permanent`), `email.complained`, `email.delivered`, `email.delivery_delayed`; unique on
  (type, `data.email_id`, `created_at`).

The original message's `Message-ID` (from the report's `message/rfc822` or `text/rfc822-headers` part) is what
matches a report to our email.
"""

from __future__ import annotations

import datetime as dt
import email.feedparser
import email.parser
import email.policy
import hashlib
import json
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from email.message import Message
from typing import Any

from dunning.ingest.mime_bounds import structure_problem
from dunning.ingest.replies import ReplyMessage, reply_message
from dunning.safe_text import CONTROL_CLASS, has_control, is_address

MAX_MESSAGE_BYTES = 5 * 1024 * 1024  # a bounce is a few kilobytes; a larger message is not read
MAX_PARTS = 64
MAX_DEPTH = 8
HEADER_BYTES = 64 * 1024  # where the header block of a message too large or deep to read whole must end
MESSAGE_SECONDS = 2.0  # the time one message may take to read (a 5 MB bounce of long lines takes about 0.1 s)
FEED_BYTES = 64 * 1024  # the parser is fed this much at a time, the budget checked between
MAX_DETAIL = 500
MAX_MESSAGE_ID = 998
# of a `text/rfc822-headers` part, the bytes read again as headers (after the budgeted parse): the original's
# Message-ID and To are in its first kilobytes; 5 MB of header lines took a second and a half more than the budget
MAX_ORIGINAL_HEADERS = 256 * 1024
MAX_EVENT_BYTES = 1024 * 1024  # one Resend event
HARD_BOUNCE, SOFT_BOUNCE, COMPLAINT, DELIVERED = "hard_bounce", "soft_bounce", "complaint", "delivered"
SUPPRESSING = {HARD_BOUNCE: "hard_bounce", COMPLAINT: "complaint"}  # report kind -> suppression reason
_CONTROL = re.compile(f"[{CONTROL_CLASS}\u200b-\u200f]+")  # the project's control characters, and zero-widths
_STATUS = re.compile(r"^([245])\.\d{1,3}\.\d{1,3}$")
_MESSAGE_ID = re.compile(r"^<[^<>\s]+>$")
_PARSER = email.parser.BytesParser(policy=email.policy.compat32)


@dataclass(frozen=True)
class Report:
    """One delivery report about one recipient of one message."""

    event_key: str  # unique per report: importing it twice records it once
    kind: str  # hard_bounce, soft_bounce, complaint, delivered
    source: str  # mbox, maildir, resend_file, resend_webhook
    email: str | None  # the recipient it is about, lower-case, or None when the report names no valid address
    message_id: str | None = None  # the original message's Message-ID, as sent (angle brackets included)
    provider_email_id: str | None = None  # Resend's id of the email (`reminder_ledger.provider_message_id`)
    status_code: str | None = None
    detail: str | None = None
    reported_at: dt.datetime | None = None
    trusted: bool = False  # from the provider itself (a signed webhook, its event export), not a mailbox


@dataclass(frozen=True)
class Unreadable:
    event_key: str
    source: str
    why: str
    raw: bytes = field(repr=False)


@dataclass
class Reading:
    """What a file gave: its reports, the messages that could not be read, and how many were not reports at all."""

    reports: list[Report] = field(default_factory=list)
    unreadable: list[Unreadable] = field(default_factory=list)
    not_reports: int = 0
    replies: list[ReplyMessage] = field(default_factory=list)  # of the messages that are not reports (`replies`)

    def add(self, other: Reading) -> None:
        self.reports += other.reports
        self.unreadable += other.unreadable
        self.not_reports += other.not_reports
        self.replies += other.replies


def clean_text(value: object, limit: int = MAX_DETAIL) -> str | None:
    """Free text from a report, for a table: control and bidirectional characters become one space, cut at `limit`."""
    if value is None:
        return None
    text = _CONTROL.sub(" ", str(value)).strip()
    return text[:limit] or None


def clean_address(value: object) -> str | None:
    """A recipient as a report gives it (`rfc822; Ada@Example.com`, `<ada@example.com>`): the bare address,
    lower-case, when it passes the recipient rule; else None."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if ";" in text:
        kind, _, text = text.partition(";")
        if kind.strip().lower() not in ("rfc822", ""):
            return None
    text = text.strip().removeprefix("<").removesuffix(">").strip()
    return text.lower() if is_address(text) else None


def clean_message_id(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    text = value.strip()
    fits = len(text) <= MAX_MESSAGE_ID and _MESSAGE_ID.fullmatch(text) and not has_control(text)
    return text if fits else None


def _key(*parts: object) -> str:
    return hashlib.sha256("\x00".join(str(p) for p in parts).encode("utf-8", "surrogateescape")).hexdigest()[:40]


def _parts(message: Message) -> Iterator[Message]:
    """Every part of `message`, depth first, refusing more than MAX_PARTS or deeper than MAX_DEPTH (ValueError)."""
    seen = 0
    stack: list[tuple[Message, int]] = [(message, 0)]
    while stack:
        part, depth = stack.pop()
        seen += 1
        if seen > MAX_PARTS:
            raise ValueError(f"more than {MAX_PARTS} MIME parts")
        if depth > MAX_DEPTH:
            raise ValueError(f"MIME nested deeper than {MAX_DEPTH}")
        yield part
        if part.is_multipart():
            payload = part.get_payload()
            if isinstance(payload, list):
                stack.extend((p, depth + 1) for p in reversed(payload) if isinstance(p, Message))


def _original(message: Message) -> Message | None:
    """The original message's headers a report carries (`message/rfc822` or `text/rfc822-headers`)."""
    for part in _parts(message):
        ctype = part.get_content_type()
        if ctype == "message/rfc822":
            payload = part.get_payload()
            if isinstance(payload, list) and payload and isinstance(payload[0], Message):
                return payload[0]
        if ctype == "text/rfc822-headers":
            text = part.get_payload(decode=True)
            if isinstance(text, bytes):
                return _PARSER.parsebytes(text[:MAX_ORIGINAL_HEADERS], headersonly=True)
    return None


def _blocks(part: Message) -> list[Message]:
    """The header blocks of a `message/delivery-status` or `message/feedback-report` part."""
    payload = part.get_payload()
    if isinstance(payload, list):
        return [p for p in payload if isinstance(p, Message)]
    raw = part.get_payload(decode=True)
    if not isinstance(raw, bytes):
        return []
    return [_PARSER.parsebytes(block, headersonly=True) for block in re.split(rb"\r?\n\r?\n", raw) if block.strip()]


def _reported_at(message: Message) -> dt.datetime | None:
    from email.utils import parsedate_to_datetime

    try:
        value = parsedate_to_datetime(str(message.get("Date", "")))
        if value is None:
            return None
        return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _dsn_kind(action: str, status: str | None) -> str | None:
    action = action.strip().lower()
    klass = status[0] if status else None
    if action == "failed":
        return HARD_BOUNCE if klass == "5" else SOFT_BOUNCE
    if action == "delayed":
        return SOFT_BOUNCE
    if action in ("delivered", "relayed", "expanded"):
        return DELIVERED
    return None


def _dsn_reports(message: Message, part: Message, raw_key: str, source: str) -> list[Report]:
    original = _original(message)
    message_id = clean_message_id(original.get("Message-ID")) if original is not None else None
    reported_at = _reported_at(message)
    reports = []
    for index, block in enumerate(_blocks(part)[1:]):  # the first block is about the message, the rest recipients
        status_text = clean_text(block.get("Status"), 20)
        status = status_text if status_text and _STATUS.fullmatch(status_text) else None
        kind = _dsn_kind(str(block.get("Action", "")), status)
        if kind is None:
            continue
        recipient = clean_address(block.get("Final-Recipient")) or clean_address(block.get("Original-Recipient"))
        # one report, whichever route brought it (mbox, Maildir, a copy forwarded twice): what it says, when it
        # names our email and a recipient; else these bytes
        said = _key("dsn", message_id, recipient, status, kind) if message_id and recipient else f"{raw_key}:{index}"
        reports.append(
            Report(
                event_key=f"dsn:{said}",
                kind=kind,
                source=source,
                email=recipient,
                message_id=message_id,
                status_code=status,
                detail=clean_text(block.get("Diagnostic-Code")),
                reported_at=reported_at,
            )
        )
    return reports


def _arf_report(message: Message, part: Message, raw_key: str, source: str) -> Report:
    fields = _blocks(part)[0] if _blocks(part) else Message()
    original = _original(message)
    recipient = clean_address(fields.get("Original-Rcpt-To"))
    if recipient is None and original is not None:
        recipient = clean_address(original.get("To"))
    message_id = clean_message_id(original.get("Message-ID")) if original is not None else None
    said = _key("arf", message_id, recipient) if message_id and recipient else raw_key
    return Report(
        event_key=f"arf:{said}",
        kind=COMPLAINT,
        source=source,
        email=recipient,
        message_id=message_id,
        status_code=clean_text(fields.get("Feedback-Type"), 40),
        detail=clean_text(fields.get("User-Agent")),
        reported_at=_reported_at(message),
    )


class OverBudget(Exception):
    """A message that took longer than `MESSAGE_SECONDS` to read."""


def _parse(raw: bytes, deadline: float) -> Message:
    """`raw` parsed as the standard parser does, fed in chunks, giving up (OverBudget) once `deadline` has passed."""
    parser = email.feedparser.BytesFeedParser(policy=email.policy.compat32)
    for start in range(0, len(raw), FEED_BYTES):
        parser.feed(raw[start : start + FEED_BYTES])
        if time.monotonic() > deadline:
            raise OverBudget(f"took longer than {MESSAGE_SECONDS:g} s to read")
    return parser.close()


def read_message(raw: bytes, source: str) -> Reading:
    """One mailbox message: its reports, or why it could not be read, or nothing when it is not a report."""
    raw_key = hashlib.sha256(raw).hexdigest()[:40]
    reading = Reading()
    if len(raw) > MAX_MESSAGE_BYTES:
        reading.unreadable.append(Unreadable(f"{source}:{raw_key}", source, f"larger than {MAX_MESSAGE_BYTES} bytes",
                                             raw[:4096]))  # fmt: skip
        return _headers_only(reading, raw, raw_key, source, f"larger than {MAX_MESSAGE_BYTES // (1024 * 1024)} MB")
    deadline = time.monotonic() + MESSAGE_SECONDS
    try:  # the walk too: whatever a hostile message trips in it is that message's problem, never the import's
        problem = structure_problem(raw, max_depth=MAX_DEPTH, max_parts=MAX_PARTS, deadline=deadline)
        if problem is not None:  # never given to the parser
            reading.unreadable.append(Unreadable(f"{source}:{raw_key}", source, problem, raw))
            return _headers_only(reading, raw, raw_key, source, problem)
        message = _parse(raw, deadline)
        if message.get_content_type() != "multipart/report":
            reading.not_reports += 1
            reading.replies.append(reply_message(message, raw_key, source))  # perhaps a customer's answer
            return reading
        report_type = str(message.get_param("report-type", "") or "").lower()
        for part in _parts(message):
            ctype = part.get_content_type()
            if ctype == "message/delivery-status" and report_type in ("delivery-status", ""):
                reading.reports += _dsn_reports(message, part, raw_key, source)
                return reading
            if ctype == "message/feedback-report" and report_type in ("feedback-report", ""):
                reading.reports.append(_arf_report(message, part, raw_key, source))
                return reading
        reading.not_reports += 1
    except Exception as error:  # noqa: BLE001 - hostile MIME: whatever the parser trips on is this message's problem
        reading = Reading()
        why = str(error) if isinstance(error, OverBudget) else f"{type(error).__name__}: {error}"
        reading.unreadable.append(Unreadable(f"{source}:{raw_key}", source, clean_text(why, 200) or "unreadable", raw))
    return reading


def _headers_only(reading: Reading, raw: bytes, raw_key: str, source: str, why: str) -> Reading:
    """A message left unreadable as a whole: if its header block ends within `HEADER_BYTES` and it is not a report
    (a report that large or deep is not acted on), it is read as a possible reply from its headers alone, with no
    excerpt of its text (the note says why)."""
    head = raw[:HEADER_BYTES]
    ends = [at for at in (head.find(b"\r\n\r\n"), head.find(b"\n\n")) if at >= 0]
    if not ends:
        return reading
    try:
        message = email.parser.BytesHeaderParser(policy=email.policy.compat32).parsebytes(head[: min(ends)])
        if message.get_content_type() == "multipart/report":
            return reading
        reply = reply_message(message, raw_key, source)
    except Exception:  # noqa: BLE001 - hostile headers: the message stays unreadable, nothing more
        return reading
    reading.not_reports += 1
    reading.replies.append(replace(reply, excerpt=clean_text(f"(its text was not read: {why})", 200)))
    return reading


def read_messages(messages: Iterable[bytes], source: str) -> Reading:
    reading = Reading()
    for raw in messages:
        reading.add(read_message(raw, source))
    return reading


# --- Resend's events -------------------------------------------------------------------------------------------------

RESEND_KINDS = {"email.complained": COMPLAINT, "email.delivered": DELIVERED, "email.delivery_delayed": SOFT_BOUNCE}


def _when(value: object) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        return (moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)
    except (ValueError, OverflowError):
        return None


def resend_event(event: Any, source: str, trusted: bool = True) -> list[Report] | None:
    """The reports of one Resend webhook event (one per recipient), [] for a type that reports nothing we act on,
    None when it is not an event at all."""
    if not isinstance(event, dict) or not isinstance(event.get("type"), str) or not isinstance(event.get("data"), dict):
        return None
    kind_of, data = event["type"], event["data"]
    if kind_of == "email.bounced":
        bounce = data.get("bounce") if isinstance(data.get("bounce"), dict) else {}
        kind = HARD_BOUNCE if bounce.get("type") == "Permanent" else SOFT_BOUNCE
        detail = clean_text(bounce.get("message"))
        status = clean_text(f"{bounce.get('type', '')}/{bounce.get('subType', '')}", 60)
    elif kind_of in RESEND_KINDS:
        kind, detail, status = RESEND_KINDS[kind_of], None, None
    else:
        return []
    email_id = clean_text(data.get("email_id"), 100)
    created = event.get("created_at")
    recipients = data.get("to") if isinstance(data.get("to"), list) else [data.get("to")]
    cleaned = [clean_address(r) for r in recipients[:50]] or [None]
    return [
        Report(
            event_key=f"resend:{_key(kind_of, email_id, created, index)}",
            kind=kind,
            source=source,
            email=recipient,
            provider_email_id=email_id,
            status_code=status,
            detail=detail,
            reported_at=_when(created),
            trusted=trusted,
        )
        for index, recipient in enumerate(cleaned)
    ]


def _documents(text: str) -> Iterator[tuple[int, Any, str | None]]:
    """(position, parsed JSON or None, why not) for one object, an array, or JSON Lines."""
    stripped = text.strip()
    try:
        whole = json.loads(stripped)
    except (ValueError, RecursionError):  # a JSON Lines file, or nesting deeper than the parser goes
        whole = None
    else:
        if isinstance(whole, list):
            yield from ((i, item, None) for i, item in enumerate(whole))
        else:
            yield 0, whole, None
        return
    for number, line in enumerate(stripped.splitlines(), start=1):
        if not line.strip():
            continue
        if len(line) > MAX_EVENT_BYTES:
            yield number, None, f"line {number}: longer than {MAX_EVENT_BYTES} bytes"
            continue
        try:
            yield number, json.loads(line), None
        except (ValueError, RecursionError) as error:
            yield number, None, f"line {number}: not JSON ({clean_text(error, 100) or type(error).__name__})"


def read_resend_events(raw: bytes, source: str = "resend_file") -> Reading:
    """A file of Resend webhook events: one object, an array of them, or one per line."""
    reading = Reading()
    text = raw.decode("utf-8", errors="replace")
    for position, document, why in _documents(text):
        if why is not None:
            reading.unreadable.append(Unreadable(f"{source}:{_key(raw, position)}", source, why, b""))
            continue
        try:
            reports = resend_event(document, source)
        except Exception as error:  # noqa: BLE001 - one hostile event never costs the file's others
            why = clean_text(f"{type(error).__name__}: {error}", 200) or type(error).__name__
            reading.unreadable.append(Unreadable(f"{source}:{_key(raw, position)}", source, why, b""))
            continue
        if reports is None:
            try:
                blob = json.dumps(document, default=str)[:4096].encode()
            except (ValueError, RecursionError):
                blob = b""
            reading.unreadable.append(Unreadable(f"{source}:{_key(blob)}", source, "not a Resend event", blob))
        elif not reports:
            reading.not_reports += 1
        else:
            reading.reports += reports
    return reading

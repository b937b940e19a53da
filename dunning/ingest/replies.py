"""Reading a customer's reply from a mailbox message that is not a delivery report: who wrote it, when, about
which of our emails, and whether a machine wrote it.

Hostile input like every report (`delivery_reports` bounds and parses the message first and hands over only a
message it read, never one over its limits): addresses pass the recipient rule or are dropped, Message-IDs the
Message-ID rule, free text (subject, the excerpt) loses control and bidirectional characters and is cut. Nothing
here decides whom a reply pauses: `dunning.desk.replies` does, knowing our emails and the customers.

A message is an **automatic** reply (never pausing anyone) when RFC 3834's `Auto-Submitted` is anything but `no`,
when it carries `X-Autoreply` or `X-Autorespond`, when `Precedence` is `auto_reply`, `bulk`, `list` or `junk`, or
when its subject is one of the usual out-of-office subjects in English or German.
"""

from __future__ import annotations

import datetime as dt
import email.errors
import email.header
import email.utils
import re
from dataclasses import dataclass
from email.message import Message

from dunning.safe_text import CONTROL_CLASS, has_control, is_address

MAX_SUBJECT = 300
MAX_REFERENCES = 50
MAX_BODY_BYTES = 256 * 1024  # of the text part read for the excerpt
EXCERPT_LINES = 5
MAX_EXCERPT = 800
_CONTROL = re.compile(f"[{CONTROL_CLASS}\u200b-\u200f]+")
_MESSAGE_ID = re.compile(r"<[^<>\s]{1,996}>")
AUTOMATIC_PRECEDENCE = frozenset({"auto_reply", "bulk", "list", "junk"})
_OUT_OF_OFFICE = re.compile(
    r"^\s*(?:(?:re|aw|wg|fw|fwd)\s*:\s*)*(?:out of (?:the )?office|automatic reply|auto(?:matic)?[- ]?reply|"
    r"autoreply|auto:|away from (?:the |my )?office|on vacation|abwesenheitsnotiz|abwesenheit|automatische antwort|"
    r"nicht im b(?:ü|ue)ro|autoantwort|urlaub)",
    re.IGNORECASE,
)
_QUOTE_HEADER = re.compile(
    r"^(?:on .{0,200} wrote:|am .{0,200} schrieb .{0,200}:|-{2,}\s*original message\s*-{2,}|"
    r"-{2,}\s*urspr(?:ü|ue)ngliche nachricht\s*-{2,}|from:\s.*|von:\s.*)$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class ReplyMessage:
    """One message that may be a customer's reply (`dunning.desk.replies` decides)."""

    reply_key: str  # its Message-ID, else `sha256:` and a digest of the raw message
    source: str  # mbox, maildir, imap
    message_id: str | None
    sender: str | None  # the From address, lower-case, when it passes the recipient rule
    subject: str | None
    sent_at: dt.datetime | None  # its Date header, UTC (None: missing or unparsable)
    references: tuple[str, ...]  # the Message-IDs In-Reply-To and References name, In-Reply-To first
    automatic: bool
    excerpt: str | None  # the first lines of its text, quoted history left out


def clean(value: object, limit: int) -> str | None:
    if value is None:
        return None
    text = _CONTROL.sub(" ", str(value)).strip()
    return text[:limit] or None


def _decoded(value: object) -> str:
    """A header as text, encoded words decoded (an undecodable one kept as given)."""
    text = str(value or "")
    try:
        return str(email.header.make_header(email.header.decode_header(text)))
    except (LookupError, UnicodeError, ValueError, email.errors.HeaderParseError):
        return text


def _sender(message: Message) -> str | None:
    _, address = email.utils.parseaddr(_decoded(message.get("From", "")))
    address = address.strip()
    return address.lower() if address and is_address(address) else None


def _date(message: Message) -> dt.datetime | None:
    try:
        value = email.utils.parsedate_to_datetime(str(message.get("Date", "")))
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if value is None:
        return None
    try:
        return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)
    except OverflowError:
        return None


def _references(message: Message) -> tuple[str, ...]:
    found: list[str] = []
    for header in ("In-Reply-To", "References"):
        for value in message.get_all(header) or []:
            for token in _MESSAGE_ID.findall(str(value)):
                if token not in found and not has_control(token):
                    found.append(token)
    return tuple(found[:MAX_REFERENCES])


def is_automatic(message: Message, subject: str | None) -> bool:
    """RFC 3834 and the usual vendor headers, then the out-of-office subjects (module docstring)."""
    auto = str(message.get("Auto-Submitted", "") or "").split(";")[0].strip().lower()
    if auto and auto != "no":
        return True
    if message.get("X-Autoreply") is not None or message.get("X-Autorespond") is not None:
        return True
    if str(message.get("Precedence", "") or "").strip().lower() in AUTOMATIC_PRECEDENCE:
        return True
    return bool(subject and _OUT_OF_OFFICE.match(subject))


def _text(message: Message) -> str | None:
    """The first text/plain part that is not an attachment, decoded (at most MAX_BODY_BYTES of it)."""
    for part in message.walk():
        if part.get_content_type() != "text/plain" or part.get_content_disposition() == "attachment":
            continue
        payload = part.get_payload(decode=True)
        if not isinstance(payload, bytes):
            continue
        charset = part.get_content_charset() or "utf-8"
        try:
            return payload[:MAX_BODY_BYTES].decode(charset, errors="replace")
        except LookupError:
            return payload[:MAX_BODY_BYTES].decode("utf-8", errors="replace")
    return None


def excerpt(text: str | None, lines: int = EXCERPT_LINES) -> str | None:
    """The first `lines` non-empty lines the customer wrote, before any quoted history."""
    if not text:
        return None
    kept: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(">") or _QUOTE_HEADER.match(line):
            break
        if line == "-- ":
            break
        line = clean(line, MAX_EXCERPT) or ""
        if line:
            kept.append(line)
        if len(kept) == lines:
            break
    return clean("\n".join(kept), MAX_EXCERPT) if kept else None


def reply_message(message: Message, raw_key: str, source: str) -> ReplyMessage:
    """What a message that is not a delivery report says of itself (module docstring)."""
    message_ids = _MESSAGE_ID.findall(str(message.get("Message-ID", "") or ""))
    message_id = message_ids[0] if message_ids and not has_control(message_ids[0]) else None
    subject = clean(_decoded(message.get("Subject", "")), MAX_SUBJECT)
    return ReplyMessage(
        reply_key=message_id or f"sha256:{raw_key}",
        source=source,
        message_id=message_id,
        sender=_sender(message),
        subject=subject,
        sent_at=_date(message),
        references=_references(message),
        automatic=is_automatic(message, subject),
        excerpt=excerpt(_text(message)),
    )

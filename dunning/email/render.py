"""Emails as RFC 5322 messages: Jinja2 text and HTML alternatives, headers the audit can follow.

What each email says comes from templates (`dunning.email.templating`: packaged, or
the operator's `templates_dir`, per language) filled with the variables of
`dunning.email.context`, which also formats amounts and dates for the email's
locale: the customer's (`customer_locale`), else the deployment's `locale`.
This module builds the message around them, the same bytes for the same
inputs.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import quopri
from collections.abc import Sequence
from dataclasses import dataclass
from email.header import Header
from email.message import Message
from email.mime.multipart import MIMEMultipart
from email.policy import Compat32
from email.utils import format_datetime
from typing import Any

from dunning.email import templating
from dunning.email.context import (
    DEFAULT_SIGNATURE,
    Context,
    apology_context,
    currency_totals,
    format_amount,
    invoice_context,
    payment_failed_context,
    reminder_context,
    signing,
)
from dunning.email.locales import email_locale, known_locale
from dunning.safe_text import address_header, header_value, is_address
from dunning.vocabulary import EmailKind

__all__ = ["currency_totals", "format_amount"]  # formatting lives in `email_context`; imported from here too

MAX_LINE = 998  # octets per line, RFC 5322 section 2.1.1
# Every field of a plan row that building an email reads (here, `email.context`, `email.compose` and
# `send.render_pool.RenderSettings`): what a render worker is sent of each row, and no more
# (`tests/test_render_pool.py` checks this list against the code that reads the rows)
RENDER_FIELDS = frozenset({
    "amount_due", "amount_minor", "amount_paid", "billing_period", "broken_promise_amount_minor",
    "broken_promise_until", "currency", "customer_cc", "customer_email", "customer_email_name", "customer_locale",
    "customer_name", "days_overdue", "due_date", "fees", "gentle_first", "idempotency_key", "invoice_id",
    "invoice_lines", "kind", "message_id", "payment_url", "policy", "reminders_sent_before", "remaining_minor", "stage",
    "stage_count", "stage_rank", "tone",
})  # fmt: skip


@dataclass(frozen=True)
class Sender:
    """Who every email is from: `address` (the From address, also the SMTP envelope sender), an optional display
    `name` for the From header, an optional `reply_to` address, and who signs it."""

    address: str
    name: str | None = None
    reply_to: str | None = None
    # who signs every default template, text and HTML alike (`company_name`, `signature` in the config)
    company_name: str | None = None
    signature: str = DEFAULT_SIGNATURE


def body_encoding(body: str) -> tuple[str, bytes]:
    """(Content-Transfer-Encoding, payload) of a text body: 8bit UTF-8 (7bit when ASCII), so every amount stays
    readable in the raw file; quoted-printable when a line is longer than SMTP allows (998 octets: a long pay
    link, an operator's template), which wraps it losslessly."""
    encoded = body.encode("utf-8")
    if len(encoded) > MAX_LINE and any(len(line) > MAX_LINE for line in encoded.split(b"\n")):
        return "quoted-printable", quopri.encodestring(encoded)
    return "7bit" if body.isascii() else "8bit", encoded


def text_part(body: str, subtype: str) -> Message:
    """A UTF-8 text part, encoded as `body_encoding` says.

    Byte for byte what `MIMEText(body, subtype, utf-8 charset without body
    encoding)` builds (a test holds the two equal); written out because
    `MIMEText` re-parses its own Content-Type parameters, which was a sixth of
    the time to render a reminder.
    """
    part = Message()
    part["Content-Type"] = f'text/{subtype}; charset="utf-8"'
    part["MIME-Version"] = "1.0"
    encoding, payload = body_encoding(body)
    part["Content-Transfer-Encoding"] = encoding
    part.set_payload(payload.decode("ascii", "surrogateescape"))
    return part


class _WirePolicy(Compat32):
    """compat32 with RFC 5322 line endings, and short ASCII headers written as they are.

    The stock policy builds a `Header` object to fold every header, even ones
    that need no folding; in the profile that was a third of the time to
    serialize a message. Long or non-ASCII headers still go through it.
    """

    def _fast(self, name: str, value: object) -> str | None:
        # printable ASCII only: a CR, LF or other control character never takes this path (nor any other:
        # `message_of` refuses such values before they reach a header)
        if not (isinstance(value, str) and value.isascii() and value.isprintable()):
            return None
        if len(name) + len(value) + 2 <= 78:
            return f"{name}: {value}{self.linesep}"
        if " " not in value:
            # compat32 folds only at white space: a long value without any goes whole on a line of its own, after
            # the name (`X-Dunning-Keys` of an email of several invoices: its `Header` fold was 12% of rendering it)
            return f"{name}: {self.linesep} {value}{self.linesep}"
        return None

    # `value` is a str or, for a header set from a `Header` (non-ASCII), that Header; the stub says str only
    def fold(self, name: str, value: str) -> str:
        return self._fast(name, value) or super().fold(name, value)

    def fold_binary(self, name: str, value: str) -> bytes:
        fast = self._fast(name, value)
        return fast.encode("ascii") if fast else super().fold_binary(name, value)


WIRE_POLICY = _WirePolicy(linesep="\r\n")  # how providers serialize a message


class EmailBuildError(ValueError):
    """One email cannot be built from its data; its keys end `failed` with this reason and the send goes on."""


def boundary_of(message_id: str, parts: Sequence[str]) -> str:
    """A boundary no body contains: a hash over the bodies themselves, so data cannot carry it in advance.

    Still a function of the content, so the same email always serializes to the same bytes.
    """
    digest = hashlib.sha256(message_id.encode())
    for part in parts:
        digest.update(part.encode("utf-8", "surrogatepass"))
    boundary = "=_dunning_" + digest.hexdigest()[:32]
    if any(boundary in part for part in parts):  # needs a sha256 fixed point: proven impossible in practice, checked
        raise EmailBuildError("a body contains its own MIME boundary")
    return boundary


@dataclass(frozen=True)
class Draft:
    """One email before it is built: the recipient, headers and rendered bodies every kind of email is made of.

    `message_of` builds the `email.message.Message`; `dunning.email.compose` writes
    the same email's bytes directly, with the same checks.
    """

    to: str
    sender: Sender
    subject: str
    message_id: str
    kind: EmailKind
    keys: Sequence[str]
    text: str
    html: str
    when: dt.datetime
    to_name: str | None = None  # the display name `customer_email` gave (`Name <address>`), kept in To
    cc: tuple[str, ...] = ()  # the copy addresses (`dunning.desk.contacts`), each through the one address rule


@functools.lru_cache(maxsize=64)
def date_header(when: dt.datetime) -> str:
    """The Date header's value; cached: every email of a run has its `as_of`."""
    return format_datetime(when.astimezone(dt.UTC))


def checked_recipient(draft: Draft) -> str:
    """The draft's recipient, through the one address rule: `EmailBuildError` when it is not one address."""
    if not is_address(draft.to):
        raise EmailBuildError(f"recipient is not a single valid address: {draft.to!r}"[:300])
    for copy in draft.cc:
        if not is_address(copy):
            raise EmailBuildError(f"Cc is not a single valid address: {copy!r}"[:300])
    return draft.to


def checked_headers(draft: Draft) -> list[tuple[str, str | Header]]:
    """The headers after From and Reply-To, in order, each value through `safe_text.header_value` (ValueError
    naming the header it refuses): what `message_of` sets and `dunning.email.compose` folds."""
    values = (
        *((("Cc", ", ".join(draft.cc)),) if draft.cc else ()),
        ("Subject", draft.subject),
        ("Date", date_header(draft.when)),
        ("Message-ID", draft.message_id),
        ("X-Dunning-Kind", str(draft.kind)),
        ("X-Dunning-Keys", ",".join(draft.keys)),
    )
    # the recipient as `Name <address>` when the snapshot named them (`safe_text.address_header`: quoted, or RFC 2047)
    return [("To", address_header("To", draft.to, draft.to_name)), *((n, header_value(n, v)) for n, v in values)]


def message_of(draft: Draft) -> Message:
    """multipart/alternative built with the `email` package's compat32 classes.

    The modern `EmailMessage` API parses every header it is given and cost
    about 3 ms per message in the profile of a 12,000-email cycle; these plain
    classes build the same RFC 5322 message about five times faster. Every
    header value goes through `safe_text.header_value` (no line breaks or
    controls, RFC 2047 when not ASCII; the From name through
    `safe_text.address_header`) and the recipient through the one address
    rule, so data can add no header and no recipient.
    """
    sender, text, html = draft.sender, draft.text, draft.html
    checked_recipient(draft)
    message = MIMEMultipart("alternative")
    try:
        message["From"] = address_header("From", sender.address, sender.name)  # type: ignore[assignment]
        if sender.reply_to is not None:
            message["Reply-To"] = address_header("Reply-To", sender.reply_to)  # type: ignore[assignment]
        for name, value in checked_headers(draft):
            # a Header is a documented header value (RFC 2047 when not ASCII); typeshed's MIMEMultipart takes str only
            message[name] = value  # type: ignore[assignment]
    except ValueError as exc:
        raise EmailBuildError(str(exc)) from None
    message.attach(text_part(text, "plain"))
    message.attach(text_part(html, "html"))
    message.set_boundary(boundary_of(draft.message_id, (text, html)))
    return message


def fallen_back(records: Sequence[dict[str, Any]], default: str, templates_dir: str | None, kind: str) -> str | None:
    """The customer's locale of one email when its text falls back to another language (`templating.text_locale`),
    else None: what `preview` lists."""
    asked = email_locale(records, default)
    used = templating.text_locale(templates_dir, asked, default, f"{kind}.txt.j2")
    return asked if used != asked else None


def _sender(sender: str | Sender) -> Sender:
    return Sender(sender) if isinstance(sender, str) else sender


def _render(
    templates_dir: str | None, locale: str, kind: EmailKind, context: Context, sender: Sender
) -> tuple[str, str, str]:
    """(subject, text, html); a template that fails on this email's data fails this email only (`EmailBuildError`).
    Every template also sees who signs: `company_name` and `signature` (`context.signing`)."""
    try:
        return templating.render(templates_dir, locale, kind, {**context, **signing(sender, locale)})
    except Exception as exc:  # noqa: BLE001 - whatever a template raises, the send goes on without this email
        raise EmailBuildError(f"template {templating.where(exc)}: {type(exc).__name__}: {exc}"[:500]) from None


def reminder_email(
    rows: Sequence[dict[str, Any]],
    *,
    sender: str | Sender,
    message_id: str,
    as_of: dt.datetime,
    locale: str = "en_US",
    templates_dir: str | None = None,
) -> Message:
    """One reminder email covering `rows` (one per invoice; same recipient), in the firmest tone among them.

    `locale` is the default; the rows' own `customer_locale` wins (`locales.email_locale`).
    """
    return message_of(_invoices_draft(EmailKind.REMINDER, rows, sender, message_id, as_of, locale, templates_dir))


def invoice_email(
    rows: Sequence[dict[str, Any]],
    *,
    sender: str | Sender,
    message_id: str,
    as_of: dt.datetime,
    locale: str = "en_US",
    templates_dir: str | None = None,
) -> Message:
    """One invoice email covering `rows` (the invoices newly issued to one recipient, one per row)."""
    return message_of(_invoices_draft(EmailKind.INVOICE, rows, sender, message_id, as_of, locale, templates_dir))


_INVOICES_CONTEXT = {EmailKind.REMINDER: reminder_context, EmailKind.INVOICE: invoice_context}


def _invoices_draft(
    kind: EmailKind,
    rows: Sequence[dict[str, Any]],
    sender: str | Sender,
    message_id: str,
    as_of: dt.datetime,
    locale: str,
    templates_dir: str | None,
) -> Draft:
    """An email of `kind` listing `rows` (one invoice each, one recipient), sorted by invoice id."""
    rows = sorted(rows, key=lambda r: r["invoice_id"])
    locale = templating.text_locale(templates_dir, email_locale(rows, locale), locale, f"{kind}.txt.j2")
    sender = _sender(sender)
    subject, text, html = _render(templates_dir, locale, kind, _INVOICES_CONTEXT[kind](rows, as_of, locale), sender)
    to, keys = rows[0]["customer_email"], [r["idempotency_key"] for r in rows]  # in the order the headers need them
    cc = tuple(a for a in (rows[0].get("customer_cc") or "").split(",") if a)
    return Draft(to, sender, subject, message_id, kind, keys, text, html, as_of, rows[0].get("customer_email_name"), cc)


def apology_email(
    flood: dict[str, Any],
    statement: Sequence[dict[str, Any]],
    *,
    to: str,
    sender: str | Sender,
    key: str,
    message_id: str,
    as_of: dt.datetime,
    locale: str = "en_US",
    templates_dir: str | None = None,
) -> Message:
    """One apology: what happened (`flood`: emails, first_at, last_at) and what is owed now (`statement` rows)."""
    locale = templating.text_locale(
        templates_dir, known_locale(flood.get("customer_locale")) or locale, locale, f"{EmailKind.APOLOGY}.txt.j2"
    )
    context = apology_context(flood, statement, as_of, locale)
    signer = _sender(sender)
    subject, text, html = _render(templates_dir, locale, EmailKind.APOLOGY, context, signer)
    return message_of(Draft(to, signer, subject, message_id, EmailKind.APOLOGY, [key], text, html, as_of))


def payment_failed_email(
    record: dict[str, Any],
    *,
    sender: str | Sender,
    as_of: dt.datetime,
    locale: str = "en_US",
    templates_dir: str | None = None,
) -> Message:
    """The notice for one `invoice.payment_failed` event."""
    return message_of(_payment_failed_draft(record, sender, as_of, locale, templates_dir))


def _payment_failed_draft(
    record: dict[str, Any], sender: str | Sender, as_of: dt.datetime, locale: str, templates_dir: str | None
) -> Draft:
    locale = templating.text_locale(
        templates_dir, email_locale([record], locale), locale, f"{EmailKind.PAYMENT_FAILED}.txt.j2"
    )
    context = payment_failed_context(record, locale)
    signer = _sender(sender)
    subject, text, html = _render(templates_dir, locale, EmailKind.PAYMENT_FAILED, context, signer)
    to, message_id, keys = record["customer_email"], record["message_id"], [record["idempotency_key"]]
    return Draft(to, signer, subject, message_id, EmailKind.PAYMENT_FAILED, keys, text, html, as_of)


def draft_for(
    records: Sequence[dict[str, Any]],
    *,
    sender: str | Sender,
    as_of: dt.datetime,
    locale: str = "en_US",
    templates_dir: str | None = None,
) -> Draft:
    """The email for one send group, rendered: a payment-failed notice, an invoice email or a reminder covering
    its invoices."""
    if records[0].get("kind") == EmailKind.PAYMENT_FAILED:
        return _payment_failed_draft(records[0], sender, as_of, locale, templates_dir)
    kind = EmailKind.INVOICE if records[0].get("kind") == EmailKind.INVOICE else EmailKind.REMINDER
    return _invoices_draft(kind, records, sender, records[0]["message_id"], as_of, locale, templates_dir)


def render_for(
    records: Sequence[dict[str, Any]],
    *,
    sender: str | Sender,
    as_of: dt.datetime,
    locale: str = "en_US",
    templates_dir: str | None = None,
) -> Message:
    """The message for one send group (`draft_for`); `compose.wire_for` gives its bytes without building it."""
    return message_of(draft_for(records, sender=sender, as_of=as_of, locale=locale, templates_dir=templates_dir))

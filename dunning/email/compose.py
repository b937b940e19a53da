"""Our emails' bytes written directly, without the `email.message` objects that only existed to be serialized.

A run renders tens of thousands of emails (71,572 reminders on a day of the
1M-invoice benchmark), and each one was built as a `Message` (a multipart
over two text parts, its Content-Type rewritten by `set_boundary`), then
walked again by `wire.wire_bytes`, which parses that Content-Type back for
the boundary and folds every header, the From and Date that every email of
the run shares included: about half the CPU time of an email besides its
templates. `compose` writes the bytes `render.message_of(draft)` serializes
to (`message.as_bytes(policy=WIRE_POLICY)`), byte for byte, from the draft
itself; tests hold the two equal for every kind of email, long and non-ASCII
headers, quoted-printable bodies and hostile snapshots.

The checks are `message_of`'s, in its order, with its errors, and the same
code: the recipient by the one address rule (`render.checked_recipient`),
every header value through `safe_text.header_value` (`render.checked_headers`;
the From and Reply-To through `address_header`), the bodies through
`render.body_encoding`, the boundary through `render.boundary_of`. Headers
are folded by `WIRE_POLICY.fold_binary` (RFC 2047 when not ASCII, compat32
folding when long); what is the same for every email of a run (From and
Reply-To, the part headers, the Content-Type around the boundary) is folded
once. A boundary of another shape than `boundary_of` makes is folded as any
header is.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Sequence
from typing import Any

from dunning.email.render import (
    WIRE_POLICY,
    Draft,
    EmailBuildError,
    Sender,
    body_encoding,
    boundary_of,
    checked_headers,
    checked_recipient,
    draft_for,
)
from dunning.email.wire import WireEmail
from dunning.keys import idempotency_key_in
from dunning.safe_text import address_header

_CRLF = b"\r\n"
_EOL = re.compile(rb"\r\n|\r|\n")  # what email.generator turns into the policy's line separator
_fold = WIRE_POLICY.fold_binary
_MIME_VERSION = _fold("MIME-Version", "1.0")


def _content_type(boundary: str) -> str:
    return f'multipart/alternative; boundary="{boundary}"'  # what `Message.set_boundary` writes


# Every boundary of `boundary_of`'s shape folds alike: folding looks at lengths, spaces and `;,` only, and the
# boundary's characters are never any of these; so the folded header is one sample's, around the boundary
_BOUNDARY = re.compile(r"=_dunning_[0-9a-f]{32}")
_SAMPLE = boundary_of("", ())
_BEFORE_BOUNDARY, _AFTER_BOUNDARY = _fold("Content-Type", _content_type(_SAMPLE)).split(_SAMPLE.encode("ascii"))


@functools.lru_cache(maxsize=64)
def _sender_headers(sender: Sender) -> bytes:
    """From and Reply-To, folded (ValueError when either is refused): the same bytes in every email of a run."""
    folded = _fold("From", address_header("From", sender.address, sender.name))  # type: ignore[arg-type]
    if sender.reply_to is not None:
        folded += _fold("Reply-To", address_header("Reply-To", sender.reply_to))  # type: ignore[arg-type]
    return folded


@functools.cache
def _part_headers(subtype: str, encoding: str) -> bytes:
    """The headers of a text part as `render.text_part` sets them, folded, and the blank line after them."""
    headers = (
        ("Content-Type", f'text/{subtype}; charset="utf-8"'),
        ("MIME-Version", "1.0"),
        ("Content-Transfer-Encoding", encoding),
    )
    return b"".join(_fold(name, value) for name, value in headers) + _CRLF


def _crlf(payload: bytes) -> bytes:
    """Every line end made CRLF, as the generator writes a payload."""
    return payload.replace(b"\n", _CRLF) if b"\r" not in payload else _EOL.sub(_CRLF, payload)


def compose(draft: Draft) -> WireEmail:
    """`WireEmail.of(render.message_of(draft))`, byte for byte, without building the message.

    Raises what `message_of` raises, for the same drafts: `EmailBuildError`
    for a recipient that is not one address, a header value with a line
    break or control character, a body holding its own boundary; a
    `UnicodeEncodeError` for a body that is not text.
    """
    checked_recipient(draft)
    try:
        sender = _sender_headers(draft.sender)
        headers = checked_headers(draft)
    except ValueError as exc:
        raise EmailBuildError(str(exc)) from None
    text_encoding, text = body_encoding(draft.text)
    html_encoding, html = body_encoding(draft.html)
    boundary = boundary_of(draft.message_id, (draft.text, draft.html))
    delimiter = b"--" + boundary.encode("ascii", "surrogateescape")
    if _BOUNDARY.fullmatch(boundary):
        content_type = _BEFORE_BOUNDARY + boundary.encode("ascii") + _AFTER_BOUNDARY
    else:
        content_type = _fold("Content-Type", _content_type(boundary))
    data = b"".join(
        (
            content_type,
            _MIME_VERSION,
            sender,
            *(_fold(name, value) for name, value in headers),  # type: ignore[arg-type]
            _CRLF,
            delimiter + _CRLF,
            _part_headers("plain", text_encoding),
            _crlf(text),
            _CRLF + delimiter + _CRLF,
            _part_headers("html", html_encoding),
            _crlf(html),
            _CRLF + delimiter + b"--" + _CRLF,
        )
    )
    key = idempotency_key_in(",".join(draft.keys), draft.message_id)
    return WireEmail(draft.to, draft.message_id, key, data, tuple(draft.cc))


def wire_for(
    records: Sequence[dict[str, Any]],
    *,
    sender: str | Sender,
    as_of: dt.datetime,
    locale: str = "en_US",
    templates_dir: str | None = None,
) -> WireEmail:
    """The bytes of `render.render_for`'s message for one send group, composed directly."""
    return compose(draft_for(records, sender=sender, as_of=as_of, locale=locale, templates_dir=templates_dir))

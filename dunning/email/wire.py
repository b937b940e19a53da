"""An email as the bytes a provider hands over, built once, wherever it was rendered.

`WireEmail` is what a render worker process sends back (`dunning.send.render_pool`)
and what a provider that takes bytes writes or sends: the serialized message
plus the envelope the provider needs (recipient, Message-ID, the idempotency
key a relay dedupes on). `wire_bytes` serializes a message exactly as
`message.as_bytes(policy=WIRE_POLICY)` does, byte for byte (a test holds the
two equal over ordinary and hostile emails), but for the shape every email of
ours has (multipart/alternative over text parts) it writes the parts itself
instead of going through `email.generator`, which was close to half the time
to render a reminder; any other shape goes through the generator. The emails
a run renders by default never become messages at all: `dunning.email.compose`
writes the same bytes from the rendered draft.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from email.header import Header
from email.message import Message
from email.utils import parseaddr
from typing import Any

from dunning.email.render import WIRE_POLICY
from dunning.keys import idempotency_key_of

_EOL = re.compile(rb"\r\n|\r|\n")  # what email.generator turns into the policy's line separator
_CRLF = b"\r\n"


@dataclass(frozen=True)
class WireEmail:
    """One rendered email: its bytes (RFC 5322, CRLF line ends) and the envelope a provider needs."""

    to: str
    message_id: str
    idempotency_key: str
    data: bytes
    cc: tuple[str, ...] = ()  # the copy addresses: one envelope recipient each, after `to`

    @classmethod
    def of(cls, message: Message) -> WireEmail:
        # the envelope takes the bare address: a To with a display name (`Name <address>`) is parsed for it
        header = message["To"]  # a Header (a name that is not ASCII) parsed as it goes on the wire, RFC 2047
        to = parseaddr(header.encode() if isinstance(header, Header) else str(header))[1] or str(header)
        cc = tuple(a.strip() for a in str(message["Cc"] or "").split(",") if a.strip())
        key = idempotency_key_of(message)
        return cls(to, str(message["Message-ID"]), key, wire_bytes(message), cc)

    @property
    def recipients(self) -> tuple[str, ...]:
        """Every envelope recipient, `To` first."""
        return (self.to, *self.cc)

    def with_header(self, name: str, value: str) -> bytes:
        """The bytes with one more header after the others, folded as `message[name] = value` then serializing
        would fold it: the same bytes as adding the header to the message before serializing."""
        end = self.data.index(_CRLF + _CRLF) + len(_CRLF)
        return self.data[:end] + WIRE_POLICY.fold_binary(name, value) + self.data[end:]


def _headers(message: Message, out: bytearray) -> None:
    fold = WIRE_POLICY.fold_binary
    for name, value in message.raw_items():
        out += fold(name, value)
    out += _CRLF


def _payload(message: Message) -> Any:
    return message._payload  # type: ignore[attr-defined]  # noqa: SLF001 - what email.generator itself writes out


def _fast_shape(message: Message) -> bool:
    """multipart with text parts that hold str payloads, no preamble or epilogue: what `render.message_of` builds."""
    parts = _payload(message)
    return (
        isinstance(parts, list)
        and message.preamble is None
        and message.epilogue is None
        and message.get_content_maintype() == "multipart"
        and all(
            type(part) is Message and isinstance(_payload(part), str) and part.get_content_maintype() == "text"
            for part in parts
        )
    )


def wire_bytes(message: Message) -> bytes:
    """`message.as_bytes(policy=WIRE_POLICY)`, written directly for our messages' shape.

    What `email.generator.BytesGenerator` does for that shape: each header
    folded by the policy, a blank line; the parts between `--boundary` lines,
    each its headers and its payload with every line end made CRLF (the bytes
    of an 8bit body come back from its surrogate escapes); `--boundary--` last.
    """
    boundary = message.get_boundary() if _fast_shape(message) else None
    if boundary is None:
        return message.as_bytes(policy=WIRE_POLICY)
    out = bytearray()
    _headers(message, out)
    delimiter = b"--" + boundary.encode("ascii", "surrogateescape")
    parts = _payload(message)
    for index, part in enumerate(parts):
        out += (_CRLF if index else b"") + delimiter + _CRLF
        _headers(part, out)
        out += _EOL.sub(_CRLF, _payload(part).encode("ascii", "surrogateescape"))
    if not parts:  # the generator writes the opening delimiter even with no part
        out += delimiter + _CRLF
    out += _CRLF + delimiter + b"--" + _CRLF
    return bytes(out)

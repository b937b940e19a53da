"""Text from data is hostile: one place that decides what may reach a header, a recipient or a terminal.

Snapshot rows, Stripe objects, events, send logs and config all end up in
emails and operator output. Each rule here exists once, so every kind of email
(reminder, payment-failed notice, apology) and every printed line obeys the
same one:

- `is_address` / `ADDRESS_PATTERN`: the only recipient rule. A bare ASCII
  `local@domain.tld` (RFC 5321 dot-atom, labels of letters, digits and hyphens),
  at most 254 characters: no display name, no list, no comments, no line breaks.
  The polars expression (`policy.sendable_expr`) uses the same pattern.
- `header_value`: a header value built from data, refused (ValueError) when it
  holds any line break or control character, RFC 2047-encoded when not ASCII.
- `address_header`: an address header (`From`, `Reply-To`) from one address
  and an optional display name: quoted when the name holds specials (`"`, `,`,
  `<`), RFC 2047-encoded when not ASCII, refused with a control character.
- `has_control`: whether text holds a control character, a line or paragraph
  separator or a bidirectional control (validation quarantines such ids and
  names before anything is computed).
- `for_terminal` and `redact`: what operators see, with control characters
  escaped and URLs and secrets cut out.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
from collections.abc import Iterable, Iterator
from email.header import Header
from email.utils import formataddr
from typing import Any

# C0 and C1 controls, DEL, and the Unicode line and paragraph separators: everything a mail parser or a
# terminal may take as a line break or an escape sequence; and the bidirectional embeddings, overrides and
# isolates (U+202A-U+202E, U+2066-U+2069), which make a subject or a terminal line read in another order
# than it is written ("Trojan Source")
CONTROL_CLASS = r"\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
CONTROL = re.compile(f"[{CONTROL_CLASS}]")
MAX_ADDRESS = 254
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
ADDRESS_PATTERN = rf"^{_ATEXT}{{1,64}}(?:\.{_ATEXT}{{1,64}})*@(?:{_LABEL}\.)+[A-Za-z]{{2,63}}$"
_ADDRESS = re.compile(ADDRESS_PATTERN)
_URL = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^/\s?#@]*@)?([^/\s?#]*)(\S*)")
# urllib3 names the request's path and query without scheme or host ("Max retries exceeded with url: /hooks/T0/tok?k=")
_BARE_PATH = re.compile(r"\b(url: )/\S*")


def has_control(text: str) -> bool:
    return CONTROL.search(text) is not None


def is_address(value: object) -> bool:
    """The one recipient rule for every kind of email (see the module docstring)."""
    return isinstance(value, str) and len(value) <= MAX_ADDRESS and _ADDRESS.fullmatch(value) is not None


def header_value(name: str, value: str) -> str | Header:
    """`value` for header `name`, or ValueError naming the header when data put a line break or control in it."""
    if has_control(value):
        raise ValueError(f"header {name} would contain a line break or control character")
    return value if value.isascii() else Header(value, "utf-8", header_name=name)


def address_header(name: str, address: str, display_name: str | None = None) -> str | Header:
    """`address`, or `display_name <address>`, for header `name`; ValueError when either could add to the header."""
    if not is_address(address):
        raise ValueError(f"header {name} needs one plain address")
    if not display_name:
        return address
    if has_control(display_name):
        raise ValueError(f"header {name} would contain a line break or control character")
    if display_name.isascii():  # quoted, with `"` and `\\` escaped, when it holds any special character
        return formataddr((display_name, address))
    value = Header(display_name, "utf-8", header_name=name)  # encoded words: no special character shows
    value.append(f" <{address}>", "us-ascii")
    return value


def for_terminal(text: str) -> str:
    """Control and escape characters from data shown as `\\xNN`; the newlines and tabs of our own output kept."""
    return CONTROL.sub(
        lambda m: m.group() if m.group() in "\n\t" else m.group().encode("unicode_escape").decode("ascii"), text
    )


def _cut_url(match: re.Match[str]) -> str:
    scheme, userinfo, host, rest = match.groups()
    return f"{scheme}{host}/…" if userinfo or rest else match.group(0)


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """`text` with every URL cut to scheme and host (paths, queries and user info carry tokens), and a request's path
    named alone (urllib3's `url: /path?query`) cut too; each secret masked. The rule for every error text that is
    stored or shown (alerts, `reminder_ledger.last_error`); migration 18 applied it to the rows recorded before."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return _BARE_PATH.sub(r"\1/…", _URL.sub(_cut_url, text))


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No garbage collection inside the block: for parsing or encoding hostile, deeply nested JSON.

    The parser stops at the interpreter's recursion limit. A collection that
    started there (any allocation may start one) would run the finalizers of
    unrelated garbage at that depth, where they fail, and the interpreter
    prints each failure as an "Exception ignored in ..." traceback on stderr:
    a traceback on a user's terminal for a file they gave us. Paused, the
    collection runs later, at a normal depth."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def parse_json(text: str | bytes) -> Any:
    """`json.loads` of hostile text, with collection paused (`collection_paused`); raises what `json.loads` raises,
    RecursionError included."""
    with collection_paused():
        return json.loads(text)

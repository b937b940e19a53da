"""Which side of the hand-over an HTTP request failed on, for every client that posts something only once: the
Resend provider and the escalation webhook (`dunning.send.escalation`).

A request that never left this machine (it could not be prepared, the connection was refused or never made, the
name did not resolve) is `failed`: safe to retry. Anything after the connection was made (a read timeout, a reset,
an aborted answer) may have reached the receiver, and is `unknown`: asked about or resubmitted under its key, never
sent blindly again."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # requests is imported by the call that posts (0.1 s a process that posts nothing: an idle hour)
    import requests

_NOT_CONNECTED = ("NewConnectionError", "NameResolutionError", "Connection refused")


def may_have_left(exc: requests.RequestException) -> bool:
    """Whether the request that raised `exc` may have reached the receiver."""
    import requests

    # raised while the request is prepared, before a connection is made: nothing left this machine
    never_left = (
        requests.exceptions.InvalidHeader,
        requests.exceptions.InvalidURL,
        requests.exceptions.MissingSchema,
        requests.exceptions.InvalidSchema,
        requests.exceptions.URLRequired,
    )
    if isinstance(exc, (requests.ConnectTimeout, *never_left)):
        return False
    if isinstance(exc, requests.ConnectionError):
        # refused or unresolvable: the request never left; anything else (reset, aborted) may have been read
        return not any(s in repr(exc) for s in _NOT_CONNECTED)
    return True  # a read timeout, or anything else once connected


MAX_RETRY_AFTER_SECONDS = 24 * 3600  # a longer Retry-After is read as a day: attempts still run out as configured


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """A `Retry-After` header's delay (seconds, or an HTTP date), capped at a day; None when absent or unreadable."""
    value = next((v for k, v in (headers or {}).items() if k.lower() == "retry-after"), None)
    if value is None:
        return None
    text = str(value).strip()
    if text.isdigit():
        return float(min(int(text), MAX_RETRY_AFTER_SECONDS))
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    delay = (when - dt.datetime.now(dt.UTC)).total_seconds()
    return float(min(max(delay, 0.0), MAX_RETRY_AFTER_SECONDS))

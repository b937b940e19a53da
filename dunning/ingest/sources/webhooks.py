"""Verifying the billing vendors' webhooks (pure standard library: neither SDK has a helper for it in Python).

- **Chargebee** signs nothing; its webhooks carry HTTP Basic credentials the merchant sets in the dashboard.
  `chargebee_authorized` compares user and password with `CHARGEBEE_WEBHOOK_USERNAME`/`_PASSWORD` in constant time
  (`hmac.compare_digest`, both always compared). A verified body is still only a trigger: the event is fetched back
  from the API by its id before it changes anything (`chargebee.ChargebeeSource.fetch_back`).
- **Recurly**: `recurly-signature: <timestamp ms>,<hex>[,<hex>...]`, each hex an HMAC-SHA256 with the endpoint's
  secret of `{timestamp}.{raw body}`; several appear for 24 h after a key is regenerated, and any may match
  (`recurly_verified`, constant-time). The timestamp is milliseconds, within `TOLERANCE_MS` (5 minutes) of now.
  The notification's id is `recurly-notification-id` (the same on every retry), else its body's id and type.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Mapping
from typing import Any

TOLERANCE_MS = 5 * 60 * 1000
_HEX = re.compile(r"[0-9a-fA-F]{64}")
MAX_ID = 200


def chargebee_authorized(authorization: str | None, username: str, password: str) -> bool:
    """Whether an `Authorization: Basic ...` header carries exactly these credentials (constant time)."""
    if not authorization or not authorization.startswith("Basic "):
        return False
    try:
        given = base64.b64decode(authorization[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return False
    user, _, secret = given.partition(":")
    same_user = hmac.compare_digest(user.encode(), username.encode())
    same_password = hmac.compare_digest(secret.encode(), password.encode())
    return same_user and same_password


def recurly_verified(
    header: str | None, body: bytes, secret: str, now_ms: int, tolerance_ms: int = TOLERANCE_MS
) -> bool:
    """Whether `recurly-signature` signs `body` with `secret`, within the tolerance of `now_ms` (module docstring)."""
    if not header or len(header) > 4096:
        return False
    stamp, *signatures = (part.strip() for part in header.split(","))
    if not stamp.isdigit() or len(stamp) > 15 or abs(now_ms - int(stamp)) > tolerance_ms:
        return False
    expected = hmac.new(secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    matches = [hmac.compare_digest(expected, s.lower()) for s in signatures if _HEX.fullmatch(s)]
    return any(matches)


def _usable(value: Any) -> str | None:
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        text = str(value)
        if 0 < len(text) <= MAX_ID and text.isprintable():
            return text
    return None


def chargebee_event_id(event: Any) -> str | None:
    """The event id a Chargebee webhook names (what is fetched back), None when it names none."""
    return _usable(event.get("id")) if isinstance(event, dict) else None


def recurly_notification_id(headers: Mapping[str, str], notification: Any) -> str | None:
    """A Recurly notification's id: `recurly-notification-id`, else its body's `id` with its type."""
    header = _usable(headers.get("recurly-notification-id"))
    if header is not None:
        return header
    if not isinstance(notification, dict):
        return None
    parts = [_usable(notification.get(k)) for k in ("id", "object_type", "event_type")]
    return ":".join(p for p in parts if p) if parts[0] else None

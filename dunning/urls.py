"""The one rule for a URL that carries a key or a token: `https` with a host, or `http` to this machine only."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str | None) -> bool:
    """A host on this machine: `localhost`, 127.0.0.0/8 or ::1."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host.lower() in LOOPBACK_HOSTS


def http_url(value: str | None, key: str) -> str | None:
    """An absolute `https` URL with a host, or `http` to this machine only (a local relay, a test's fake): these
    URLs carry a key or a token (a bearer key, a routing key, a Slack webhook's path), which never travels in
    clear text over a network. ValueError naming `key`; the value is not echoed: it may hold a token."""
    if value is None:
        return None
    parts = urlsplit(value)
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or len(value) > 2048
        or any(c.isspace() for c in value)
    ):
        raise ValueError(f"{key} must be an https:// URL with a host (the value is not shown: it may hold a token)")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ValueError(
            f"{key} must be https:// (http:// only to this machine: the request carries a key or a token; the "
            "value is not shown)"
        )
    return value

"""The one rule for a URL that carries a key or a token: `https` with a host, or `http` to this machine only."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import quote, unquote, urlsplit

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


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


def token_parts(url: str | None) -> tuple[str, ...]:
    """The parts of `url` that may carry its token, as a text may quote them: the URL itself, its path and query
    together and apart, as given, percent-encoded and decoded (longest first, so each is masked whole). A path or a
    query is a secret: a Slack webhook's path is its token, a collections system's query its key."""
    if not url:
        return ()
    parts = urlsplit(url)
    tail = parts.path + (f"?{parts.query}" if parts.query else "")
    forms = {url, tail, parts.path if len(parts.path) > 1 else "", parts.query}
    forms |= {quote(f, safe="/?=&:%") for f in forms if f} | {unquote(f) for f in forms if f}
    return tuple(sorted((f for f in forms if len(f) > 1), key=len, reverse=True))


def store_url_problem(url: str) -> str | None:
    """What is wrong with a `store.url`, in words that never quote it (it may hold a credential), or None: a
    directory, or `s3://bucket/prefix` with no credentials, query or fragment in it."""
    if "://" not in url:
        return None
    parts = urlsplit(url)
    if parts.scheme != "s3":
        return "must be a directory or s3://bucket/prefix"
    # a secret may hold '/' (AWS's do), which ends the netloc early: any '@', or a ':' before the first '/', is one
    if "@" in url or ":" in url.split("://", 1)[1].split("/", 1)[0]:
        return (
            "credentials in the URL are refused (s3://KEY:SECRET@bucket): S3 credentials come from the AWS_* "
            "environment variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), never from the config"
        )
    if parts.query or parts.fragment:
        return "takes no query or fragment (s3://bucket/prefix); S3 credentials come from the AWS_* environment"
    if not S3_BUCKET.fullmatch(parts.netloc):
        return "has no valid bucket name (s3://bucket/prefix: 3 to 63 lower-case letters, digits, dots, hyphens)"
    return None

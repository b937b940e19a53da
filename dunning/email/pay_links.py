"""Pay links: the snapshot's optional `payment_url`, kept only when it is a plain `https` link.

The link comes from the billing system (Stripe's `hosted_invoice_url`) or from
whoever wrote the snapshot, and ends up as the `href` of a button. A
`javascript:` or `data:` link there runs code in the customer's mail client, an
`http:` link sends them to a page anyone on the path can rewrite, and a link
with user info (`https://bank.example@evil.test/`) is a classic phishing
disguise. So a link is kept only when it passes `https_url`; anything else is
dropped (never rendered) and the row is flagged `payment_url_dropped`, which
the audit reports (reason `payment_url_dropped`). The row itself is still
dunned: a bad link is no reason to stop asking for the money.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:  # the plan's frames only: a render worker (`dunning.send.render_pool`) imports no polars
    import polars as pl

MAX_URL = 2048
# RFC 3986 characters only (unreserved, reserved, percent): no whitespace, controls, quotes, angle brackets,
# backslashes or non-ASCII, so the link reads the same in every mail client and needs no repair to be an href
_URL_CHARACTERS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOST = re.compile(rf"{_LABEL}(?:\.{_LABEL})+")  # a DNS name with at least one dot (urlsplit lower-cases it)
DROPPED = "payment_url_dropped"  # the flag column, and the audit reason


def https_url(value: object) -> str | None:
    """`value` when it is an absolute `https://host/...` link safe to show and link, else None.

    The rules: a string of at most 2048 RFC 3986 characters, well-formed
    percent escapes, scheme `https`, a DNS host name with a dot, no user info,
    a valid port if any.
    """
    if not isinstance(value, str) or not 0 < len(value) <= MAX_URL:
        return None
    if not _URL_CHARACTERS.fullmatch(value) or _BAD_PERCENT.search(value):
        return None
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        return None
    if parts.scheme != "https" or "@" in parts.netloc or not parts.hostname:
        return None
    if value[:8].lower() != "https://" or not _HOST.fullmatch(parts.hostname):
        return None
    return value


def with_payment_urls(frame: pl.DataFrame) -> pl.DataFrame:
    """`payment_url` kept only where `https_url` accepts it, and `payment_url_dropped` where it did not.

    An empty or missing value is no link, not a dropped one. Each distinct
    value is checked once.
    """
    import polars as pl

    if "payment_url" not in frame.columns:
        frame = frame.with_columns(pl.lit(None, dtype=pl.String).alias("payment_url"))
    url = pl.col("payment_url")
    given = url.is_not_null() & (url.str.len_bytes() > 0)
    distinct = frame.filter(given).get_column("payment_url").unique()
    good = pl.Series("good", [u for u in distinct if https_url(u) is not None], dtype=pl.String)
    kept = url.is_in(good.implode())
    return frame.with_columns(
        pl.when(given & kept).then(url).otherwise(None).alias("payment_url"),
        (given & ~kept).fill_null(False).alias(DROPPED),
    )

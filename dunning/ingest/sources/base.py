"""The interface every billing source implements, and the one line any source's API failure becomes.

A source is asked four things (`BillingSource`):

- `pull(cursor, zone)`: its invoices as snapshot rows (`normalize.ROW_FIELDS`, text like a CSV, validated later by
  the same pandera rules as a file), or as one frame (`Pull.frame`: a table source such as SQL). With `cursor` None
  the pull is complete (the mirror is replaced by it: an invoice missing from it is gone); with a cursor, only what
  changed since (merged into the mirror, `deleted` drops ids). `Pull.cursor` is where the next incremental pull
  starts; it is stored with the mirror, in the same file, so it moves only once its pull is stored. A source that
  cannot pull incrementally (`incremental = False`) is always asked for everything.
- `signals(cursor, since)`: billing events newer than its events cursor, as Stripe-shaped event dicts (`id`,
  `type`, `created`, `data.object`) that `dunning.ingest.events` validates like any other: a payment failed
  (`invoice.payment_failed`, one notice each, id `{vendor}:{event id}` so its key is `event:{vendor}:{id}`), a
  payment in flight (`payment_intent.processing` ... ended by `invoice.paid`/`invoice.payment_failed`), paid, a
  dispute (`charge.dispute.created`/`closed`).
- `fetch_back(notifications)`: the webhook notifications the receiver stored (a trigger only: nothing in a body
  is believed), fetched back from the API by their ids: invoice rows to merge and events to store.
- `pay_link(row)`: the vendor's hosted pay page where it needs no request per invoice (None otherwise); the
  template `source.payment_url_template` is applied for every source in `normalize`.

Every failure of a vendor's API becomes `api_failure(...)`: a `BillingSourceFailed` (exit 7), one line naming the
vendor, the request (method and path, never a query: it may quote an id), the status, the vendor's error code when
it looks like one, and what to check; a 429 says when to retry (`Retry-After`, or Recurly's `X-RateLimit-Reset`).
Never the key, never text from the response body.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

import polars as pl

from dunning.errors import BillingSourceFailed

_CODE = re.compile(r"[a-z0-9_.]{1,64}")
WHAT_TO_CHECK = {
    401: "the key in ${key_env} is wrong, expired or revoked",
    403: "the key in ${key_env} lacks a permission this needs (read access to invoices, customers and events)",
    404: "source.api_base (and source.site) name the right account",
    406: "source.api_base points at the vendor's API",
    429: "rate limited",
}


# the snapshot's columns, whatever it came from (a file, a vendor, a query): `ingest.snapshot` reads them
REQUIRED_COLUMNS = (
    "invoice_id",
    "customer_id",
    "customer_email",
    "currency",
    "amount_due",
    "amount_paid",
    "due_date",
    "status",
)
# `auto_advance`: text, "false" (any case) marks an invoice the billing system does not collect by itself
# (Stripe's `auto_advance`); anything else, or no column, counts as true (`dunning.plan.exclusions`)
# `payment_url` and `customer_locale` are checked, not validated (`pay_links`, `locales`): a bad one is dropped
# or falls back to the default, and never rejects the row
# `invoice_lines` (JSON lines for the invoice email) is checked when an email shows it (`invoice_emails.invoice_lines`)
# `customer_cc` (copy addresses, comma-separated) is carried for the desk's reminders; a billing source fills it
# `segment` only chooses a policy (`plan.policies`), never shown; `customer_timezone` (an IANA name) places the send
# window in the customer's time zone (`plan.schedule`): an unknown one falls back to the business zone, counted
# `customer_type` (`business|consumer`, any case) decides which late fees the law allows (`dunning.fees`); anything
# else is `fees.default_customer_type`
OPTIONAL_COLUMNS = (
    "customer_name", "billing_period", "snapshot_at", "auto_advance", "payment_url", "customer_locale", "invoice_lines",
    "segment", "customer_timezone", "customer_type", "customer_cc",
)  # fmt: skip


@dataclass
class Pull:
    """One pull: the rows (`normalize.ROW_FIELDS`, text), ids the source says were deleted, the next cursor, whether
    it was complete, and how many requests it took (the bench counts them). A source that reads a table (a SQL
    query's million rows, as Arrow batches) gives `frame` instead of `rows`: a polars frame with the snapshot's
    columns, of any types (`normalize.conform` makes them text: integers, dates, strings)."""

    rows: list[dict[str, str | None]]
    complete: bool
    cursor: str | None
    deleted: list[str] = field(default_factory=list)
    requests: int = 0
    frame: pl.DataFrame | None = None


@dataclass
class Signals:
    """Billing events newer than the events cursor (Stripe-shaped dicts), and the cursor once they are stored."""

    events: list[dict[str, Any]]
    cursor: str | None
    requests: int = 0


@dataclass(frozen=True)
class Notification:
    """A webhook notification the receiver verified and stored: its vendor, its id and its body (a trigger)."""

    vendor: str
    notification_id: str
    body: Mapping[str, Any]


@dataclass
class FetchedBack:
    """What the notifications are, asked of the API: invoice rows to merge into the mirror, events to store, and the
    notifications that named nothing this source knows (counted)."""

    rows: list[dict[str, str | None]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    ignored: int = 0
    requests: int = 0


class BillingSource(Protocol):
    """What every source implements (module docstring)."""

    name: str  # the vendor, as in keys and file names: `stripe`, `chargebee`, `recurly`
    incremental: bool  # whether `pull` with a cursor asks only for changes

    def pull(self, cursor: str | None, zone: ZoneInfo) -> Pull: ...

    def signals(self, cursor: str | None, since: dt.datetime) -> Signals: ...

    def fetch_back(self, notifications: Sequence[Notification], zone: ZoneInfo) -> FetchedBack: ...


def where(vendor: str, api_base: str) -> str:
    """The API's name, scheme, host and port: never a path or user info, which may hold a token."""
    parts = urlsplit(api_base)
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{vendor} API at {parts.scheme}://{parts.hostname}{port}"


def retry_after(headers: Mapping[str, str] | None, now: dt.datetime | None = None) -> str | None:
    """When a 429 says to try again, from `Retry-After` (seconds or an HTTP date) or `X-RateLimit-Reset` (Unix
    seconds, Recurly's), as words; None when it says nothing usable."""
    if not headers:
        return None
    lower = {k.lower(): v for k, v in headers.items()}
    now = now or dt.datetime.now(dt.UTC)
    value = (lower.get("retry-after") or "").strip()
    if value.isdigit() and len(value) < 9:
        return f"retry after {int(value)} s (Retry-After)"
    if value:
        try:
            at = email.utils.parsedate_to_datetime(value)
            return f"retry after {max(0, int((at - now).total_seconds()))} s (Retry-After)"
        except (TypeError, ValueError, OverflowError):
            pass
    reset = (lower.get("x-ratelimit-reset") or "").strip()
    if reset.isdigit() and len(reset) < 12:
        seconds = max(0, int(reset) - int(now.timestamp()))
        return f"retry after {seconds} s (X-RateLimit-Reset)"
    return None


def api_failure(
    vendor: str,
    api_base: str,
    request: str,
    *,
    status: int | None,
    code: Any = None,
    headers: Mapping[str, str] | None = None,
    key_env: str = "",
    cause: str | None = None,
) -> BillingSourceFailed:
    """The one line (exit 7) a failed request of a source becomes (module docstring). `request` is fixed text such
    as `GET /invoices`; `code` is shown only when it looks like a vendor's error code."""
    at = where(vendor, api_base)
    if status is None:
        return BillingSourceFailed(
            f"{request}: the {at} is unreachable ({cause or 'no response'}); check source.api_base and the network; "
            "nothing was stored"
        )
    shown = f", {code}" if isinstance(code, str) and _CODE.fullmatch(code) else ""
    if 200 <= status < 300:
        return BillingSourceFailed(f"{request}: the {at} answered with a malformed body (HTTP {status}{shown})")
    check = WHAT_TO_CHECK.get(status)
    if status == 429:
        check = f"rate limited; {retry_after(headers) or 'retry in a minute'}, or pull less often (schedule.cron)"
    elif status >= 500:
        check = f"{vendor} failed on its side; the next run tries again"
    elif check is None:
        check = "the request was refused; check the source's settings"
    check = check.replace("${key_env}", f"${key_env}" if key_env else "the key's variable")
    return BillingSourceFailed(f"{request}: the {at} failed (HTTP {status}{shown}): {check}; nothing was stored")

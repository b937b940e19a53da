"""Where invoices and billing events come from: `source:` (the billing system `dunning run` pulls from without
`--snapshot`) and `events:` (who the notices of billing events go to). New sources' keys go here, beside their
docs."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from dunning.config.base import Count, EnvName, Flag, Number, Strict
from dunning.urls import http_url

MAX_QUERY = 100_000  # characters of `source.query`: a query, not a data dump
# each vendor's key variable and API base when the config names none (`chargebee`: `{site}` from `source.site`)
VENDOR_DEFAULTS = {
    "stripe": ("STRIPE_API_KEY", "https://api.stripe.com"),
    "chargebee": ("CHARGEBEE_API_KEY", "https://{site}.chargebee.com/api/v2"),
    "recurly": ("RECURLY_API_KEY", "https://v3.recurly.com"),
}
_SITE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
URL_TEMPLATE_FIELDS = ("invoice_id", "customer_id")


class Source(Strict):
    """Where `dunning run` gets invoices when no `--snapshot` is given: `none` (a snapshot file is required), or a
    billing system's API (`stripe`, `chargebee`, `recurly`) at `api_base`, with the key read from the environment
    variable `api_key_env`; or `sql`, your own PostgreSQL database (the connection string in the variable `dsn_env`,
    the rows of `query` or `query_file`). Vendors' pulls are incremental between full ones (`full_sync_hours`),
    merged into a mirror of the source's invoices under the home (docs: billing sources)."""

    kind: Literal["none", "stripe", "chargebee", "recurly", "sql"] = "none"
    """Where `dunning run` gets invoices without `--snapshot`: `none` (a snapshot file is required), `stripe`,
    `chargebee` or `recurly` (that vendor's API), or `sql` (a query on your own PostgreSQL database)."""
    dsn_env: EnvName = "BILLING_DATABASE_URL"
    """`sql`: the name of the environment variable holding the database's libpq connection string
    (`postgresql://user:password@host:5432/db`); use a role that may only read. Never printed."""
    query: str | None = Field(default=None, min_length=1, max_length=MAX_QUERY)
    """`sql`: one SELECT returning the snapshot columns (`invoice_id`, `customer_id`, `customer_email`, `currency`,
    `amount_due`, `amount_paid`, `due_date`, `status`, and any optional ones), named by aliases (`SELECT id AS
    invoice_id, ...`). Run in a read-only transaction. Exactly one of `query` and `query_file`."""
    query_file: str | None = Field(default=None, min_length=1, max_length=4096)
    """`sql`: a file holding the query instead (relative to the config file's directory); read at every pull."""
    api_key_env: EnvName = "STRIPE_API_KEY"
    """The name of the environment variable holding a (restricted, read-only) API key; default per kind:
    `STRIPE_API_KEY`, `CHARGEBEE_API_KEY`, `RECURLY_API_KEY`."""
    api_base: str = "https://api.stripe.com"
    """The API's base URL (https, or http to this machine only); default per kind: `https://api.stripe.com`,
    `https://{site}.chargebee.com/api/v2`, `https://v3.recurly.com` (`https://v3.eu.recurly.com` for EU sites)."""
    site: str | None = None
    """`chargebee`: the site's name (`acme` for acme.chargebee.com; `acme-test` for its test site); needed unless
    `api_base` is given."""
    full_sync_hours: Count = Field(default=24, ge=1, le=24 * 28)
    """Hours between complete pulls, which replace the mirror (catching deletions and anything an incremental pull
    missed); the pulls between ask only for what changed since the cursor. At most 672 (28 days: Stripe keeps its
    events 30)."""
    payment_url_template: str | None = None
    """A pay link for every invoice without one of its own, e.g. `https://billing.example.com/pay/{invoice_id}`
    (https only; placeholders `{invoice_id}` and `{customer_id}`, URL-encoded)."""
    snapshot_retention_days: Count = Field(default=90, ge=1, le=3660)
    """Days pulled snapshots are kept under HOME/snapshots/, so a run can be replayed from what it saw."""
    max_network_retries: Count = Field(default=3, ge=0, le=10)
    """The Stripe SDK's own retries (exponential backoff) on 429, 409, 5xx and network errors."""
    timeout_seconds: Number = Field(default=30.0, gt=0, le=600)
    """Seconds to wait for one Stripe API request; `sql`: for the connection, and the query's `statement_timeout`
    (longer, and the database cancels it: exit 7)."""
    events_lookback_days: Count = Field(default=3, ge=1, le=30)
    """Payment-failed events older than this (before the cycle's clock) get no notice: stale news on a new deployment's
    first poll or after a pause."""
    exclude_auto_advance_false: Flag = False
    """Leave out Stripe invoices with `auto_advance: false` (often created through the API and collected by hand)."""

    @field_validator("api_base")
    @classmethod
    def _http_only(cls, value: str) -> str:
        return http_url(value, "source.api_base") or value

    @field_validator("site")
    @classmethod
    def _site_name(cls, value: str | None) -> str | None:
        if value is not None and not _SITE.fullmatch(value):
            raise ValueError("source.site must be a Chargebee site name (lower-case letters, digits and dashes)")
        return value

    @field_validator("payment_url_template")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        if value is None:
            return None
        unknown = sorted({name for name in _PLACEHOLDER.findall(value) if name not in URL_TEMPLATE_FIELDS})
        if unknown:
            raise ValueError(
                f"source.payment_url_template: unknown placeholder(s) {unknown}; use {{invoice_id}} or {{customer_id}}"
            )
        filled = _PLACEHOLDER.sub("x", value)
        if "{" in filled or "}" in filled or urlsplit(filled).scheme != "https" or not urlsplit(filled).hostname:
            raise ValueError(
                "source.payment_url_template must be an https:// URL with a host (placeholders {invoice_id}, "
                "{customer_id})"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _vendor_defaults(cls, data: Any) -> Any:
        """The chosen vendor's key variable and API base where the config names none."""
        if not isinstance(data, dict) or data.get("kind") not in VENDOR_DEFAULTS:
            return data
        key_env, base = VENDOR_DEFAULTS[data["kind"]]
        data = dict(data)
        data.setdefault("api_key_env", key_env)
        if "api_base" not in data:
            site = data.get("site")
            if data["kind"] == "chargebee" and site is None:
                raise ValueError("source.site is needed for kind: chargebee (or give source.api_base)")
            if isinstance(site, str) and not _SITE.fullmatch(site):
                return data  # the site's own rule names it
            data["api_base"] = base.format(site=site)
        return data

    @model_validator(mode="after")
    def _one_query(self) -> Source:
        if self.kind == "sql" and (self.query is None) == (self.query_file is None):
            raise ValueError("source.kind sql needs exactly one of source.query and source.query_file")
        if self.kind != "sql" and (self.query is not None or self.query_file is not None):
            raise ValueError("source.query and source.query_file are for source.kind sql only")
        return self


class Events(Strict):
    """Billing events (`invoice.payment_failed`): who their notices go to."""

    trust_event_email: Flag = False
    """A notice for an invoice no snapshot knows goes to the address in the event only when true; otherwise it waits
    (`event_address_not_trusted`). A known invoice's notice always goes to the snapshot's address."""

"""Where invoices and billing events come from: `source:` (the billing system `dunning run` pulls from without
`--snapshot`) and `events:` (who the notices of billing events go to). New sources' keys go here, beside their
docs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from dunning.config.base import Count, EnvName, Flag, Number, Strict
from dunning.urls import http_url

MAX_QUERY = 100_000  # characters of `source.query`: a query, not a data dump


class Source(Strict):
    """Where `dunning run` gets invoices when no `--snapshot` is given: `none` (a snapshot file is required),
    `stripe` (the Stripe API at `api_base`, with the key read from the environment variable `api_key_env`) or `sql`
    (your own PostgreSQL database: the connection string in the variable `dsn_env`, the rows of `query` or
    `query_file`)."""

    kind: Literal["none", "stripe", "sql"] = "none"
    """Where `dunning run` gets invoices without `--snapshot`: `none` (a snapshot file is required), `stripe` (the
    Stripe API) or `sql` (a query on your own PostgreSQL database)."""
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
    """`stripe`: the name of the environment variable holding a (restricted, read-only) API key."""
    api_base: str = "https://api.stripe.com"
    """`stripe`: the API's base URL (https, or http to this machine only)."""
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

"""The deployment's policy, from one optional YAML file.

Every key has a documented default so that an empty (or absent) file is a
working configuration; unknown keys and wrong types are refused with a message
that names the key, because a typo in a dunning policy silently falling back to
a default is how customers get the wrong email.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import babel
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dunning.config_schedule import DEFAULT_POLICY, MAX_HOURS, NAME_PATTERN, Escalation, PolicyMatch, SendWindow
from dunning.errors import ConfigError
from dunning.safe_text import has_control, is_address
from dunning.secret_env import not_a_secret, remember, remember_configured
from dunning.sharding import MAX_SHARDS
from dunning.urls import http_url, store_url_problem, token_parts
from dunning.vocabulary import Tone


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


# Strict scalars: YAML `true` is not the number 1, "5" is not 5, and every number has a bound that keeps the
# arithmetic built on it (dates, backoff timestamps) in range; a value past a bound fails here, not mid-run
Count = Annotated[int, Field(strict=True)]
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Flag = Annotated[bool, Field(strict=True)]
MinorAmount = Annotated[int, Field(strict=True, ge=0, le=10**15)]  # an amount in minor units of its currency
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"  # the name of an environment variable, never a secret itself
# a field naming an environment variable: the pattern (pydantic's message never quotes the input), and a refusal of
# a value shaped like an API key (`secret_env.not_a_secret`), so a secret pasted here is never echoed
EnvName = Annotated[str, Field(pattern=ENV_NAME), AfterValidator(not_a_secret)]
GROUP_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
# headers a message is built from: an idempotency header by one of these names would change who gets it, or how
STRUCTURAL_HEADERS = frozenset(
    h.lower()
    for h in (
        "To", "Cc", "Bcc", "From", "Sender", "Reply-To", "Subject", "Date", "Message-ID", "MIME-Version", "Received",
        "Return-Path", "DKIM-Signature", "X-Dunning-Keys", "X-Dunning-Kind",
    )
)  # fmt: skip
# how long Resend (its API and its SMTP relay's Resend-Idempotency-Key) answers a repeated key with the first result
PROVIDER_KEY_MEMORY_HOURS = 24.0  # the name of an environment variable, never a secret itself


MIN_STAGE_DAYS = -60  # a reminder at most 60 days before the due date


class Stage(_Strict):
    """One reminder stage: reached at `days_overdue`, allowed while enough is still owed."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    """The stage's name: part of each of its emails' idempotency key (`dunning:{invoice}:{cycle}:{name}`); letters,
    digits, `_` and `-`. Renaming a stage makes its emails new ones."""
    days_overdue: Count = Field(ge=MIN_STAGE_DAYS, le=3650)
    """Whole days past the due date, counted in the business `timezone`, at which the stage is reached; negative
    before the due date (`-3`: due in 3 days; at least -60). Stages are listed in increasing order."""
    min_remaining_ratio: Number = Field(default=0.0, ge=0.0, le=1.0)
    """The stage is sent only while at least this share of the invoice is still owed (`remaining / amount_due`); 0
    sends it whatever is left."""
    tone: Tone | None = None
    """`gentle`, `firm` or `final`; unset, the first stage is gentle, the last final, those between firm."""


DEFAULT_STAGES = (
    Stage(name="day3", days_overdue=3, min_remaining_ratio=0.0),
    Stage(name="day7", days_overdue=7, min_remaining_ratio=0.0),
    Stage(name="day14", days_overdue=14, min_remaining_ratio=0.25),
)


class Breaker(_Strict):
    max_emails: Count = Field(default=2, ge=1, le=1000)
    """The circuit breaker: at most this many emails to one customer within `window_hours`. A batch that would exceed
    it halts before sending anything and pages."""
    window_hours: Count = Field(default=24, ge=1, le=24 * 366)
    """The breaker's sliding window, in hours, over everything on record as sent or possibly sent."""


class Provider(_Strict):
    """Where accepted emails go: `file` writes .eml files to DIR/outbox, `smtp` talks to a server."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, use_attribute_docstrings=True)

    kind: Literal["file", "smtp", "resend"] = "file"
    """Where emails go: `file` writes each one as an `.eml` file to the outbox, `smtp` hands it to an SMTP server,
    `resend` posts it to the Resend API."""
    host: str = "127.0.0.1"
    """`smtp`: the server's host name or address."""
    port: Count = Field(default=25, ge=1, le=65535)
    """`smtp`: the server's port (587 with `starttls`, 465 with `tls: implicit`)."""
    timeout_seconds: Number = Field(default=10.0, gt=0, le=600)
    """`smtp` and `resend`: seconds to wait for the provider before the outcome of a send is `unknown` (asked again
    later, never resent blindly)."""
    starttls: Flag = False
    """`smtp`: upgrade the connection with STARTTLS (verified against the system CAs or `ca_file`)."""
    tls: Literal["none", "implicit"] = "none"
    """`smtp`: `implicit` is TLS from the first byte (SMTPS, usually port 465); `none` is plain, or STARTTLS when
    `starttls` is true."""
    ca_file: str | None = None
    """`smtp`: a PEM CA bundle to verify the server against instead of the system store (a private CA)."""
    username_env: EnvName | None = None
    """`smtp`: the name of the environment variable holding the login user (never the value itself)."""
    password_env: EnvName | None = None
    """`smtp`: the name of the environment variable holding the password (never the password itself)."""
    allow_insecure_auth: Flag = False
    """`smtp`: allow a login over an unencrypted connection (refused unless this is true)."""
    from_address: str = Field(default="billing@example.com", alias="from")
    """Key `from`: the sender address of every email and the SMTP envelope sender; its domain names the Message-IDs."""
    from_name: str | None = Field(default=None, min_length=1, max_length=64)
    """The From header's display name (`Acme Billing <billing@example.com>`, RFC 2047-encoded when not ASCII)."""
    reply_to: str | None = None
    """A Reply-To address on every email (where customers' answers go)."""
    connections: Count = Field(default=4, ge=1, le=32)
    """`smtp` and `resend`: parallel connections used to send one batch."""
    max_consecutive_errors: Count = Field(default=5, ge=1, le=10_000)
    """Consecutive transport errors (connect, TLS, login, timeout, 421, dropped connection) after which the send stops
    and the run says why."""
    outbox_dir: str | None = Field(default=None, min_length=1, max_length=4096)
    """`file`: the directory the `.eml` files are written to (default: HOME/outbox)."""
    api_key_env: EnvName = "RESEND_API_KEY"
    """`resend`: the name of the environment variable holding the API key."""
    api_base: str = "https://api.resend.com"
    """`resend`: the API's base URL (https, or http to this machine only)."""
    idempotency_header: str | None = Field(default=None, pattern=r"^[A-Za-z0-9-]{1,64}$")
    """`smtp`: a relay that honours an idempotency header (Resend: `Resend-Idempotency-Key`; EmailEngine:
    `X-EE-Idempotency-Key`). When set, the key travels in it and `unknown` sends are resubmitted under it."""
    idempotency_window_hours: Number = Field(default=23.0, gt=0, le=24 * 30)
    """How long (wall clock, from the first attempt) an `unknown` send may be resubmitted under its key: within what
    the provider remembers (24 h for Resend), with an hour to spare."""

    @field_validator("from_address")
    @classmethod
    def _one_address(cls, value: str) -> str:
        if not is_address(value):  # the rule every recipient follows; the domain names our Message-IDs
            raise ValueError("provider.from must be one plain address such as billing@example.com")
        return value

    @field_validator("from_name")
    @classmethod
    def _plain_name(cls, value: str | None) -> str | None:
        if value is not None and (has_control(value) or not value.strip()):
            raise ValueError("provider.from_name must be a name on one line, without control characters")
        return value

    @field_validator("reply_to")
    @classmethod
    def _one_reply_address(cls, value: str | None) -> str | None:
        if value is not None and not is_address(value):
            raise ValueError("provider.reply_to must be one plain address such as billing@example.com")
        return value

    @field_validator("api_base")
    @classmethod
    def _api_base_http(cls, value: str) -> str:
        return http_url(value, "provider.api_base") or value

    @field_validator("idempotency_header")
    @classmethod
    def _not_a_structural_header(cls, value: str | None) -> str | None:
        if value is not None and (value.lower() in STRUCTURAL_HEADERS or value.lower().startswith("content-")):
            raise ValueError(
                "provider.idempotency_header must not be a header the message is built from (To, Cc, Bcc, From, "
                "Sender, Reply-To, Subject, Date, Message-ID, Content-*, MIME-Version, Received, Return-Path, "
                "DKIM-Signature)"
            )
        return value

    @property
    def resubmits_unknown(self) -> bool:
        """Whether the provider's idempotency contract makes resubmitting an `unknown` send safe."""
        return self.kind == "resend" or (self.kind == "smtp" and self.idempotency_header is not None)

    @property
    def settles_unknown(self) -> bool:
        """Whether a later run may settle an `unknown` outcome (a lookup or a resubmission that can answer); a plain
        SMTP server cannot be asked, so its unknowns wait for a human."""
        return self.kind != "smtp" or self.resubmits_unknown

    @model_validator(mode="after")
    def _transport_is_coherent(self) -> Provider:
        if self.starttls and self.tls == "implicit":
            raise ValueError("provider.starttls and provider.tls: implicit cannot both be set")
        if (
            self.kind == "smtp"
            and (self.username_env or self.password_env)
            and not self.starttls
            and self.tls == "none"
            and not self.allow_insecure_auth
        ):
            raise ValueError(
                "provider.username_env/password_env: credentials would be sent unencrypted; "
                "set provider.starttls: true or provider.tls: implicit, "
                "or provider.allow_insecure_auth: true to accept that"
            )
        return self

    @model_validator(mode="after")
    def _window_within_the_providers_memory(self) -> Provider:
        if self.resubmits_unknown and self.idempotency_window_hours > PROVIDER_KEY_MEMORY_HOURS:
            raise ValueError(
                f"provider.idempotency_window_hours: at most {PROVIDER_KEY_MEMORY_HOURS:g} (Resend, and relays with an "
                f"idempotency header, remember a key {PROVIDER_KEY_MEMORY_HOURS:g} h; a resubmission after that "
                "would be a second email)"
            )
        return self

    @property
    def message_domain(self) -> str:
        """The right-hand side of our Message-IDs: the sender's domain."""
        return self.from_address.rpartition("@")[2] or "dunning.invalid"


class Alerts(_Strict):
    """Where alerts go besides the `alerts` table and the log: a JSON webhook and/or PagerDuty."""

    webhook_url: str | None = None
    """A URL that receives every alert as JSON (a Slack incoming webhook works); https, or http to this machine only."""
    pagerduty_routing_key_env: EnvName | None = None
    """The name of the environment variable holding a PagerDuty Events v2 routing key: alerts then page."""
    pagerduty_url: str = "https://events.pagerduty.com/v2/enqueue"
    """PagerDuty's Events v2 endpoint."""
    timeout_seconds: Number = Field(default=5.0, gt=0, le=60)
    """Seconds to wait for the webhook or PagerDuty."""
    stale_after_hours: Number = Field(default=3.0, gt=0, le=24 * 366)
    """The dead man's switch: page when no live run has completed for this long (a deployment that never ran one is not
    paged)."""
    unknown_after_hours: Number = Field(default=24.0, gt=0, le=24 * 366)
    """Page when an `unknown` outcome has waited this long for a human (`dunning resolve`)."""

    @field_validator("webhook_url", "pagerduty_url")
    @classmethod
    def _http_only(cls, value: str | None, info: ValidationInfo) -> str | None:
        return http_url(value, f"alerts.{info.field_name}")


class Retry(_Strict):
    """Backoff for `failed` sends: a later cycle may retry them, never an `unknown`."""

    max_attempts: Count = Field(default=5, ge=1, le=100)
    """Attempts for a `failed` send (the provider refused it) before it stays failed."""
    backoff_minutes: Number = Field(default=30.0, ge=0, le=60 * 24 * 366)
    """Minutes a `failed` send waits before a later cycle retries it (doubling with each attempt)."""


class LedgerSettings(_Strict):
    """Where the ledger lives: `duckdb` (HOME/dunning.duckdb, one machine) or `postgres` (shared by several homes
    and workers). The PostgreSQL DSN is read only from the environment variable named by `dsn_env`, never from
    this file: it may hold a password."""

    kind: Literal["duckdb", "postgres"] = "duckdb"
    """`duckdb`: HOME/dunning.duckdb, one machine. `postgres`: a PostgreSQL database shared by several homes and shard
    workers."""
    dsn_env: EnvName = "DUNNING_POSTGRES_DSN"
    """`postgres`: the name of the environment variable holding the libpq URL (it may hold a password, so never this
    file)."""


class InvoiceEmails(_Strict):
    """The invoice email itself, once per invoice and billing period (`dunning.plan.invoice_emails`). Off by default:
    many billing systems send the invoice themselves."""

    enabled: Flag = False
    """Send the invoice email itself, once per invoice and billing period (many billing systems send it themselves)."""


class Source(_Strict):
    """Where `dunning run` gets invoices when no `--snapshot` is given: `none` (a snapshot file is required) or
    `stripe` (the Stripe API at `api_base`, with the key read from the environment variable `api_key_env`)."""

    kind: Literal["none", "stripe"] = "none"
    """Where `dunning run` gets invoices without `--snapshot`: `none` (a snapshot file is required) or `stripe` (the
    Stripe API)."""
    api_key_env: EnvName = "STRIPE_API_KEY"
    """`stripe`: the name of the environment variable holding a (restricted, read-only) API key."""
    api_base: str = "https://api.stripe.com"
    """`stripe`: the API's base URL (https, or http to this machine only)."""
    snapshot_retention_days: Count = Field(default=90, ge=1, le=3660)
    """Days pulled snapshots are kept under HOME/snapshots/, so a run can be replayed from what it saw."""
    max_network_retries: Count = Field(default=3, ge=0, le=10)
    """The Stripe SDK's own retries (exponential backoff) on 429, 409, 5xx and network errors."""
    timeout_seconds: Number = Field(default=30.0, gt=0, le=600)
    """Seconds to wait for one Stripe API request."""
    events_lookback_days: Count = Field(default=3, ge=1, le=30)
    """Payment-failed events older than this (before the cycle's clock) get no notice: stale news on a new deployment's
    first poll or after a pause."""
    exclude_auto_advance_false: Flag = False
    """Leave out Stripe invoices with `auto_advance: false` (often created through the API and collected by hand)."""

    @field_validator("api_base")
    @classmethod
    def _http_only(cls, value: str) -> str:
        return http_url(value, "source.api_base") or value


class Schedule(_Strict):
    """When the hourly schedule starts a cycle."""

    cron: str = Field(
        default="0 * * * *",
        description="A five-field cron expression in the business `timezone`: the ticks at which the schedule "
        "starts a cycle (`0 * * * *`: every hour on the hour; `0 8-18 * * 1-5`: business hours on weekdays).",
    )

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        from croniter import croniter  # here, not at import: only the schedule needs it

        if len(value.split()) != 5 or not croniter.is_valid(value):
            raise ValueError("schedule.cron must be a cron expression of five fields, e.g. '0 * * * *'")
        return value


class Events(_Strict):
    """Billing events (`invoice.payment_failed`): who their notices go to."""

    trust_event_email: Flag = False
    """A notice for an invoice no snapshot knows goes to the address in the event only when true; otherwise it waits
    (`event_address_not_trusted`). A known invoice's notice always goes to the snapshot's address."""


class Store(_Strict):
    """Where `dunning ingest` leaves the validated snapshot split by shard, for the shard runs to read."""

    url: str | None = Field(default=None, min_length=1, max_length=4096)
    """A directory, or `s3://bucket/prefix` (credentials and endpoint from the AWS environment variables, never this
    file: a URL with credentials in it is refused); none: `HOME/store`."""

    @field_validator("url")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        problem = store_url_problem(value) if value is not None else None
        if problem is not None:
            raise ValueError(f"{problem} (the value is not shown: it may hold a credential)")
        return value


class Retention(_Strict):
    """What the hourly job and `dunning prune` let go, judged on the wall clock (never on `--as-of`). Decisions are
    kept a year and more: the ledger (keys, outcomes, the audit, alerts, suppressions) is never pruned; the machinery
    around it (Dagster's runs, ingests, journals, inbox leftovers) only weeks."""

    runs_days: Count = Field(default=30, ge=1, le=3660)
    """Dagster runs (with their event logs and compute logs) and schedule and sensor ticks older than this many days
    are deleted, except failures (`failed_runs_days`)."""
    failed_runs_days: Count = Field(default=90, ge=1, le=3660)
    """Failed and canceled Dagster runs, and failed ticks, are kept this many days."""
    ingests_keep: Count = Field(default=48, ge=1, le=100_000)
    """The newest ingests kept in the snapshot store (`dunning ingest`); older ones are deleted, never the one a
    shard of the current hour may read."""
    inbox_days: Count = Field(default=30, ge=1, le=3660)
    """Files the webhook inbox set aside as unreadable (`HOME/inbox/webhooks/unreadable/`), and temporary files a
    receiver left, older than this many days are deleted."""
    delivery_events_days: Count = Field(default=365, ge=1, le=36_600)
    """`delivery_events` rows (bounce and complaint reports) recorded more than this many days ago are deleted, but
    never one that was allowed to suppress (so importing it again stays a repeat); suppressions are never deleted."""


class Feedback(_Strict):
    """Delivery feedback (`dunning feedback`, `dunning serve-webhooks`): what a bounce or complaint may suppress."""

    trust_unmatched: Flag = False
    """A mailbox report (DSN or ARF) that names no Message-ID of ours, or names one sent to another address, is
    recorded but suppresses nothing unless true: anyone can mail the bounce address. Resend's own events and signed
    webhooks suppress their recipient either way."""
    webhook_max_bytes: Count = Field(default=1_048_576, ge=1024, le=16 * 1_048_576)
    """`dunning serve-webhooks`: a request body larger than this is refused (413)."""
    webhook_timeout_seconds: Number = Field(default=10.0, gt=0, le=300)
    """`dunning serve-webhooks`: a request whose line, headers and body have not all arrived this many seconds after
    its connection opened (or after the answer before it) is disconnected, so a slow client holds no socket long."""
    webhook_max_connections: Count = Field(default=100, ge=1, le=10_000)
    """`dunning serve-webhooks`: connections served at once; a request past them is answered 503 (senders retry)."""
    trust_legacy_message_ids: Flag = False
    """A mailbox report quoting a Message-ID minted before Message-IDs were signed (32 hex digits: anyone can compute
    one from an invoice number, a stage and the sender's domain) is recorded as unmatched, and listed in `dunning
    status` for a human to confirm, unless true: then it suppresses like a signed one when its recipient was that
    email's."""


def check_stages(stages: tuple[Stage, ...], key: str) -> None:
    """At least one stage, names unique, days strictly increasing; ValueError naming `key`."""
    if not stages:
        raise ValueError(f"{key}: at least one stage is required")
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise ValueError(f"{key}: duplicate stage names {names}")
    days = [s.days_overdue for s in stages]
    if days != sorted(days) or len(set(days)) != len(days):
        raise ValueError(f"{key}: days_overdue must be strictly increasing, got {days}")


FirstContactTone = Literal["gentle", "stage"]


class Policy(_Strict):
    """A collections policy for a segment: the first policy whose `match` holds governs an invoice. A key it does not
    set is the top level's."""

    name: str = Field(min_length=1, max_length=64, pattern=NAME_PATTERN)
    """The policy's name, in `reminder_ledger.policy`, the audit, the analysts' views and templates (`policy`);
    letters, digits, `_` and `-`; not `default` (the top-level settings' name)."""
    match: PolicyMatch = PolicyMatch()
    """Which invoices it governs: `segment`, `currency`, `min_amount_minor`, `max_amount_minor`, all optional and
    ANDed."""
    stages: tuple[Stage, ...] | None = None
    """Its own stages (default: the top-level `stages`). A stage name shared with another policy must be at the same
    `days_overdue` there: the name is part of the key."""
    send_window: SendWindow | None = None
    """Its own send window (`null`: any time; unset: the top level's)."""
    min_hours_between_reminders: Number | None = Field(default=None, ge=0, le=MAX_HOURS)
    """Its own spacing between reminders to a customer (unset: the top level's)."""
    first_contact_tone: FirstContactTone | None = None
    """Its own first-contact tone (unset: the top level's)."""
    escalation: Escalation | None = None
    """Its own escalation (`null`: none; unset: the top level's)."""
    templates_dir: str | None = Field(default=None, min_length=1, max_length=4096)
    """Its own templates, overriding the packaged ones by name (unset: the top level's `templates_dir`); relative
    to the config file."""


class ResolvedPolicy(BaseModel):
    """A policy with every key decided: its own where it set one, the top level's otherwise."""

    model_config = ConfigDict(frozen=True)

    name: str
    match: PolicyMatch
    stages: tuple[Stage, ...]
    send_window: SendWindow | None
    min_hours_between_reminders: float
    first_contact_tone: FirstContactTone
    escalation: Escalation | None
    templates_dir: str | None


class DunningConfig(_Strict):
    stages: tuple[Stage, ...] = DEFAULT_STAGES
    """The reminder stages, in increasing `days_overdue` (default: day3, day7, day14 with a 25 % balance rule). The
    first stage's emails are gentle, the last's final, those between firm."""
    group_by: Literal["customer", "invoice"] = "customer"
    """`customer`: one email per customer per run, listing each invoice due; `invoice`: one email per invoice."""
    timezone: str = "UTC"
    """The business timezone (IANA name, e.g. Europe/Berlin): it decides which day it is, days overdue and the
    schedule's cron."""
    on_invalid_rows: Literal["proceed", "halt"] = "proceed"
    """A snapshot row that fails validation is quarantined; `proceed` dunns the valid rows, `halt` stops the run (exit
    2) before anything is sent."""
    breaker: Breaker = Breaker()
    """The circuit breaker against floods."""
    provider: Provider = Provider()
    """How emails are sent."""
    alerts: Alerts = Alerts()
    """Where alerts go besides the `alerts` table and the log."""
    retry: Retry = Retry()
    """Backoff for `failed` sends: a later cycle may retry them; an `unknown` is never retried blindly."""
    ledger: LedgerSettings = LedgerSettings()
    """Where the ledger lives."""
    source: Source = Source()
    """Where invoices come from when `--snapshot` is not given."""
    invoice_emails: InvoiceEmails = InvoiceEmails()
    """The invoice email (off by default)."""
    events: Events = Events()
    """Billing events (`invoice.payment_failed`) and who their notices go to."""
    schedule: Schedule = Schedule()
    """When the Dagster schedule starts a cycle."""
    feedback: Feedback = Feedback()
    """Bounces and complaints: what may suppress an address."""
    store: Store = Store()
    """The snapshot store of `dunning ingest` and the shard runs."""
    retention: Retention = Retention()
    """What the hourly job and `dunning prune` delete, and after how long (the ledger never)."""
    first_contact_tone: FirstContactTone = "gentle"
    """`gentle`: the first reminder of a cycle speaks gently whatever stage it records (an invoice first seen at day
    20 is not greeted with a final notice); `stage`: it takes its stage's tone."""
    min_hours_between_reminders: Number = Field(default=0.0, ge=0, le=MAX_HOURS)
    """Spacing: a customer sent a reminder less than this many hours before the run's clock gets none now; the keys
    wait (audit reason `spacing`). 0: off."""
    send_window: SendWindow | None = None
    """When emails may go (none: any time); outside it due keys wait (audit reason `outside_send_window`)."""
    escalation: Escalation | None = None
    """A signed webhook to a collections system once per invoice and cycle, `after_days` past due (none: no
    escalation)."""
    policies: tuple[Policy, ...] = ()
    """Collections policies by segment, currency and amount, first match wins; an invoice no policy matches follows
    the top-level settings (policy `default`)."""
    company_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=120,
        description="Your company's name, under the signature of every default template (text and HTML alike); "
        "none by default.",
    )
    signature: str = Field(
        default="Billing team",
        min_length=1,
        max_length=120,
        description="Who signs every default template, text and HTML alike. The default is shown in each "
        "packaged language (German: Ihre Buchhaltung); your own is used as it is.",
    )
    locale: str = "en_US"
    """The default language and number format of emails (`en_US`, `de_DE`, …); a row's own `customer_locale` wins."""
    analytics_group: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
    )
    """A Unix group whose members may read the analysts' copy (analytics.duckdb and its Parquet files); unset, it is
    the home owner's alone."""
    templates_dir: str | None = Field(default=None, min_length=1, max_length=4096)
    """A directory of your own email templates, overriding packaged ones by file name; relative to the config file;
    checked when the config loads."""
    claim_chunk_size: Literal["auto"] | int = "auto"
    """Emails claimed per ledger transaction, from 1 to 100,000, or `auto`: 10,000 where the provider can settle an
    `unknown` outcome (the file outbox, Resend, SMTP with an `idempotency_header`), 2,000 for plain SMTP, whose
    unknowns a human resolves."""
    claim_lease_minutes: Number = Field(default=30.0, gt=0, le=24 * 60)
    """How long (wall clock) a claim stays this run's without renewal; renewed while its chunk is being sent."""
    render_processes: Literal["auto"] | int = "auto"
    """Processes that render emails: `auto` is the usable cores divided by the cycle runs in progress on this home; 1
    renders in the run's own process."""
    shards: Count = Field(default=1, ge=1, le=MAX_SHARDS)
    """How many shards split a day's cycle by customer: the schedule starts one run per shard."""
    max_shrink: Number = Field(default=0.5, ge=0, le=1)
    """A whole snapshot with fewer than this many times the invoices of the last applied one is refused (exit 2; a
    pull from the billing source: exit 7 and an alert) unless `dunning run --allow-shrink`: a truncated export. 0:
    off. A snapshot with no invoice rows is refused whatever this says."""
    message_secret_env: EnvName | None = None
    """The name of an environment variable holding the secret our Message-IDs are signed with (at least 16
    characters, e.g. `openssl rand -hex 32`); unset, the ledger keeps one, made by the first live send, which every
    worker of that ledger shares. Set it (to the same value everywhere) to keep the secret outside the ledger."""
    min_remaining_minor: dict[str, MinorAmount] = Field(default_factory=dict)
    """Per currency (ISO 4217, e.g. `{EUR: 500}`): an invoice whose remaining balance in minor units is below this is
    not dunned (`below_minimum`)."""

    @field_validator("claim_chunk_size", mode="before")
    @classmethod
    def _chunk(cls, value: object) -> object:
        if value == "auto" or (type(value) is int and 1 <= value <= 100_000):
            return value
        raise ValueError("must be auto or a whole number of emails from 1 to 100000")

    def claim_chunk(self) -> int:
        """Emails claimed per ledger transaction, `auto` resolved: 10,000 where the provider settles an `unknown`
        outcome (a crash leaves at most the chunks in flight claimed, which then become `unknown` and are asked
        about), 2,000 for plain SMTP, whose unknowns a human resolves one by one. Each chunk costs a window count
        over the ledger and a commit: at the 1M tier, claiming and recording 93,095 keys took 7.1 s in chunks of
        2,000 and 2.6 s in chunks of 10,000."""
        if self.claim_chunk_size != "auto":
            return self.claim_chunk_size
        return 10_000 if self.provider.settles_unknown else 2_000

    @field_validator("render_processes", mode="before")
    @classmethod
    def _processes(cls, value: object) -> object:
        if value == "auto" or (type(value) is int and 1 <= value <= 256):
            return value
        raise ValueError("must be auto or a whole number of processes from 1 to 256")

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown timezone {value!r}") from exc
        return value

    @field_validator("min_remaining_minor")
    @classmethod
    def _known_currencies(cls, value: dict[str, int]) -> dict[str, int]:
        from dunning.currencies import CURRENCIES  # here, not at import: it asks Babel's data

        unknown = [code for code in value if code not in CURRENCIES]
        if unknown:
            raise ValueError(
                f"{', '.join(repr(c) for c in unknown[:5])} is not an upper-case ISO 4217 currency code (e.g. EUR)"
            )
        return value

    @field_validator("company_name", "signature")
    @classmethod
    def _one_line(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and (has_control(value) or not value.strip()):
            raise ValueError(f"{info.field_name} must be one line of text, without control characters")
        return value

    @field_validator("locale")
    @classmethod
    def _known_locale(cls, value: str) -> str:
        try:
            babel.Locale.parse(value)
        except (ValueError, babel.UnknownLocaleError) as exc:
            raise ValueError(f"unknown locale {value!r}") from exc
        return value

    @model_validator(mode="after")
    def _stages_well_formed(self) -> DunningConfig:
        check_stages(self.stages, "stages")
        names = [p.name for p in self.policies]
        if DEFAULT_POLICY in names:
            raise ValueError(f"policies: {DEFAULT_POLICY!r} names the top-level settings; give the policy another name")
        if len(set(names)) != len(names):
            raise ValueError(f"policies: duplicate policy names {names}")
        days_of: dict[str, tuple[int, str]] = {s.name: (s.days_overdue, "stages") for s in self.stages}
        for index, policy in enumerate(self.policies):
            key = f"policies[{index}] ({policy.name}).stages"
            if policy.stages is None:
                continue
            check_stages(policy.stages, key)
            for stage in policy.stages:
                days, where = days_of.setdefault(stage.name, (stage.days_overdue, key))
                if days != stage.days_overdue:
                    raise ValueError(
                        f"{key}: stage {stage.name!r} is at {stage.days_overdue} days here and at {days} in {where}: "
                        "a stage's name is part of its emails' keys, so one name is one day in every policy"
                    )
        return self

    def resolved_policies(self) -> tuple[ResolvedPolicy, ...]:
        """Every policy in matching order, each key decided, then the top level as policy `default` (matches all)."""
        top = ResolvedPolicy(
            name=DEFAULT_POLICY, match=PolicyMatch(), stages=self.stages, send_window=self.send_window,
            min_hours_between_reminders=self.min_hours_between_reminders, first_contact_tone=self.first_contact_tone,
            escalation=self.escalation, templates_dir=self.templates_dir,
        )  # fmt: skip
        resolved = []
        for policy in self.policies:
            given = policy.model_fields_set
            inherited = {k: getattr(top, k) for k in ResolvedPolicy.model_fields if k not in given and k != "name"}
            own = {k: getattr(policy, k) for k in given if k in ResolvedPolicy.model_fields}
            resolved.append(ResolvedPolicy.model_validate({**inherited, **own, "name": policy.name}))
        return (*resolved, top)

    @property
    def every_stage(self) -> tuple[Stage, ...]:
        """Each stage of every policy once, by name (a name is one day in every policy)."""
        seen: dict[str, Stage] = {}
        for policy in self.resolved_policies():
            for stage in policy.stages:
                seen.setdefault(stage.name, stage)
        return tuple(seen.values())

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def secret_names(self) -> list[str]:
        """Every environment variable this config reads a secret from."""
        names = [
            self.provider.password_env, self.provider.api_key_env,
            self.alerts.pagerduty_routing_key_env, self.ledger.dsn_env, self.source.api_key_env,
            self.message_secret_env,
        ]  # fmt: skip
        names += [p.escalation.secret_env for p in self.resolved_policies() if p.escalation is not None]
        return [n for n in names if n]

    def token_urls(self) -> list[str]:
        """The URLs this config names whose path or query may hold a token: alert and escalation webhooks."""
        urls = [self.alerts.webhook_url] + [p.escalation.webhook_url for p in self.resolved_policies() if p.escalation]
        return [u for u in urls if u]

    @property
    def policy_id(self) -> str:
        """A short stable id of everything that decides what is sent, to label simulations."""
        import hashlib

        decisive = self.model_dump(include={"stages", "group_by", "timezone", "breaker", "retry"}, mode="json")
        # added only when set, so a policy that does not use them keeps the id it had before they existed
        if self.min_remaining_minor:
            decisive["min_remaining_minor"] = dict(sorted(self.min_remaining_minor.items()))
        if self.source.exclude_auto_advance_false:
            decisive["exclude_auto_advance_false"] = True
        if self.invoice_emails.enabled:
            decisive["invoice_emails"] = True
        schedule = self.model_dump(
            include={"first_contact_tone", "min_hours_between_reminders", "send_window", "escalation", "policies"},
            mode="json", exclude_defaults=True,
        )  # fmt: skip
        if schedule:  # the collections schedule, when used (a deployment without it keeps its id)
            decisive["schedule"] = repr(sorted(schedule.items()))
        return hashlib.sha256(repr(sorted(decisive.items())).encode()).hexdigest()[:12]


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"]) or "(top level)"
        if item["type"] == "extra_forbidden":
            parts.append(f"unknown key '{key}'")
        else:
            parts.append(f"'{key}': {item['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def parse_config(data: object, source: str = "config", base_dir: Path | None = None) -> DunningConfig:
    """The config in `data`; a relative `templates_dir` is taken from `base_dir` (the config file's directory,
    else the working directory). Its templates are checked by `dunning.run.settings`, which every command and run
    loads the config through: the template engine is a room above this base."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys at the top level")
    try:
        config = DunningConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from None
    remember_configured(config.secret_names())  # masked in every text from here on, before any is read
    remember(p for url in config.token_urls() for p in token_parts(url))  # a webhook URL: its path and query too

    def resolved(directory: str) -> str:
        return str(((base_dir or Path.cwd()) / Path(directory).expanduser()).resolve())

    if config.templates_dir is not None:  # checked by `run.settings`, which may load the template engine
        config = config.model_copy(update={"templates_dir": resolved(config.templates_dir)})
    if config.store.url is not None and "://" not in config.store.url:  # a directory: relative to this file
        config = config.model_copy(
            update={"store": config.store.model_copy(update={"url": resolved(config.store.url)})}
        )
    if any(p.templates_dir is not None for p in config.policies):
        policies = tuple(
            p if p.templates_dir is None else p.model_copy(update={"templates_dir": resolved(p.templates_dir)})
            for p in config.policies
        )
        config = config.model_copy(update={"policies": policies})
    return config


def load_config(path: str | Path | None) -> DunningConfig:
    """The configuration in `path`, or the embedded defaults when `path` is None."""
    if path is None:
        return DunningConfig()
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {_where_yaml_broke(exc)}") from None
    return parse_config(data, source=str(path), base_dir=path.parent)


def _where_yaml_broke(error: Exception) -> str:
    """What broke and where (line, column), never the text of the line: it may hold a secret."""
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text (byte {error.start})"
    mark = getattr(error, "problem_mark", None)
    problem = str(getattr(error, "problem", None) or "a syntax error")
    # PyYAML quotes the character it found in `problem` ("found character '\t' ..."); that one character stays
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem[:120]}{where}"


def load_ledger_settings(path: str | Path | None) -> LedgerSettings:
    """Only the `ledger:` section of the config at `path` (the default ledger without a file or section): what
    `pause`, `resolve` and `status` need to find the ledger even when another section of the file is broken."""
    if path is None:
        return LedgerSettings()
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {_where_yaml_broke(exc)}") from None
    section = data.get("ledger") if isinstance(data, dict) else None
    try:
        return _LedgerOnly.model_validate({} if section is None else {"ledger": section}).ledger
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_describe(exc)}") from None


class _LedgerOnly(_Strict):
    ledger: LedgerSettings = LedgerSettings()
    """Where the ledger lives."""

"""The configuration file's top level (`DunningConfig`): the keys that belong to no section, and every section
assembled from its own module, with what only the whole can check (stage names across policies) or compute (each
policy resolved, the secrets it names, the policy id)."""

from __future__ import annotations

import datetime as dt
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import babel
from pydantic import Field, ValidationInfo, field_validator, model_validator

from dunning.config.alerts import Alerts
from dunning.config.base import MAX_HOURS, Count, EnvName, MinorAmount, Number, Strict
from dunning.config.desk import Promises, Replies
from dunning.config.feedback import Feedback
from dunning.config.fees import Fees, RateEntry, TableReference
from dunning.config.policies import FirstContactTone, Policy, ResolvedPolicy
from dunning.config.providers import Provider
from dunning.config.schedule import DEFAULT_POLICY, Escalation, PolicyMatch, Schedule, SendWindow
from dunning.config.sending import Breaker, InvoiceEmails, Retry
from dunning.config.sources import Events, Source
from dunning.config.stages import DEFAULT_STAGES, Stage, check_stages
from dunning.config.storage import LedgerSettings, Retention, Store
from dunning.safe_text import has_control
from dunning.sharding import MAX_SHARDS


class DunningConfig(Strict):
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
    promises: Promises = Promises()
    """Promises to pay (`dunning promise`): the grace after a promise's date."""
    replies: Replies = Replies()
    """Customers' replies (`dunning feedback`): how long an unanswered reply pauses the chasing."""
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
    fees: Fees | None = None
    """Late fees and statutory interest (none by default): a preset (`eu_b2b`, `de`, `uk`) or your own amounts, claimed
    once per invoice and cycle with one stage's reminder (`dunning.fees`)."""
    rates: tuple[RateEntry, ...] = ()
    """Reference rates that extend or override the shipped table (`{reference, from, percent}`)."""
    rates_valid_through: dict[TableReference, dt.date] = Field(default_factory=dict)
    """Per reference, the last day its rates are known (moves the shipped table's `valid_through`); past it interest
    waits (`rate_unknown`)."""
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
        for resolved in self.resolved_policies():
            fees = resolved.fees
            claims_at = fees.claim_at_stage if fees is not None else None
            if claims_at is not None and claims_at not in {s.name for s in resolved.stages}:
                raise ValueError(
                    f"fees.claim_at_stage: {claims_at!r} is not a stage of policy {resolved.name!r} "
                    f"(its stages: {', '.join(s.name for s in resolved.stages)})"
                )
        return self

    def resolved_policies(self) -> tuple[ResolvedPolicy, ...]:
        """Every policy in matching order, each key decided, then the top level as policy `default` (matches all)."""
        top = ResolvedPolicy(
            name=DEFAULT_POLICY, match=PolicyMatch(), stages=self.stages, send_window=self.send_window,
            min_hours_between_reminders=self.min_hours_between_reminders, first_contact_tone=self.first_contact_tone,
            escalation=self.escalation, templates_dir=self.templates_dir, fees=self.fees,
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
        if self.source.kind == "sql":
            names.append(self.source.dsn_env)
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
        if self.fees is not None or self.rates or self.rates_valid_through:  # only when used: others keep their id
            decisive["fees"] = repr(self.model_dump(include={"fees", "rates", "rates_valid_through"}, mode="json"))
        schedule = self.model_dump(
            include={"first_contact_tone", "min_hours_between_reminders", "send_window", "escalation", "policies"},
            mode="json", exclude_defaults=True,
        )  # fmt: skip
        if schedule:  # the collections schedule, when used (a deployment without it keeps its id)
            decisive["schedule"] = repr(sorted(schedule.items()))
        return hashlib.sha256(repr(sorted(decisive.items())).encode()).hexdigest()[:12]

"""The pipeline's words: every status, kind, role, tone and reason, each as one closed set of names.

These values used to be bare strings spelled again wherever they were produced
or compared, so a typo (`"unknwon"`) was a silent miss rather than an error,
and nothing said which strings belonged together. Here each set is a
`StrEnum`: a reader sees every allowed value in one place, mypy checks each
use, and a member *is* its string (`SendStatus.SENT == "sent"`), so SQL
parameters, DuckDB, polars literals and JSON take members unchanged.

The spellings are a public surface: they are stored in the ledger, the audit
and the run summary, queried by analysts, and found in ledgers written by
older releases. Never respell a value; add one only together with whatever
stores it (`reminder_ledger` has CHECK constraints on `LedgerStatus` and
`EmailKind`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar

if TYPE_CHECKING:
    import polars as pl

K = TypeVar("K", bound=str)
V = TypeVar("V")


def plain(members: Iterable[str]) -> list[str]:
    """Members as plain `str`, for a list handed to polars (`is_in`, a Series, a frame's column).

    A single member is fine anywhere (`pl.lit(m)`, `pl.col(c) == m`), but from a
    list of members polars infers an `Enum` dtype whose categories are the whole
    class, and then fails on any other value it meets in the same list or column.
    """
    return [str(m) for m in members]


def plain_keys(mapping: Mapping[K, V]) -> dict[str, V]:
    """`mapping` with plain `str` keys, for `Expr.replace_strict` (see `plain`)."""
    return {str(k): v for k, v in mapping.items()}


class LedgerStatus(StrEnum):
    """`reminder_ledger.status`: where one key stands."""

    CLAIMED = "claimed"  # this run may send it; a crash leaves it for the next run to turn `unknown`
    SENT = "sent"
    FAILED = "failed"  # definitely not accepted: retried after the backoff
    UNKNOWN = "unknown"  # may have been accepted: never resent blindly
    SKIPPED = "skipped"  # a stage passed over because a later one was due; never sent


class EmailKind(StrEnum):
    """`kind` of a key and of the email that carries it (also the `X-Dunning-Kind` header)."""

    REMINDER = "reminder"
    APOLOGY = "apology"
    PAYMENT_FAILED = "payment_failed"
    INVOICE = "invoice"  # the invoice email itself, once per invoice and billing period (`invoice_emails`)
    # not an email: the hand-over of an invoice to a collections system, a signed webhook (`dunning.send.escalation`)
    ESCALATION = "escalation"


# kinds that are emails to a customer: what the breaker and the per-customer cap count
EMAIL_KINDS = (EmailKind.REMINDER, EmailKind.APOLOGY, EmailKind.PAYMENT_FAILED, EmailKind.INVOICE)


class PlanRole(StrEnum):
    """`role` of a row of the cycle's plan."""

    DUE = "due"  # send now
    RETRY = "retry"  # a failed send whose backoff is over
    SKIPPED = "skipped"  # record as skipped, never send
    # an `unknown` outcome of an earlier run, to settle by lookup or by resubmitting its kept request
    # (`dunning.send.resubmission`); `hold` says why the present forbids resubmitting it
    SETTLE = "settle"


# the plan's `role` column: a value outside the set fails where it is made, not as a silent miss in a filter
PLAN_ROLE_DTYPE: pl.Enum


def __getattr__(name: str) -> Any:
    """`PLAN_ROLE_DTYPE`, made when first asked for: this module is imported by code that makes no frame (a render
    worker, `dunning.send.render_pool`), which then imports no polars (0.09 s of each worker's start)."""
    if name == "PLAN_ROLE_DTYPE":
        import polars as pl

        dtype = pl.Enum(plain(PlanRole))
        globals()[name] = dtype
        return dtype
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Tone(StrEnum):
    """How firmly a reminder speaks: the stage's `tone`, else its place among the policy's stages."""

    GENTLE = "gentle"
    FIRM = "firm"
    FINAL = "final"


class SendStatus(StrEnum):
    """The outcome of one due key in this run (`send_batch`'s `status` column)."""

    # from the provider (see `dunning.send.providers.base`); recorded in the ledger
    SENT = "sent"
    FAILED = "failed"
    UNKNOWN = "unknown"
    RELEASED = "released"  # claimed, never handed over (provider stopped): `failed` in the ledger, no attempt
    # not claimed, or claimed by someone else
    THROTTLED = "throttled"  # the customer was at the email cap when claimed
    SUPPRESSED = "suppressed"  # the address was suppressed when claimed (a bounce, a complaint, an operator)
    LOST = "lost"  # another run holds the key
    # not attempted: the whole batch was held
    PAUSED = "paused"
    BREAKER = "breaker"
    DRY_RUN = "dry_run"
    SIMULATED = "simulated"  # a backfill: written to `simulated_sends`


# What a provider can answer for one message, and what `record_outcomes` writes to the ledger
ProviderStatus: TypeAlias = Literal[SendStatus.SENT, SendStatus.FAILED, SendStatus.UNKNOWN, SendStatus.RELEASED]
PROVIDER_STATUSES: tuple[ProviderStatus, ...] = (
    SendStatus.SENT,
    SendStatus.FAILED,
    SendStatus.UNKNOWN,
    SendStatus.RELEASED,
)
# What a provider's lookup of an earlier message can answer definitely
LookupStatus: TypeAlias = Literal[SendStatus.SENT, SendStatus.FAILED]


class AuditOutcome(StrEnum):
    """`dunning_audit.outcome`: what became of a key this cycle considered."""

    SENT = "sent"
    FAILED = "failed"
    UNKNOWN = "unknown"
    HELD = "held"  # not sent, for a `HoldReason`
    DRY_RUN = "dry_run"
    SIMULATED = "simulated"


class RunOutcome(StrEnum):
    """`dunning_runs.outcome`: how a run that wrote its audit ended."""

    COMPLETED = "completed"
    HALTED_BY_BREAKER = "halted_by_breaker"
    UNCHANGED = "unchanged"  # skipped: nothing it would read had changed since the last run (`dunning.plan.unchanged`)


class HoldReason(StrEnum):
    """`dunning_audit.reason`: why a key was not sent (null when it was, or on a dry run or backfill)."""

    NO_EMAIL_ADDRESS = "no_email_address"  # `customer_email` is empty
    # `customer_email` holds something that is not one address (two addresses, a typo): the data needs a fix; copies
    # go in `customer_cc`
    INVALID_ADDRESS = "invalid_address"
    PAUSED = "paused"
    BREAKER = "breaker"
    THROTTLED = "throttled"
    PROVIDER_FAILURE = "provider_failure"
    PROVIDER_STOPPED = "provider_stopped"
    UNKNOWN_OUTCOME = "unknown_outcome"
    CLAIMED_BY_ANOTHER_RUN = "claimed_by_another_run"
    NOT_ATTEMPTED = "not_attempted"
    # decided by the plan, before any send (`dunning.plan.exclusions`): never claimed, so nothing is on record for them
    EXCLUDED = "excluded"  # the customer or invoice is excluded (`dunning exclude`, or auto_advance false)
    BELOW_MINIMUM = "below_minimum"  # the invoice's remaining balance is under `min_remaining_minor`
    # a payment-failed notice for an invoice the snapshot does not know: the event's own address is not trusted
    # (`events.trust_event_email`); it waits for a snapshot that shows the invoice
    EVENT_ADDRESS_NOT_TRUSTED = "event_address_not_trusted"
    # the collections schedule (`dunning.plan.schedule`): the key waits, still newly due, and goes at the first run
    # allowed; the audit's `waits_until` says when that is
    OUTSIDE_SEND_WINDOW = "outside_send_window"  # outside the policy's send window, or on a holiday
    SPACING = "spacing"  # the customer had a reminder less than `min_hours_between_reminders` ago
    # the invoice was handed to a collections system in this cycle (`escalation.stop_reminders`): no more reminders
    ESCALATED = "escalated"
    # its escalation was refused for good (`dunning.send.escalation_refusals`): its reminders wait for a human
    # (`dunning retry`, `dunning resolve`)
    ESCALATION_REFUSED = "escalation_refused"
    # delivery feedback (`dunning.ledger.stores.suppressions`): the address bounced hard, complained or was suppressed
    # by an operator; the key waits, never sent while the suppression is in force, and goes once it is lifted
    SUPPRESSED = "suppressed"
    # a payment of the invoice is processing (`dunning.plan.payment_signals`): its keys wait until the attempt ends
    PAYMENT_IN_FLIGHT = "payment_in_flight"
    # the collections desk (`dunning.desk`): the customer promised to pay (until the promise's date plus the grace),
    # or replied and waits for an answer; the reminders and escalations wait, still newly due
    PROMISED = "promised"
    REPLIED = "replied"
    # why an `unknown` send's kept request is not resubmitted now (`dunning.send.resubmission`): it stays `unknown`
    NOT_OWED = "not_owed"  # an invoice it covers is paid, void or settled since
    AMOUNT_CHANGED = "amount_changed"  # an invoice it covers owes another amount than the email states
    NOT_IN_SNAPSHOT = "not_in_snapshot"  # an invoice it covers is not in this run's snapshot
    PAST_IDEMPOTENCY_WINDOW = "past_idempotency_window"  # the provider may have forgotten its key: a human decides


# hold reasons a person fixes in the data (the billing system's contact), not ones the clock resolves: `preview`,
# the run summary and `status` name the invoices held for them
DATA_PROBLEMS = (str(HoldReason.NO_EMAIL_ADDRESS), str(HoldReason.INVALID_ADDRESS), str(HoldReason.SUPPRESSED))


class PromiseStatus(StrEnum):
    """`promises.status`: a promise to pay (`dunning.desk.promises`)."""

    ACTIVE = "active"
    KEPT = "kept"
    BROKEN = "broken"
    CANCELLED = "cancelled"


class ExclusionScope(StrEnum):
    """`exclusions.scope`: what one exclusion holds out of dunning."""

    CUSTOMER = "customer"
    INVOICE = "invoice"


class AuditNote(StrEnum):
    """`dunning_audit.reason` of a key that was not held: something its email left out."""

    PAYMENT_URL_DROPPED = "payment_url_dropped"  # the invoice's pay link was not https (`dunning.email.pay_links`)
    # a copy address of `customer_cc` broke the address rule and was left out (`dunning.desk.contacts`)
    CC_ADDRESS_DROPPED = "cc_address_dropped"


class SetAside(StrEnum):
    """How an `event_quarantine.reason` starts for a billing event that was stored but yields nothing, so the run
    summary and `status` can count them (the rest of the reason names the event's own details)."""

    # a stored `invoice.payment_failed` event past `source.events_lookback_days` without its notice
    EXPIRED = "expired"
    # a payment signal (`dunning.plan.payment_signals`) whose customer is not the invoice's in the snapshot
    OTHER_CUSTOMER = "payment signal of another customer"


MAX_CC = 10  # copy addresses of one email at most (`dunning.desk.contacts` per row, `dunning.send` per email)

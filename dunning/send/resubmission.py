"""One rule for sending again: an `unknown` send is settled by asking, or resubmitted exactly as it first left.

A `failed` key was provably not accepted, so a later cycle re-plans it from the
current snapshot like any newly due key (`policy.plan_retries`). An `unknown`
key may have reached the customer: it is never re-rendered. It is settled by a
lookup where the provider can answer, or, with a provider whose idempotency
contract answers a repeated key with the first result (Resend, a relay with an
idempotency header), by resubmitting the kept request byte for byte under the
same key, and only when all of these hold:

- it is its first attempt's request (`provider_payloads`), for the same provider;
- the provider still remembers the key (`provider.idempotency_window_hours`,
  wall clock from the first attempt, at most what the provider keeps);
- the present allows it (`settle_rows`, computed in the plan step from this
  run's snapshot and exclusions): every invoice it covers is still owed, with
  the amount the email states, and neither the customer nor an invoice is
  excluded or below the minimum. Pause is checked by the send step before this
  runs.

Otherwise nothing is sent and the key stays `unknown`, with the reason in its
`last_error` (shown by `dunning status`) and in `provider_payloads.held_reason`.
Past the provider's memory the request is dropped and one alert asks a human.
A resubmission is not a new email for the breaker: the key is already on
record, and the window counts it once.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import polars as pl

from dunning.config import Alerts, DunningConfig, Provider
from dunning.ledger.base import Ledger
from dunning.plan.exclusions import hold_expr
from dunning.send.alerts import Alert, raise_alert
from dunning.send.providers.base import EmailProvider
from dunning.vocabulary import EmailKind, HoldReason, LedgerStatus, PlanRole, SendStatus

SETTLE_COLUMNS = ("idempotency_key", "email_id", "kind", "invoice_id", "customer_id", "role", "hold")
# kinds whose email states an invoice's remaining balance: a resubmission must state what is owed now
_STATES_AMOUNT = (str(EmailKind.REMINDER), str(EmailKind.INVOICE))
UNKNOWN_NEEDS_HUMAN = "unknown_needs_human"


def settle_rows(
    unknown: pl.DataFrame, cycled: pl.DataFrame, exclusions: pl.DataFrame | None, config: DunningConfig
) -> pl.DataFrame:
    """One plan row (role `settle`) per `unknown` key (`Ledger.unknown_sends`), with why the present forbids
    resubmitting it (`hold`), or null.

    `cycled` is this run's snapshot (its shard's); `exclusions` those in force. An invoice the key covers must
    be in the snapshot, owed (open with something left), and, for an email that states it, owe the amount the
    ledger recorded when the key was claimed."""
    # only the invoices of the unknown keys matter here: a snapshot of a million rows is not read for none
    ids = unknown.select("invoice_id").drop_nulls().unique()
    cycled = cycled.clear() if ids.is_empty() else cycled.join(ids, on="invoice_id", how="semi")
    current = cycled.select(
        "invoice_id",
        pl.col("customer_id").alias("snapshot_customer"),
        (pl.col("owed") & pl.col("in_cycle")).alias("still_owed"),
        "remaining_minor",
        pl.col("currency").alias("snapshot_currency"),
        pl.lit(True).alias("in_snapshot"),
    )
    columns = ["idempotency_key", "email_id", "kind", "invoice_id", "customer_id", "amount_minor"]
    joined = unknown.select(*columns, *(["customer_email"] if "customer_email" in unknown.columns else [])).join(
        current, on="invoice_id", how="left"
    )
    has_invoice = pl.col("invoice_id").is_not_null()
    excluded = hold_expr(cycled, exclusions, config)
    reason = (
        pl.when(has_invoice & pl.col("in_snapshot").is_null())
        .then(pl.lit(str(HoldReason.NOT_IN_SNAPSHOT)))
        .when(has_invoice & ~pl.col("still_owed").fill_null(False))
        .then(pl.lit(str(HoldReason.NOT_OWED)))
        .when(
            has_invoice
            & pl.col("kind").is_in(_STATES_AMOUNT)
            & (pl.col("remaining_minor") != pl.col("amount_minor")).fill_null(True)
        )
        .then(pl.lit(str(HoldReason.AMOUNT_CHANGED)))
        .otherwise(excluded)
    )
    return joined.with_columns(pl.col("snapshot_currency").alias("currency")).select(
        "idempotency_key",
        "email_id",
        "kind",
        "invoice_id",
        "customer_id",
        pl.lit(str(PlanRole.SETTLE)).alias("role"),
        reason.alias("hold"),
    )


@dataclass
class Settled:
    """What settling this run's `unknown` keys did, in keys."""

    by_lookup: int = 0
    by_resubmission: int = 0
    still_unknown: int = 0
    held: dict[str, int] = field(default_factory=dict)  # kept requests not resubmitted, by reason
    needs_human: int = 0  # past the provider's memory now: one alert

    @property
    def settled(self) -> int:
        return self.by_lookup + self.by_resubmission


def _window(settings: Provider) -> dt.timedelta:
    return dt.timedelta(hours=settings.idempotency_window_hours)


def resolve_unknown(
    ledger: Ledger,
    provider: EmailProvider,
    settings: Provider,
    wall: dt.datetime,
    backoff_minutes: float,
    settle: pl.DataFrame | None = None,
    alerts: Alerts | None = None,
    run_id: str | None = None,
) -> Settled:
    """Settle this run's `unknown` keys: look them up, or resubmit a kept request the rule allows (module
    docstring). `settle` is the plan's `settle` rows (this run's keys, with the present's `hold`); without it
    every unknown key is looked up and none is resubmitted (no present to check it against)."""
    pending = ledger.unknown_sends().filter(pl.col("kind") != EmailKind.ESCALATION)  # not emails: `send.escalation`
    if settle is not None:
        pending = pending.join(settle.select("idempotency_key", "hold"), on="idempotency_key", how="inner")
    else:
        pending = pending.with_columns(pl.lit("no present to check against", dtype=pl.String).alias("hold"))
    if pending.height and "customer_email" in pending.columns:  # suppressed since the plan: read again, now
        now_suppressed = set(ledger.suppressed_emails(wall.date()).get_column("email").to_list())
        if now_suppressed:
            late = pending.get_column("customer_email").str.to_lowercase().is_in(sorted(now_suppressed))
            pending = pending.with_columns(
                pl.when(late.fill_null(False) & pl.col("hold").is_null())
                .then(pl.lit(str(HoldReason.SUPPRESSED)))
                .otherwise(pl.col("hold"))
                .alias("hold")
            )
    done = Settled()
    answers: list[tuple[str, SendStatus, str | None, str | None, str | None]] = []
    settled_emails: list[str] = []
    held: list[tuple[str, str | None, str | None]] = []
    forgotten: list[tuple[str, list[str]]] = []
    for (email,), rows in pending.group_by("email_id", maintain_order=True):
        first = rows.row(0, named=True)
        keys = rows.get_column("idempotency_key").to_list()
        kept = settings.resubmits_unknown and first["payload"] is not None and first["provider"] == provider.name
        if kept and wall - first["first_attempt_wall_at"] >= _window(settings):
            forgotten.append((str(email), keys))
            continue
        if kept:
            holds = [h for h in rows.get_column("hold").to_list() if h is not None]
            if holds or settle is None:
                why = holds[0] if holds else "no present to check against"
                held.append((str(email), why, f"not resubmitted: {why}; still unknown"))
                done.held[why] = done.held.get(why, 0) + len(keys)
                continue
            outcome = provider.resubmit(first["payload"], first["provider_key"], first["message_id"])
            status, pid = outcome.status, outcome.provider_message_id
            note = f"resubmitted under its idempotency key: {status}" + (f" ({outcome.error})" if outcome.error else "")
            if status not in (SendStatus.SENT, SendStatus.FAILED):
                held.append((str(email), None, note[:500]))
            else:
                done.by_resubmission += len(keys)
        else:
            status = provider.lookup(first["message_id"], first["provider_message_id"]) or SendStatus.UNKNOWN
            pid, note = None, f"resolved by provider lookup: {status}"
            if status in (SendStatus.SENT, SendStatus.FAILED):
                done.by_lookup += len(keys)
        if status in (SendStatus.SENT, SendStatus.FAILED):
            answers += [(k, status, first["message_id"], note[:500], pid) for k in keys]
            settled_emails.append(str(email))
        else:
            done.still_unknown += len(keys)
    if answers:
        schema = {"idempotency_key": pl.String, "status": pl.String, "message_id": pl.String, "error": pl.String}
        frame = pl.DataFrame(answers, schema=schema | {"provider_message_id": pl.String}, orient="row")
        ledger.record_outcomes(
            frame, None, wall, backoff_minutes, expected_status=LedgerStatus.UNKNOWN, settled_by=run_id
        )
        ledger.drop_payloads(settled_emails)
    if held:
        ledger.hold_unknown(pl.DataFrame(held, schema=["email_id", "held_reason", "note"], orient="row"))
    if forgotten:
        done.needs_human = sum(len(k) for _, k in forgotten)
        _hand_to_a_human(ledger, forgotten, settings, wall, alerts, run_id)
    return done


def _hand_to_a_human(
    ledger: Ledger,
    forgotten: list[tuple[str, list[str]]],
    settings: Provider,
    wall: dt.datetime,
    alerts: Alerts | None,
    run_id: str | None,
) -> None:
    """Requests the provider may no longer dedupe: dropped (never resubmitted), the keys noted, one alert."""
    note = (
        f"held for a human: the provider keeps idempotency keys {settings.idempotency_window_hours:g} h and may "
        "have forgotten this one; `dunning resolve --sent|--not-sent KEY` after checking the provider's log"
    )
    reason = str(HoldReason.PAST_IDEMPOTENCY_WINDOW)
    held = [(email, reason, note) for email, _ in forgotten]
    ledger.hold_unknown(pl.DataFrame(held, schema=["email_id", "held_reason", "note"], orient="row"))
    ledger.drop_payloads([e for e, _ in forgotten])
    keys = sorted(k for _, ks in forgotten for k in ks)
    alert = Alert(
        kind=UNKNOWN_NEEDS_HUMAN,
        message=f"{len(keys)} unknown key(s) can no longer be resubmitted safely (past the provider's "
        f"{settings.idempotency_window_hours:g} h idempotency memory): check the provider's log and "
        f"`dunning resolve` them; first: {', '.join(keys[:5])}",
        created_at=wall,
        run_id=run_id,
        details={"keys": keys[:200], "provider": settings.kind},
        dedup_key="dunning-unknown-needs-human-" + keys[0][:150],
    )
    raise_alert(ledger, alerts or Alerts(), alert)

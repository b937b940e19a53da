"""What a live run at a given clock would send: the same steps in dry-run mode, each email rendered, nothing written.

`dunning preview` answers the question a billing team asks before going live
and after every template change: which customers get which email, with which
subject, and what waits and why. It runs the cycle's real steps
(`steps.apply_snapshot`, `steps.plan_step`, the breaker) in `RunMode.DRY_RUN`,
on a ledger opened for reading only (`ledger.factory.open_ledger_to_read`),
then renders each email exactly as the send step would hand it over
(`email.compose`: the outbox's bytes). Nothing is claimed, nothing is written,
no provider is built and no Dagster run is recorded.

What waits: keys the plan holds (excluded, below the minimum, an event's
address not trusted, …), keys without a usable address, keys of customers
already at the cap when they would be claimed (`throttled`), and, when the
breaker would trip, the whole batch (`breaker`). A customer emailed within the
breaker's window is flagged on each of their emails. Escalations a live run
would hand to the collections system (`dunning.send.escalation`) are listed
apart: they are not emails, and no secret is read to list them.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo

import polars as pl

from dunning.config import DunningConfig
from dunning.email.compose import wire_for
from dunning.email.message_ids import message_ids
from dunning.email.render import fallen_back
from dunning.email.wire import WireEmail
from dunning.fees import amounts, planning
from dunning.fees import cycle as fee_cycle
from dunning.ingest import rejections
from dunning.ledger.base import Ledger
from dunning.ledger.stores.claims import within_cap
from dunning.plan.breaker import BreakerVerdict
from dunning.plan.clock import CycleClock, RunMode
from dunning.report import held as held_keys
from dunning.report.held import WindowOpening
from dunning.run import cycle, steps
from dunning.send.providers.file_outbox import file_name
from dunning.send.sending import render_settings, with_email_ids
from dunning.vocabulary import HoldReason

PREVIEW_RUN = "preview"


@dataclass(frozen=True)
class PreviewEmail:
    customer_id: str
    to: str
    kind: str
    keys: list[str]
    stages: list[str]
    subject: str
    emailed_in_window: int  # emails already on record for this customer in the breaker's window
    wire: WireEmail = field(repr=False)


@dataclass(frozen=True)
class PreviewEscalation:
    key: str
    invoice_id: str
    customer_id: str
    policy: str
    amount_minor: int
    currency: str


@dataclass(frozen=True)
class Preview:
    as_of: dt.datetime
    snapshot_rows: int
    rejected_rows: int
    emails: list[PreviewEmail]
    held: dict[str, int]  # reason -> keys that wait
    breaker: BreakerVerdict
    not_built: list[tuple[list[str], str]]  # keys of an email that could not be built, and why
    escalations: list[PreviewEscalation] = field(default_factory=list)
    fees: list[dict[str, object]] = field(default_factory=list)  # the charges the emails would claim (`dunning.fees`)
    openings: list[WindowOpening] = field(default_factory=list)  # when each policy's send window opens
    data_problems: list[dict[str, str]] = field(default_factory=list)  # invoices held for their data
    zone: ZoneInfo = field(default=ZoneInfo("UTC"))  # the business time zone, in which openings are told
    # customers' locales whose language has no templates: their text, dates and numbers fell back (-> emails)
    locale_fallbacks: dict[str, int] = field(default_factory=dict)
    rejected_detail: dict[str, object] = field(default_factory=dict)  # `ingest.rejections.breakdown`

    def as_json(self) -> dict[str, object]:
        return {
            "as_of": self.as_of.isoformat(),
            "snapshot_rows": self.snapshot_rows,
            "rejected_rows": self.rejected_rows,
            "rejected": self.rejected_detail,
            "emails": [
                {
                    "to": e.to,
                    "kind": e.kind,
                    "keys": e.keys,
                    "subject": e.subject,
                    "customer_id": e.customer_id,
                    "stages": e.stages,
                    "emailed_in_window": e.emailed_in_window,
                }
                for e in self.emails
            ],  # fmt: skip
            "escalations": [
                {
                    "key": e.key,
                    "invoice_id": e.invoice_id,
                    "customer_id": e.customer_id,
                    "policy": e.policy,
                    "amount_minor": e.amount_minor,
                    "currency": e.currency,
                }
                for e in self.escalations
            ],  # fmt: skip
            "fees": self.fees,
            "held": self.held,  # a key counted under each reason it waits for
            "send_window_opens": [o.as_json(self.as_of) for o in self.openings],
            "held_for_data": self.data_problems,
            "locale_fallbacks": self.locale_fallbacks,
            "breaker_passed": self.breaker.passed,
        }

    def write_emails(self, directory: Path) -> list[Path]:
        """Each email as an `.eml` file under `directory`, named as the outbox would name it, byte for byte."""
        directory.mkdir(parents=True, exist_ok=True)
        paths = []
        for email in self.emails:
            path = directory / file_name(email.wire.message_id)
            path.write_bytes(email.wire.data)
            paths.append(path)
        return paths


def _count(counts: dict[str, int], reason: str, n: int) -> None:
    if n:
        counts[reason] = counts.get(reason, 0) + n


def preview(
    ledger: Ledger, snapshot: str, config: DunningConfig, as_of: dt.datetime, allow_shrink: bool = False
) -> Preview:
    """What a live run at `as_of` would send, from `snapshot`, on `ledger` as it stands (read, never written); a
    snapshot a live run would refuse as empty or shrunk (`snapshot_guard`) is refused here too, unless
    `allow_shrink` as `dunning run --allow-shrink` would apply it."""
    clock = CycleClock(as_of, RunMode.DRY_RUN, as_of.astimezone(config.zone).date())
    applied = steps.apply_snapshot(
        ledger, snapshot, config, clock, run_id=PREVIEW_RUN, allow_stale=True, wall=dt.datetime.now(dt.UTC),
        allow_shrink=allow_shrink,
    )  # fmt: skip
    plan = steps.plan_step(ledger, applied.cycled, None, config, clock)
    verdict = cycle.check_breaker(ledger, plan, as_of, config)
    due = cycle.due_rows(plan)
    reasons = held_keys.plan_reasons(due)  # every reason each key waits for, not only its first
    held = held_keys.counts(reasons)
    # the Message-IDs a live run would mint, read from the ledger; where it has no secret yet, placeholders
    sendable = with_email_ids(cycle.sendable_due(plan), config, message_ids(ledger, config, required=False))
    recent = cycle.recent_emails(ledger, as_of, config)
    emails: list[PreviewEmail] = []
    not_built: list[tuple[list[str], str]] = []
    fallbacks: dict[str, int] = {}
    handovers = _escalations(cycle.escalations_due(plan))
    proposed: list[dict[str, object]] = []
    if not verdict.passed:  # the breaker halts the whole batch, hand-overs included
        _count(held, str(HoldReason.BREAKER), sendable.height + len(handovers))
        handovers = []
    else:
        allowed = within_cap(sendable, recent, cycle.claim_cap(as_of, config))
        _count(held, str(HoldReason.THROTTLED), sendable.height - allowed.height)
        charges, waits = _charges(ledger, allowed, config, as_of)
        fees: dict[str, list[object]] = {}
        if charges is not None and charges.height:
            fees = fee_cycle.fee_lines(charges, set(charges.get_column("charge_key")), fee_cycle.laws(config))
            proposed = charges.select("charge_key", "invoice_id", "customer_id", "kind", "amount_minor", "currency",
                                      "status").to_dicts()  # fmt: skip
        if waits is not None and waits.height:
            _count(held, amounts.RATE_UNKNOWN, waits.height)
        emails, not_built, fallbacks = _rendered(allowed, recent, config, as_of, fees)
    return Preview(
        as_of, applied.loaded.valid.height, applied.loaded.rejected.height, emails, held, verdict, not_built, handovers,
        fees=proposed, openings=held_keys.window_openings(due, config), data_problems=held_keys.data_problems(reasons),
        zone=config.zone, locale_fallbacks=fallbacks, rejected_detail=rejections.breakdown(applied.loaded.rejected),
    )  # fmt: skip


def _charges(
    ledger: Ledger, allowed: pl.DataFrame, config: DunningConfig, as_of: dt.datetime
) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
    """The charges a live run would claim with these emails (a ledger made before the `charges` table: none on
    record yet)."""
    try:
        return fee_cycle.charges_for(ledger, allowed, config, as_of)
    except ledger.database_errors:  # read-only and older than migration 20: no charge is on record
        return planning.plan_charges(allowed, config, as_of) if planning.fees_configured(config) else (None, None)


def _escalations(due: pl.DataFrame) -> list[PreviewEscalation]:
    columns = ["idempotency_key", "invoice_id", "customer_id", "policy", "amount_minor", "currency"]
    return [
        PreviewEscalation(*(row[c] for c in columns)) for row in due.select(columns).sort("idempotency_key").to_dicts()
    ]


def _rendered(
    allowed: pl.DataFrame, recent: pl.DataFrame, config: DunningConfig, as_of: dt.datetime,
    fees: dict[str, list[object]] | None = None,
) -> tuple[list[PreviewEmail], list[tuple[list[str], str]], dict[str, int]]:  # fmt: skip
    settings = render_settings(config, as_of)
    in_window = dict(recent.select("customer_id", "emails").iter_rows()) if recent.height else {}
    emails, not_built = [], []
    fallbacks: dict[str, int] = {}
    for _, group in allowed.group_by("email_group", maintain_order=True):
        records = group.to_dicts()
        keys = [r["idempotency_key"] for r in records]
        for record in records:  # the charges this email would claim, as a live run's email lists them
            if fees and record["idempotency_key"] in fees:
                record["fees"] = fees[record["idempotency_key"]]
        try:
            wire = wire_for(records, sender=settings.sender, as_of=as_of, locale=settings.locale,
                            templates_dir=settings.templates_for(records))  # fmt: skip
        except (ValueError, TypeError, LookupError, OSError) as error:  # what the send step records as not built
            not_built.append((keys, f"{type(error).__name__}: {error}"[:300]))
            continue
        first = records[0]
        fell = fallen_back(records, settings.locale, settings.templates_for(records), str(first["kind"]))
        if fell is not None:
            fallbacks[fell] = fallbacks.get(fell, 0) + 1
        emails.append(
            PreviewEmail(
                customer_id=str(first["customer_id"]),
                to=wire.to,
                kind=str(first["kind"]),
                keys=keys,
                stages=sorted({str(r["stage"]) for r in records if r.get("stage")}),
                subject=_subject(wire.data),
                emailed_in_window=int(in_window.get(first["customer_id"], 0)),
                wire=wire,
            )
        )
    return emails, not_built, dict(sorted(fallbacks.items()))


def _subject(data: bytes) -> str:
    """The Subject header of an email's bytes, decoded (RFC 2047) for a person to read."""
    from email.header import decode_header, make_header
    from email.parser import BytesHeaderParser

    value = BytesHeaderParser().parsebytes(data)["Subject"] or ""
    return str(make_header(decode_header(str(value))))

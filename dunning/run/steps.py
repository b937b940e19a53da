"""The cycle composed once: the steps every caller runs, in order, with the same rules.

The Dagster assets (one step each), the resume guard's simulated double pass
and the benchmark all call these functions, so a proof or a measurement is of
the pipeline that actually runs, not of a copy of it:

1. `apply_snapshot`: read and validate, refuse a stale snapshot, quarantine,
   halt by policy, assign cycles against the ledger (as of the day for a
   backfill), record cycle changes and the day's history.
2. `plan_step`: newly due keys, failed sends whose backoff is over, and
   payment-failed notices from new events; keys of excluded customers and
   invoices, and balances under the minimum, held (`dunning.plan.exclusions`).
3. the breaker (`cycle.check_breaker`), a gate the caller enforces.
4. `send_step`: the pause check, stale claims expired, unknown outcomes looked
   up, then claim-send-record (`sending.send_due`); the billing source's event
   cursor this run staged is committed once its notices are claimed.
5. the audit (`cycle.audit_cycle`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from email.message import Message

import polars as pl

from dunning.config import DunningConfig
from dunning.desk import contacts
from dunning.desk import holds as desk_step
from dunning.email.message_ids import message_ids
from dunning.email.render import draft_for
from dunning.errors import InvalidRowsHalt, SnapshotRefused
from dunning.fees import cycle as fee_cycle
from dunning.fees.planning import PostReport
from dunning.ingest.events import event_keys
from dunning.ingest.snapshot_rules import DUPLICATED
from dunning.ingest.store import part_stamp
from dunning.keys import MessageIds
from dunning.ledger.base import Ledger
from dunning.ledger.stores.operations import PauseState
from dunning.plan import escalation, invoice_emails, payment_signals, schedule
from dunning.plan.clock import CycleClock, RunMode
from dunning.plan.exclusions import IN_FLIGHT, SUPPRESSED_ADDRESS, in_force, with_held
from dunning.plan.notices import notice_rows
from dunning.plan.policies import stage_days_frame
from dunning.plan.policy import assign_cycles, business_date
from dunning.run import cycle, snapshot_guard
from dunning.safe_text import for_terminal
from dunning.send import escalating, escalation_refusals, heap
from dunning.send import escalation as escalation_send
from dunning.send.alerts import Alert, raise_alert
from dunning.send.escalating import EscalationReport
from dunning.send.handover import read_journal
from dunning.send.providers.base import EmailProvider
from dunning.send.resubmission import Settled, resolve_unknown, settle_rows
from dunning.send.sending import Record, SendReport, held_outcomes, render_settings, send_due, with_email_ids
from dunning.sharding import EVERYONE, Shard
from dunning.vocabulary import EmailKind, ExclusionScope, HoldReason, SendStatus

HISTORY_COLUMNS = (
    "invoice_id", "customer_id", "customer_email", "currency", "amount_due", "amount_paid", "remaining_minor",
    "due_date", "status", "days_overdue", "cycle",
)  # fmt: skip


@dataclass(frozen=True)
class AppliedSnapshot:
    loaded: cycle.ValidatedSnapshot
    cycled: pl.DataFrame  # the valid rows with cycle, days overdue, owed, sendable
    taken_at: dt.datetime
    rows_read: int = 0  # the file's rows, accepted and rejected (a shard's part of an ingest: that part's)


def apply_snapshot(
    ledger: Ledger, path: str, config: DunningConfig, clock: CycleClock, *, run_id: str, allow_stale: bool,
    wall: dt.datetime, shard: Shard = EVERYONE, allow_shrink: bool = False, source: str | None = None,
) -> AppliedSnapshot:  # fmt: skip
    """Step 1. Raises SnapshotError (stale, unreadable, empty, shrunk) or InvalidRowsHalt before any cycle is computed
    (`source`: the billing source the file was pulled from; empty or shrunk is then its failure, exit 7).

    A shard (`dunning.sharding`) keeps only its customers' rows, and quarantines only its rejected rows (a row
    without a customer id is shard 0's); the snapshot's age, size and the halt are judged on the whole file, so every
    shard agrees on them, and never on a shard's part of an ingest (the ingest judged the whole). `loaded` is the
    shard's part."""
    whole = cycle.load_snapshot(path, config)
    # a shard's part of an ingest carries the ingest's snapshot time and whole count, also when it has no row
    stamp = part_stamp(path)
    taken_at = stamp.taken_at if stamp else cycle.snapshot_taken_at(whole.valid, clock.as_of)
    invoices = stamp.invoices if stamp else whole.valid.height
    # before anything is written; a dry run and a preview say what a live run would refuse, a backfill replays
    judged = stamp is None and clock.reads_live_state
    if judged:
        rows = whole.valid.height + whole.rejected.height
        snapshot_guard.refuse_empty(ledger, rows, path, config, source=source, live=clock.live, run_id=run_id,
                                    as_of=clock.as_of)  # fmt: skip
    if clock.live:
        snapshot_guard.refuse_stale(ledger, taken_at, allow_stale)
    if judged:
        snapshot_guard.refuse_shrunk(ledger, whole.valid.height, path, config, allow_shrink=allow_shrink,
                                     source=source, live=clock.live, run_id=run_id, as_of=clock.as_of)  # fmt: skip
    loaded = cycle.ValidatedSnapshot(shard.keep(whole.valid), shard.keep(whole.rejected))
    if loaded.rejected.height and clock.mode is not RunMode.DRY_RUN:
        ledger.quarantine(run_id, path, loaded.rejected, wall)
        if clock.live:
            alert_duplicates(ledger, loaded.rejected, config, clock.as_of, run_id)
    if whole.rejected.height and config.on_invalid_rows == "halt":
        raise InvalidRowsHalt(f"snapshot rejected (on_invalid_rows: halt): {whole.summary}")
    if whole.rejected.height and whole.valid.is_empty():  # nobody would be dunned: never a quiet success
        raise SnapshotRefused(f"snapshot {path}: none of its rows was accepted: {whole.summary}")
    if clock.reads_live_state:
        state = ledger.invoice_state()
    else:
        state = ledger.state_as_of(clock.as_of, stage_days_frame(config))
    signals = ledger.signal_events(payment_signals.SIGNAL_TYPES, clock.as_of - payment_signals.LOOKBACK, clock.as_of)
    signals = payment_signals.owned(signals, loaded.valid)[0]  # another customer's: set aside by `plan_step`
    if clock.live:
        reconcile_disputes(ledger, signals, wall)
    # an invoice paid after the snapshot was taken (a stored `invoice.paid`) is read as paid: its cycle closes now
    valid = payment_signals.with_payments(loaded.valid, signals, taken_at)
    cycled = assign_cycles(valid, state, clock.as_of, config, taken_at)
    if clock.live:
        ledger.set_feature(invoice_emails.FEATURE, config.invoice_emails.enabled, clock.partition_date, clock.as_of,
                           run_id)  # fmt: skip
        ledger.record_cycle_changes(clock.as_of, cycled, taken_at)
        ledger.record_applied_snapshot(run_id, taken_at, clock.as_of, path, allow_stale, wall, invoices)
    if clock.mode is not RunMode.DRY_RUN:
        history = cycled.select(
            pl.lit(clock.partition_date).alias("business_date"), pl.lit(run_id).alias("run_id"),
            pl.lit(clock.as_of).alias("as_of"), *HISTORY_COLUMNS,
        )  # fmt: skip
        ledger.merge_history_day(clock.partition_date, history, shard=shard)
    return AppliedSnapshot(loaded, cycled, taken_at, whole.valid.height + whole.rejected.height)


STRIPE = "stripe"  # who excluded an invoice for its dispute


def reconcile_disputes(ledger: Ledger, signals: pl.DataFrame, at: dt.datetime) -> None:
    """Keep the `exclusions` table in step with the disputes the events tell of: an open dispute excludes its invoice
    (reason `disputed`, by `stripe`); a closed one ends that exclusion, never one an operator made."""
    opened, closed = payment_signals.disputes(signals)
    in_force = ledger.open_exclusions().filter(pl.col("scope") == ExclusionScope.INVOICE)
    by = dict(
        zip(in_force.get_column("target_id").to_list(), in_force.get_column("excluded_by").to_list(), strict=True)
    )
    for invoice_id in opened:
        if invoice_id not in by:
            ledger.exclude(ExclusionScope.INVOICE, invoice_id, "disputed", None, STRIPE, at)
    for invoice_id in closed:
        if by.get(invoice_id) == STRIPE:
            ledger.include(ExclusionScope.INVOICE, invoice_id, STRIPE, at)


DUPLICATE_IDS_ALERT = "duplicate_invoice_ids"


def alert_duplicates(
    ledger: Ledger, rejected: pl.DataFrame, config: DunningConfig, as_of: dt.datetime, run_id: str
) -> None:
    """One alert naming the invoice ids a snapshot listed with different values: none of them is dunned until the
    export is fixed (an identical repeat is kept once and needs nobody). Not raised again while the same one is
    open."""
    ids = sorted(set(rejected.filter(pl.col("rule").str.contains(DUPLICATED, literal=True)).get_column("invoice_id")
                     .drop_nulls().to_list()))  # fmt: skip
    if not ids:
        return
    shown = ", ".join(for_terminal(i)[:80] for i in ids[:20]) + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")
    message = (
        f"{len(ids)} invoice id(s) listed more than once with different values: quarantined, none of them dunned "
        f"until the export lists each once: {shown}"
    )
    if message in ledger.open_alert_messages(DUPLICATE_IDS_ALERT):  # every open one, not the oldest alone
        return
    alert = Alert(DUPLICATE_IDS_ALERT, message, as_of, run_id, {"invoice_ids": ids[:500]}, "error",
                  dedup_key=f"dunning-duplicates-{ids[0][:100]}")  # fmt: skip
    raise_alert(ledger, config.alerts, alert)


def plan_step(ledger: Ledger, cycled: pl.DataFrame, events: pl.DataFrame | None, config: DunningConfig,
              clock: CycleClock, shard: Shard = EVERYONE, *, run_id: str | None = None) -> pl.DataFrame:  # fmt: skip
    """Step 2. Retries and notices belong to live and dry runs; a backfill asks what the policy would have sent.

    `cycled` is already the shard's; retries follow it (they join on its invoices), notices only for its customers.
    Exclusions in force on the cycle's business date hold their keys in every mode (a backfill uses today's)."""
    failed, notices, settle = None, None, None
    day = business_date(clock.as_of, config)
    suppressed = ledger.suppressed_emails(day).get_column("email").to_list()
    # every contact (`customer_cc`): copies checked, suppressed ones left out, a live copy `To` for a suppressed primary
    cycled = contacts.resolve(cycled, suppressed)
    exclusions = with_held(in_force(ledger.open_exclusions(), day), SUPPRESSED_ADDRESS, suppressed)
    signals = ledger.signal_events(payment_signals.SIGNAL_TYPES, clock.as_of - payment_signals.LOOKBACK, clock.as_of)
    # a signal counts only when its event's customer is the invoice's own in the snapshot; another's is set aside
    # (once, however many runs find it again), here, where this run's own events are stored
    signals, foreign = payment_signals.owned(signals, cycled)
    recorded_as = run_id or f"plan:{clock.as_of.isoformat()}"
    if foreign.height and clock.live:
        if run_id is not None:  # a real run; the resume guard's simulation (no run id) pages nothing it rolls back
            alert_unmatched_disputes(ledger, foreign, config, clock.as_of, recorded_as)
        ledger.set_aside_events(foreign, recorded_as, dt.datetime.now(dt.UTC))
    exclusions = with_held(exclusions, IN_FLIGHT, payment_signals.in_flight(signals))
    # a dispute told of by this run's own events holds its invoice now; the table learns of it at the next snapshot
    exclusions = with_held(exclusions, str(ExclusionScope.INVOICE), payment_signals.disputes(signals)[0])
    # the collections desk: promises past their grace judged (a live run records the verdicts and pages for the
    # broken ones), the active ones and the customers waiting for an answer hold their keys
    desk_state = desk_step.plan_desk(ledger, cycled, config, clock, run_id=recorded_as if run_id else None)
    exclusions = desk_step.with_desk_holds(exclusions, desk_state)
    if clock.reads_live_state:
        failed = ledger.retryable_failures(clock.as_of, config.retry.max_attempts)
        events = shard.keep(events) if events is not None else None
        if events is not None and events.height:
            recorded = ledger.recorded_keys(event_keys(events))
            notices, refused = notice_rows(events, cycled, recorded, config.events.trust_event_email)
            if refused.height and clock.live:  # an event that named another customer's invoice: kept, never sent
                ledger.quarantine_events(refused, recorded_as, clock.as_of)
        # this run's unknown keys (its shard's customers), each with why the present forbids resubmitting it; and the
        # claimed ones, which a dead run's may become in the send step
        settle = settle_rows(shard.keep(ledger.unknown_sends(include_claimed=True)), cycled, exclusions, config)
    if not clock.reads_live_state:  # a backfill: what the stages would have sent that day, whenever in the day
        return cycle.plan_cycle(cycled, config, failed, notices, exclusions)
    if clock.live and run_id is not None and not ledger.pause_state().paused:
        fee_cycle.settle_waits(ledger, cycled, config, clock.as_of, run_id)  # interest that waited for its rate
    invoices = plan_invoices(ledger, cycled, config, clock)
    escalations, stopped = plan_escalation_step(ledger, cycled, config, clock)
    plan = cycle.plan_cycle(cycled, config, failed, notices, exclusions, invoices, settle, escalations)
    return desk_step.with_broken_promises(apply_schedule(ledger, plan, cycled, config, clock, stopped), desk_state)


DISPUTE_UNMATCHED = "dispute_unmatched"


def alert_unmatched_disputes(
    ledger: Ledger, foreign: pl.DataFrame, config: DunningConfig, as_of: dt.datetime, run_id: str
) -> int:
    """One alert per dispute event (opened or closed) set aside because it names no customer (its charge not
    expanded, as Stripe sends it), the first time it is set aside: it excludes or includes nothing on its own (a
    forged `metadata.invoice_id` must not stop another customer's reminders), so a human decides. Returns the alerts
    raised."""
    raised = 0
    unmatched = payment_signals.disputes_naming_no_customer(foreign)
    for row in unmatched.iter_rows(named=True):
        if not ledger.set_aside_events(pl.DataFrame([row]).cast(unmatched.schema), run_id, dt.datetime.now(dt.UTC)):
            continue  # set aside by an earlier run, which paged for it
        invoice_id = for_terminal(str(row["invoice_id"]))[:80]
        said = f"dispute event {for_terminal(str(row['event_id']))[:80]} names invoice {invoice_id} but no customer"
        message = (
            f"{said} (Stripe sends a dispute's charge unexpanded): it excludes nothing on its own and the invoice's "
            f"reminders go on; if the dispute is that invoice's, `dunning exclude --invoice {invoice_id} --reason "
            "disputed`"
            if row["type"] == payment_signals.DISPUTE_OPENED
            else f"{said} (its charge unexpanded): the dispute closed, which ends nothing on its own; if you excluded "
            f"the invoice by hand for it, `dunning include --invoice {invoice_id}`"
        )
        details = {"event_id": row["event_id"], "invoice_id": invoice_id}
        raise_alert(ledger, config.alerts, Alert(DISPUTE_UNMATCHED, message, as_of, run_id, details, "warning"))
        raised += 1
    return raised


def plan_escalation_step(
    ledger: Ledger, cycled: pl.DataFrame, config: DunningConfig, clock: CycleClock
) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
    """The escalations due now or retried (`dunning.plan.escalation`), and the invoices whose reminders stop."""
    due = escalation.candidates(cycled, config, ledger.broken_promise_counts())
    if due.is_empty():
        return None, None
    rows, stopped = escalation.plan_escalations(due, ledger.escalation_states)
    failed = ledger.retryable_failures(clock.as_of, config.retry.max_attempts, EmailKind.ESCALATION)
    if failed.height:  # retried only for an invoice its policy still escalates now (one moved to another has no hook)
        escalating = cycled.join(due.select("invoice_id", "cycle"), on=["invoice_id", "cycle"], how="semi")
        rows = pl.concat([rows, escalation.plan_escalation_retries(failed, escalating)], how="diagonal_relaxed")
    return rows, stopped


def apply_schedule(
    ledger: Ledger, plan: pl.DataFrame, cycled: pl.DataFrame, config: DunningConfig, clock: CycleClock,
    stopped: pl.DataFrame | None,
) -> pl.DataFrame:  # fmt: skip
    """Send windows, spacing and escalated invoices hold their keys (`dunning.plan.schedule`), and each reminder
    learns how many reminders its invoice had before in the cycle (the templates' `first_contact`)."""
    reminders = plan.filter(pl.col("role").is_in(cycle.SEND_ROLES) & (pl.col("kind") == EmailKind.REMINDER))
    counts = ledger.reminders_sent(reminders) if reminders.height else None
    spacing = schedule.spacing_hours(cycled, config)
    last = None
    if spacing.height and reminders.height:
        reach = schedule.max_spacing(config)
        asked = spacing.join(reminders.select("customer_id").unique(), on="customer_id", how="semi")
        last = ledger.last_reminders(clock.as_of - reach, clock.as_of + reach, asked)
    return schedule.scheduled(plan, cycled, config, clock.as_of, counts=counts, spacing=spacing, last=last,
                              stopped=stopped)  # fmt: skip


def plan_invoices(
    ledger: Ledger, cycled: pl.DataFrame, config: DunningConfig, clock: CycleClock
) -> pl.DataFrame | None:
    """The invoice emails (`dunning.plan.invoice_emails`) to send, retry or record skipped; None when the feature is
    off. A backfill plans none: what was first seen open on a past day is not known from one day's snapshot."""
    if not config.invoice_emails.enabled:
        return None
    open_invoices = invoice_emails.candidates(cycled)
    recorded = ledger.invoice_keys_on_record(open_invoices)
    enabled_on = ledger.feature_enabled_on(invoice_emails.FEATURE)
    fresh_ids = open_invoices.join(recorded, on="idempotency_key", how="anti").select("invoice_id")
    baseline = None if enabled_on is None else ledger.seen_on_or_before(fresh_ids, enabled_on)
    planned = invoice_emails.plan_invoice_emails(open_invoices, recorded, baseline, config)
    failed = ledger.retryable_failures(clock.as_of, config.retry.max_attempts, EmailKind.INVOICE)
    if failed.height:
        planned = pl.concat(
            [planned, invoice_emails.plan_invoice_retries(open_invoices, failed)], how="diagonal_relaxed"
        )
    return planned


@dataclass(frozen=True)
class SendStepResult:
    report: SendReport | None  # None when paused: nothing was attempted
    outcomes: pl.DataFrame
    pause: PauseState
    stale_claims_expired: int = 0
    unknown_settled: Settled = field(default_factory=Settled)
    first_emails: list[tuple[str, str]] = field(default_factory=list)  # (recipient, subject) of the first sent
    escalations: EscalationReport = field(default_factory=EscalationReport)
    fees: PostReport = field(default_factory=PostReport)  # late fees posted to the billing system


def send_step(
    ledger: Ledger, open_provider: Callable[[], EmailProvider], plan: pl.DataFrame, config: DunningConfig,
    clock: CycleClock, *,
    run_id: str, dead_runs: Callable[[Sequence[str]], Sequence[str]], now: Callable[[], dt.datetime],
    progress: Callable[[SendReport, int], None] | None = None, render: Callable[[list[Record]], Message] | None = None,
    render_processes: int = 1, journal_dir: str | None = None, simulate_escalations: bool = False,
) -> SendStepResult:  # fmt: skip
    """Step 4, for a live run. `open_provider` is called only when not paused; `dead_runs` says which of the
    runs holding claims are known to have ended; `render_processes` > 1 renders in worker processes
    (`dunning.send.render_pool`); `journal_dir` keeps this run's hand-over journal and is where the journals of dead
    runs are read (`dunning.send.handover`). Escalations go after the emails (`dunning.send.escalating`), then the
    refusals for good are paged (`dunning.send.escalation_refusals`), then approved late fees are posted
    (`dunning.fees.posting`); `simulate_escalations` (the resume guard's
    double pass) answers each escalation `sent` without a request, reads no secret and pages nothing."""
    due = cycle.sendable_due(plan)
    handovers = cycle.escalations_due(plan)
    pause = ledger.pause_state()
    if pause.paused:
        return SendStepResult(None, held_outcomes(cycle.to_attempt(plan), SendStatus.PAUSED), pause)
    settle = cycle.settle_rows_of(plan)
    # every escalation secret this run needs, read before anything is claimed: a missing one is a config error
    hooks = escalation_send.webhooks(config, escalation_policies(ledger, handovers, settle), simulate_escalations)
    ledger.record_skipped(cycle.skipped_rows(plan).filter(pl.col("kind") == EmailKind.INVOICE), run_id, clock.as_of)
    heap.settle()  # the run's modules and frames are loaded: the send loop's collections need not walk them
    with open_provider() as provider:  # built only when something may be sent (not while paused)
        owners = ledger.claim_owners(run_id)
        journals = (lambda owner: read_journal(journal_dir, owner)) if journal_dir is not None else None
        stale = ledger.expire_stale_claims(run_id, now(), list(dead_runs(owners)), journals)
        resolved = resolve_unknown(
            ledger, provider, config.provider, now(), config.retry.backoff_minutes, settle, config.alerts, run_id,
        )  # fmt: skip
        charges, charge_waits = fee_cycle.charges_for(ledger, due, config, clock.as_of)
        report, outcomes = send_due(
            ledger, provider, due, cycle.skipped_rows(plan), config=config, run_id=run_id, as_of=clock.as_of,
            now=now, cap=cycle.claim_cap(clock.as_of, config), progress=progress, render=render,
            render_processes=render_processes, journal_dir=journal_dir, charges=charges, charge_waits=charge_waits,
            retried_fees=fee_cycle.retried_fee_lines(ledger, due, config),
        )  # fmt: skip
        ledger.commit_cursor(run_id, now())  # this run's polled events have their notices claimed: poll on from them
    handed, handed_outcomes = escalating.hand_over_escalations(
        ledger, handovers, settle, config, hooks, run_id=run_id, as_of=clock.as_of, now=now, journal_dir=journal_dir,
    )  # fmt: skip
    resubmitted = escalating.resubmit_unknown(ledger, settle, config, hooks, run_id=run_id, now=now)
    handed.resubmitted, handed.held = resubmitted.resubmitted, resubmitted.held
    fees = PostReport()
    if not simulate_escalations:
        handed.refused = escalation_refusals.page_refusals(ledger, config, run_id=run_id, as_of=clock.as_of)
        fee_alerts = fee_cycle.stale_table_alerts(ledger, ledger.charge_waits(), config, clock.as_of)
        fees, not_posted = fee_cycle.post_approved(ledger, config, run_id=run_id, as_of=clock.as_of, now=now)
        for kind, message, details in fee_alerts + ([not_posted] if not_posted else []):
            raise_alert(ledger, config.alerts, Alert(kind, message, clock.as_of, run_id, details, "warning"))
    outcomes = pl.concat([outcomes, handed_outcomes.select(outcomes.columns).cast(outcomes.schema)])
    first = first_sent(due, outcomes, config, clock, message_ids(ledger, config))
    alert_suppressed_contacts(ledger, plan, outcomes, config, run_id, now())
    return SendStepResult(report, outcomes, pause, stale, resolved, first, handed, fees)


CONTACT_SUPPRESSED = "contact_suppressed"


def alert_suppressed_contacts(
    ledger: Ledger, plan: pl.DataFrame, outcomes: pl.DataFrame, config: DunningConfig, run_id: str, at: dt.datetime
) -> int:
    """One `contact_suppressed` alert per customer and address, the first time a key of theirs is held because the
    address is suppressed (by the plan, or at the claim): someone must find the customer a working address."""
    due = cycle.due_rows(plan)
    at_claim = outcomes.filter(pl.col("status") == SendStatus.SUPPRESSED).select("idempotency_key")
    # a suppressed primary that a copy address stands in for (`dunning.desk.contacts`) needs a new contact too
    replaced = (
        due.filter(pl.col("primary_email").is_not_null()).select(
            "customer_id", pl.col("primary_email").alias("customer_email")
        )
        if "primary_email" in due.columns
        else due.clear().select("customer_id", "customer_email")
    )
    held = pl.concat([
        due.filter(pl.col("hold") == HoldReason.SUPPRESSED).select("customer_id", "customer_email"),
        due.join(at_claim, on="idempotency_key", how="semi").select("customer_id", "customer_email"),
        replaced,
    ]).select("customer_id", pl.col("customer_email").str.to_lowercase().alias("email")).drop_nulls()  # fmt: skip
    new = ledger.new_suppression_alerts(held, at)
    for customer_id, email in new.select("customer_id", "email").iter_rows():
        message = (
            f"customer {customer_id}: {email} is suppressed (a hard bounce, a complaint or an operator); their "
            "reminders wait until the customer has a working address (`dunning status`, `dunning unsuppress`)"
        )
        details = {"customer_id": customer_id, "email": email}
        raise_alert(ledger, config.alerts, Alert(CONTACT_SUPPRESSED, message, at, run_id, details, severity="warning"))
    return new.height


def escalation_policies(ledger: Ledger, handovers: pl.DataFrame, settle: pl.DataFrame) -> set[str]:
    """The policies whose escalation endpoint this send step may call: of the escalations due, and of the `unknown`
    ones it may resubmit."""
    policies = set(handovers.get_column("policy").drop_nulls().to_list()) if handovers.height else set()
    if settle.height:
        policies |= escalating.kept_policies(ledger, settle)
    return policies


FIRST_SHOWN = 10


def first_sent(
    due: pl.DataFrame, outcomes: pl.DataFrame, config: DunningConfig, clock: CycleClock, ids: MessageIds,
    limit: int = FIRST_SHOWN,
) -> list[tuple[str, str]]:  # fmt: skip
    """The recipient and subject of the first `limit` emails this run sent, for the summary a person reads:
    rendered again from their rows (a few milliseconds), not carried through the send loop."""
    sent = outcomes.filter(pl.col("status") == "sent").get_column("idempotency_key")
    if sent.is_empty():
        return []
    rows = due.filter(pl.col("idempotency_key").is_in(sent.implode()))
    settings = render_settings(config, clock.as_of)
    shown: list[tuple[str, str]] = []
    for _, group in rows.group_by("email_group", maintain_order=True):
        if len(shown) == limit:
            break
        records = with_email_ids(group, config, ids).to_dicts()  # the ids of the emails shown only
        try:
            draft = draft_for(records, sender=settings.sender, as_of=clock.as_of, locale=settings.locale,
                              templates_dir=settings.templates_for(records))  # fmt: skip
        except Exception:  # noqa: BLE001 - only for the summary: an email that cannot be shown is left out
            continue
        shown.append((str(draft.to), str(draft.subject)))
    return shown

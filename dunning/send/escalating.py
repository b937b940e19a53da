"""Escalations held to the email path's rules: claimed with their bodies, posted one at a time, each outcome written
as it arrives (guarantee 16; `dunning.send.escalation` is the request and what its answer means).

One hand-over, in the email path's order (`dunning.send.handover`):

1. the claim, with the request's body kept in the same transaction (`Ledger.claim(bodies=...)`), this run's journal
   started before it (so a run that dies right after its claim leaves a journal that names none of them);
2. a journal line naming it (`HOME/journal/{run_id}.journal`), then the lease check;
3. the request;
4. its outcome, recorded at once (a definite answer drops the body, in the same transaction).

So a run killed anywhere leaves each key in a state the next run can read: answered keys are recorded; the key in
flight is in the journal, becomes `unknown` and is resubmitted (same body, same key, a fresh signature); claims the
journal does not name never left, become `failed` without counting an attempt, and are posted by the next run at
once, their kept bodies as claimed (no backoff: they were never refused). A `failed` escalation with a kept body is
exactly that: released without an answer.

One request at a time, on purpose: escalations are the few invoices a day that cross `after_days`, a collections
system's API is rate-limited more often than not, and one request in flight means the journal and the lease decide
about at most one key whose fate is in doubt.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl

from dunning.config import DunningConfig
from dunning.errors import LedgerLost
from dunning.ledger.base import Ledger
from dunning.ledger.stores.payloads import PAYLOAD_SCHEMA
from dunning.send.escalation import (
    OUTCOME_SCHEMA,
    PROVIDER,
    Answer,
    Webhook,
    body_of,
    policy_of,
    reminders_by_invoice,
)
from dunning.send.handover import Deadline, HandOverGate, open_journal, remove_journal
from dunning.storage_faults import storage_fault_of
from dunning.vocabulary import EmailKind, LedgerStatus, SendStatus

OutcomeRow = tuple[str, str, str | None, str | None, float | None]  # one OUTCOME_SCHEMA row
LEASE_ENDED = "not handed over: this run's claim lease ended first (another run may take it over); retried"


@dataclass
class EscalationReport:
    claimed: int = 0
    sent: int = 0
    failed: int = 0
    unknown: int = 0
    resubmitted: int = 0  # `unknown` ones of earlier runs posted again
    retried: int = 0  # released ones of a run that ended before their request left, posted now
    held: dict[str, int] = field(default_factory=dict)
    refused: int = 0  # refused for good in this run: one alert each

    def count(self, status: SendStatus) -> None:
        if status == SendStatus.SENT:
            self.sent += 1
        elif status in (SendStatus.FAILED, SendStatus.RELEASED):
            self.failed += 1
        else:
            self.unknown += 1


@dataclass(frozen=True)
class _Request:
    key: str
    message_id: str | None
    body: bytes
    hook: Webhook


class _HandOvers:
    """This run's escalation requests: journaled, within the claims' lease, each outcome recorded as it arrives."""

    def __init__(
        self, ledger: Ledger, config: DunningConfig, *, run_id: str, as_of: dt.datetime,
        now: Callable[[], dt.datetime], journal_dir: str | None,
    ) -> None:  # fmt: skip
        self.ledger, self.run_id, self.as_of, self.now = ledger, run_id, as_of, now
        self.backoff = config.retry.backoff_minutes
        self.lease = dt.timedelta(minutes=config.claim_lease_minutes)
        self.journal_dir = journal_dir
        self.deadline = Deadline()
        self.gate: HandOverGate | None = None
        self.renewed_at = now()
        self.first_claimed: dt.datetime | None = None
        self.outstanding: set[str] = set()
        self.journal: str | None = None

    def open_journal(self) -> None:
        """Start this run's journal before its first claim (the email path's was removed at its end): a run that
        dies after claiming leaves a journal that names none of them, so its claims are released, not `unknown`."""
        if self.journal is None and self.journal_dir is not None:
            self.journal = str(open_journal(self.journal_dir, self.run_id))

    def lease_until(self) -> dt.datetime:
        """A lease for claims taken now; the first one taken is the deadline's (`start`)."""
        self.renewed_at = self.now()
        self.first_claimed = min(self.first_claimed or self.renewed_at, self.renewed_at)
        return self.renewed_at + self.lease

    def start(self, keys: set[str]) -> None:
        """The claims are taken: hand over until the earliest of their leases ends, each request journaled first."""
        self.outstanding = set(keys)
        first = self.first_claimed or self.renewed_at
        self.deadline.until(first + self.lease, self.lease, self.now())
        self.open_journal()
        self.gate = HandOverGate(self.deadline, self.journal)

    def hand_over(self, request: _Request) -> Answer:
        assert self.gate is not None
        self._renew()
        if not self.gate.may_hand_over(request.message_id or request.key):
            return Answer(SendStatus.RELEASED, LEASE_ENDED)
        return request.hook.post(request.key, request.body, self.now())

    def record(self, request: _Request, answer: Answer) -> OutcomeRow:
        """One outcome, at once; a definite answer drops the body in the same transaction (a kept body on a `failed`
        key means: released, never answered). An outcome that no longer applies (another run expired this run's claim
        meanwhile, and settles the key now) leaves the body to that run."""
        row: OutcomeRow = (request.key, str(answer.status), request.message_id, answer.error,
                           answer.retry_after_seconds)  # fmt: skip
        with self.ledger.transaction():
            recorded = self.ledger.record_outcomes(
                pl.DataFrame([row], schema=OUTCOME_SCHEMA, orient="row"), self.as_of, self.now(), self.backoff,
                run_id=self.run_id,
            )  # fmt: skip
            if recorded and answer.status in (SendStatus.SENT, SendStatus.FAILED):
                self.ledger.drop_escalation_bodies([request.key])
        self.outstanding.discard(request.key)
        return row

    def _renew(self) -> None:
        if self.now() - self.renewed_at < self.lease / 3:
            return
        until = self.lease_until()
        if self.ledger.renew_leases(self.run_id, until):
            self.deadline.until(until, self.lease, self.renewed_at)
        else:  # another run expired our claims: it settles them; nothing more is posted
            self.deadline.stop()

    def close(self, completed: bool) -> None:
        if self.gate is not None:
            self.gate.close()
        if completed and self.journal_dir is not None and self.journal is not None:
            remove_journal(self.journal_dir, self.run_id)  # every outcome is recorded


def hand_over_escalations(
    ledger: Ledger, due: pl.DataFrame, settle: pl.DataFrame, config: DunningConfig, hooks: dict[str, Webhook], *,
    run_id: str, as_of: dt.datetime, now: Callable[[], dt.datetime], journal_dir: str | None = None,
) -> tuple[EscalationReport, pl.DataFrame]:  # fmt: skip
    """Claim `due` (the plan's due and retried escalations) with their bodies, take back the released ones among
    `settle` (claimed by a run that died before their request left), post each, record each. Returns the report and
    one outcome row per key."""
    report = EscalationReport()
    loop = _HandOvers(ledger, config, run_id=run_id, as_of=as_of, now=now, journal_dir=journal_dir)
    rows: list[OutcomeRow] = []
    requests: list[_Request] = []
    if due.height:
        loop.open_journal()
        history = reminders_by_invoice(ledger, due)
        bodies = {
            str(r["idempotency_key"]): body_of(r, history.get((str(r["invoice_id"]), int(r["cycle"])), []))
            for r in due.to_dicts()
        }
        kept = pl.DataFrame(
            [(k, k, PROVIDER, b.decode("utf-8"), now()) for k, b in bodies.items()], schema=PAYLOAD_SCHEMA,
            orient="row",
        )  # fmt: skip
        claim = ledger.claim(due, due.clear(), run_id, as_of, None, lease_until=loop.lease_until(), bodies=kept)
        rows += [(k, str(SendStatus.LOST), None, "claimed by another run", None)
                 for k in sorted(set(bodies) - claim.won)]  # fmt: skip
        for r in due.filter(pl.col("idempotency_key").is_in(sorted(claim.won))).to_dicts():
            key = str(r["idempotency_key"])
            requests.append(_Request(key, r["message_id"], bodies[key], hooks[str(r["policy"])]))
        report.claimed = len(claim.won)
    retaken = _released(ledger, settle, hooks)
    if retaken:
        loop.open_journal()
        won = ledger.retake_released([r.key for r in retaken], run_id, as_of, loop.lease_until())
        retaken = [r for r in retaken if r.key in won]
        requests += retaken
        report.retried = len(retaken)
    if not requests:
        loop.close(True)  # a journal opened for claims all lost to other runs names nothing
        return report, pl.DataFrame(rows, schema=OUTCOME_SCHEMA, orient="row")
    loop.start({r.key for r in requests})
    completed = False
    try:
        for request in requests:
            answer = loop.hand_over(request)
            report.count(answer.status)
            rows.append(loop.record(request, answer))
        completed = True
    except BaseException as error:
        loop.deadline.stop()
        if isinstance(error, ledger.database_errors) and storage_fault_of(error) is None:
            raise LedgerLost(_lost(ledger, error, len(loop.outstanding))) from error
        raise
    finally:
        loop.close(completed)
    return report, pl.DataFrame(rows, schema=OUTCOME_SCHEMA, orient="row")


def _lost(ledger: Ledger, error: BaseException, outstanding: int) -> str:
    why = (str(error).strip().splitlines() or [""])[0][:200]
    return (
        f"{ledger.label} failed while handing escalations over ({type(error).__name__}: {why}); nothing more was "
        f"posted. {outstanding} escalation(s) have no outcome on record: the next run reads this run's journal, "
        "resubmits the one that may have left and posts those that never did; `dunning status` lists any left for "
        "a human"
    )


def _released(ledger: Ledger, settle: pl.DataFrame, hooks: dict[str, Webhook]) -> list[_Request]:
    """The escalations among `settle` (claimed or unknown when the plan ran) that are `failed` now with their body
    kept: a dead run's claims its journal shows never left (its claims were expired in this send step). Those the
    present allows (`hold` null) and whose policy still escalates are posted again, as they were claimed."""
    if settle.is_empty():
        return []
    allowed = settle.filter(pl.col("hold").is_null())  # the ledger keeps the escalations among them
    found = ledger.released_escalations(allowed.get_column("idempotency_key").to_list()) if allowed.height else None
    if found is None or found.is_empty():
        return []
    return [
        _Request(str(r["idempotency_key"]), r["message_id"], str(r["payload"]).encode("utf-8"), hook)
        for r in found.to_dicts()
        if (hook := hooks.get(policy_of(str(r["payload"])))) is not None
    ]


def _kept(ledger: Ledger, settle: pl.DataFrame, include_claimed: bool = False) -> pl.DataFrame:
    pending = ledger.unknown_sends(include_claimed).filter(
        (pl.col("kind") == EmailKind.ESCALATION) & (pl.col("provider") == PROVIDER) & pl.col("payload").is_not_null()
    )
    return pending.join(settle.select("idempotency_key", "hold"), on="idempotency_key", how="inner")


def kept_policies(ledger: Ledger, settle: pl.DataFrame) -> set[str]:
    """The policies of the escalations among `settle` whose body is kept, `unknown` or still claimed (a dead run's,
    expired in the send step): their endpoints may be called."""
    return {policy_of(p) for p in _kept(ledger, settle, include_claimed=True).get_column("payload").to_list()}


def resubmit_unknown(
    ledger: Ledger, settle: pl.DataFrame, config: DunningConfig, hooks: dict[str, Webhook], *, run_id: str,
    now: Callable[[], dt.datetime],
) -> EscalationReport:  # fmt: skip
    """Settle `unknown` escalations: each kept body is posted again under its key, with a fresh signature, when the
    present allows (`settle`: the plan's settle rows with their `hold`); otherwise it stays `unknown`, the reason
    kept for a human. Each answer is recorded as it arrives."""
    report = EscalationReport()
    pending = _kept(ledger, settle)
    held: list[tuple[str, str | None, str | None]] = []
    for row in pending.to_dicts():
        key, body = str(row["idempotency_key"]), str(row["payload"]).encode("utf-8")
        hook = hooks.get(policy_of(str(row["payload"])))
        if row["hold"] is not None or hook is None:
            why = row["hold"] or "its policy no longer escalates"
            held.append((key, why, f"not resubmitted: {why}; still unknown"))
            report.held[why] = report.held.get(why, 0) + 1
            continue
        answer = hook.post(key, body, now())
        if answer.status == SendStatus.UNKNOWN:
            held.append((key, None, f"resubmitted under its idempotency key: still no answer ({answer.error})"[:500]))
            report.unknown += 1
            continue
        report.resubmitted += 1
        report.count(answer.status)
        frame = pl.DataFrame(
            [(key, str(answer.status), row["message_id"], f"resubmitted under its idempotency key: {answer.status}"
              + (f" ({answer.error})" if answer.error else ""), answer.retry_after_seconds)],
            schema=OUTCOME_SCHEMA, orient="row",
        )  # fmt: skip
        with ledger.transaction():
            ledger.record_outcomes(frame, None, now(), config.retry.backoff_minutes,
                                   expected_status=LedgerStatus.UNKNOWN, settled_by=run_id)  # fmt: skip
            ledger.drop_escalation_bodies([key])
    if held:
        ledger.hold_unknown(pl.DataFrame(held, schema=["email_id", "held_reason", "note"], orient="row"))
    return report

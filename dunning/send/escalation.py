"""The hand-over to a collections system: a signed webhook, claimed in the ledger before the request, once per
invoice and cycle, with the three outcomes (guarantee 16).

The request is a POST of JSON with `Idempotency-Key: escalation:{invoice_id}:{cycle}` (the receiver dedupes on it)
and `Dunning-Signature: t={unix seconds},v1={hex HMAC-SHA256(secret, "{t}.{body}")}`, the secret read from the
environment variable `escalation.secret_env` names. What its answer means:

| answer | outcome | next |
|---|---|---|
| 2xx | `sent` | never again |
| 408, 429, 5xx | `failed` | retried after the backoff (a 429's `Retry-After` when later) |
| any other 4xx or 3xx | `failed` | not retried: the receiver refused it; a human looks (`open_problems`) |
| refused, unresolvable, connect timeout | `failed` | retried after the backoff: it never left |
| read timeout, connection lost after it left | `unknown` | resubmitted by a later run: same body, same key, fresh `t` |

A resubmission is judged against the present like an email's (`dunning.send.resubmission.settle_rows`): while paused
nothing is sent (the send step stops first), and an invoice paid, void or excluded since keeps its escalation
`unknown` with the reason, for a human.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl
import requests

from dunning.config import DunningConfig
from dunning.config_schedule import Escalation
from dunning.ledger.base import Ledger
from dunning.ledger.stores.payloads import PAYLOAD_SCHEMA
from dunning.secret_env import read_secret, scrub
from dunning.send.providers.http import may_have_left, retry_after_seconds
from dunning.vocabulary import EmailKind, LedgerStatus, SendStatus

SIGNATURE_HEADER = "Dunning-Signature"
PROVIDER = "escalation"  # `provider_payloads.provider` of a kept hand-over
EVENT_TYPE = "dunning.escalation"
RETRIED = frozenset({408, 429})
NO_RETRY_SECONDS = 100 * 365 * 24 * 3600.0  # a refusal: its `next_attempt_at` is past any run (a human looks)
OUTCOME_SCHEMA = pl.Schema(
    {
        "idempotency_key": pl.String, "status": pl.String, "message_id": pl.String, "error": pl.String,
        "retry_after_seconds": pl.Float64,
    }
)  # fmt: skip


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """`t={timestamp},v1={hex HMAC-SHA256(secret, "{timestamp}.{body}")}`: what a receiver recomputes and compares,
    refusing a timestamp too far from its own clock."""
    mac = hmac.new(secret.encode("utf-8"), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def body_of(row: dict[str, object], reminders: list[dict[str, object]]) -> bytes:
    """The hand-over's JSON: the invoice, what it owes, its policy, and each reminder it had in the cycle."""
    document = {
        "type": EVENT_TYPE,
        "idempotency_key": row["idempotency_key"],
        "invoice_id": row["invoice_id"],
        "customer_id": row["customer_id"],
        "cycle": row["cycle"],
        "currency": row["currency"],
        "amount_remaining_minor": row["amount_minor"],
        "days_overdue": row["days_overdue"],
        "due_date": str(row["due_date"]) if row.get("due_date") is not None else None,
        "policy": row.get("policy") or "default",
        "reminders": reminders,
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@dataclass(frozen=True)
class Answer:
    status: SendStatus
    error: str | None = None
    retry_after_seconds: float | None = None


class Webhook:
    """One policy's escalation endpoint, its secret read when it is built (a missing variable: ConfigError naming
    it, before anything is claimed)."""

    def __init__(self, rule: Escalation, key: str, session: requests.Session | None = None):
        self.rule = rule
        self.secret = read_secret(rule.secret_env, key)
        self.session = session or requests.Session()

    def post(self, idempotency_key: str, body: bytes, wall: dt.datetime) -> Answer:
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": idempotency_key,
            SIGNATURE_HEADER: signature(self.secret, int(wall.timestamp()), body),
            "User-Agent": "dunning-pipeline",
        }
        try:
            response = self.session.post(
                self.rule.webhook_url, data=body, headers=headers, timeout=self.rule.timeout_seconds,
                allow_redirects=False,
            )  # fmt: skip
        except requests.RequestException as exc:
            text = scrub(f"{type(exc).__name__}: {exc}")[:300]
            if may_have_left(exc):
                return Answer(SendStatus.UNKNOWN, f"no answer after the request left: {text}")
            return Answer(SendStatus.FAILED, f"not delivered (never left): {text}")
        code = response.status_code
        if 200 <= code < 300:
            return Answer(SendStatus.SENT)
        if code in RETRIED or code >= 500:
            wait = retry_after_seconds(response.headers)
            return Answer(SendStatus.FAILED, f"HTTP {code}: retried after the backoff", wait)
        return Answer(SendStatus.FAILED, f"HTTP {code}: refused by the receiver, not retried", NO_RETRY_SECONDS)


def webhooks(config: DunningConfig, policies: set[str]) -> dict[str, Webhook]:
    """The endpoint of each policy in `policies` that escalates, secrets read now."""
    built = {}
    for index, policy in enumerate(config.resolved_policies()):
        if policy.name in policies and policy.escalation is not None:
            where = "escalation" if policy.name == "default" else f"policies[{index}] ({policy.name}).escalation"
            built[policy.name] = Webhook(policy.escalation, f"{where}.secret_env")
    return built


@dataclass
class EscalationReport:
    claimed: int = 0
    sent: int = 0
    failed: int = 0
    unknown: int = 0
    resubmitted: int = 0
    held: dict[str, int] = field(default_factory=dict)


def send_escalations(
    ledger: Ledger, due: pl.DataFrame, hooks: dict[str, Webhook], *, run_id: str, as_of: dt.datetime,
    now: Callable[[], dt.datetime], backoff_minutes: float, lease: dt.timedelta,
) -> tuple[EscalationReport, pl.DataFrame]:  # fmt: skip
    """Claim each due escalation (one transaction), then post those this run won and record each outcome; an
    `unknown` one keeps its body for a later run to resubmit. Returns the report and one outcome row per key."""
    report = EscalationReport()
    if due.is_empty():
        return report, pl.DataFrame(schema=OUTCOME_SCHEMA)
    claim = ledger.claim(due, due.clear(), run_id, as_of, None, lease_until=now() + lease)
    won = due.filter(pl.col("idempotency_key").is_in(sorted(claim.won)))
    report.claimed = won.height
    rows: list[tuple[str, str, str | None, str | None, float | None]] = [
        (k, str(SendStatus.LOST), None, "claimed by another run", None)
        for k in sorted(set(due.get_column("idempotency_key")) - claim.won)
    ]
    history = _reminders_by_invoice(ledger, won)
    payloads: list[tuple[str, str, str, str, dt.datetime]] = []
    for row in won.to_dicts():
        key = str(row["idempotency_key"])
        body = body_of(row, history.get((str(row["invoice_id"]), int(row["cycle"])), []))
        answer = hooks[str(row["policy"])].post(key, body, now())
        _count(report, answer.status)
        rows.append((key, str(answer.status), row["message_id"], answer.error, answer.retry_after_seconds))
        if answer.status == SendStatus.UNKNOWN:
            payloads.append((key, key, PROVIDER, body.decode("utf-8"), now()))
    outcomes = pl.DataFrame(rows, schema=OUTCOME_SCHEMA, orient="row")
    ledger.keep_payloads(pl.DataFrame(payloads, schema=PAYLOAD_SCHEMA, orient="row"))
    ledger.record_outcomes(outcomes, as_of, now(), backoff_minutes, run_id=run_id)
    return report, outcomes


def _count(report: EscalationReport, status: SendStatus) -> None:
    if status == SendStatus.SENT:
        report.sent += 1
    elif status == SendStatus.FAILED:
        report.failed += 1
    else:
        report.unknown += 1


def _reminders_by_invoice(ledger: Ledger, rows: pl.DataFrame) -> dict[tuple[str, int], list[dict[str, object]]]:
    if rows.is_empty():
        return {}
    grouped: dict[tuple[str, int], list[dict[str, object]]] = {}
    for r in ledger.reminders_of(rows.select("invoice_id", "cycle")).to_dicts():
        sent_at = r["sent_at"]
        grouped.setdefault((str(r["invoice_id"]), int(r["cycle"])), []).append(
            {"stage": r["stage"], "sent_at": sent_at.isoformat() if isinstance(sent_at, dt.datetime) else None}
        )
    return grouped


def _kept(ledger: Ledger, settle: pl.DataFrame) -> pl.DataFrame:
    pending = ledger.unknown_sends().filter(
        (pl.col("kind") == EmailKind.ESCALATION) & (pl.col("provider") == PROVIDER) & pl.col("payload").is_not_null()
    )
    return pending.join(settle.select("idempotency_key", "hold"), on="idempotency_key", how="inner")


def _policy_of(payload: str) -> str:
    return str(json.loads(payload).get("policy") or "default")


def kept_policies(ledger: Ledger, settle: pl.DataFrame) -> set[str]:
    """The policies of the `unknown` escalations among `settle` whose body is kept: their endpoints may be called."""
    return {_policy_of(p) for p in _kept(ledger, settle).get_column("payload").to_list()}


def resubmit_unknown(
    ledger: Ledger, settle: pl.DataFrame, config: DunningConfig, hooks: dict[str, Webhook], *, run_id: str,
    now: Callable[[], dt.datetime],
) -> EscalationReport:  # fmt: skip
    """Settle `unknown` escalations: each kept body is posted again under its key, with a fresh signature, when the
    present allows (`settle`: the plan's settle rows with their `hold`); otherwise it stays `unknown`, the reason
    kept for a human."""
    report = EscalationReport()
    pending = _kept(ledger, settle)
    if pending.is_empty():
        return report
    answers: list[tuple[str, str, str | None, str | None, float | None]] = []
    held: list[tuple[str, str | None, str | None]] = []
    for row in pending.to_dicts():
        key, body = str(row["idempotency_key"]), str(row["payload"]).encode("utf-8")
        hook = hooks.get(_policy_of(str(row["payload"])))
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
        _count(report, answer.status)
        answers.append((key, str(answer.status), row["message_id"], answer.error, answer.retry_after_seconds))
    if answers:
        frame = pl.DataFrame(answers, schema=OUTCOME_SCHEMA, orient="row")
        ledger.record_outcomes(frame, None, now(), config.retry.backoff_minutes, expected_status=LedgerStatus.UNKNOWN,
                               settled_by=run_id)  # fmt: skip
        ledger.drop_payloads([a[0] for a in answers])
    if held:
        ledger.hold_unknown(pl.DataFrame(held, schema=["email_id", "held_reason", "note"], orient="row"))
    return report

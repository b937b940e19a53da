"""The hand-over to a collections system: a signed webhook, claimed in the ledger before the request, once per
invoice and cycle, with the three outcomes (guarantee 16). This module is the request and what its answer means;
`dunning.send.escalating` claims, posts one at a time and records.

The request is a POST of JSON with `Idempotency-Key: escalation:{invoice_id}:{cycle}` (the receiver dedupes on it)
and `Dunning-Signature: t={unix seconds},v1={hex HMAC-SHA256(secret, "{t}.{body}")}`, the secret read from the
environment variable `escalation.secret_env` names. What its answer means:

| answer | outcome | next |
|---|---|---|
| 2xx | `sent` | never again |
| 408, 429, 5xx | `failed` | retried after the backoff (a 429's `Retry-After` when later), up to `retry.max_attempts` |
| any other 4xx or 3xx | `failed` | refused for good at once, not retried |
| refused, unresolvable, connect timeout | `failed` | retried after the backoff: it never left |
| read timeout, connection lost after it left | `unknown` | resubmitted by a later run: same body, same key, fresh `t` |

Refused for good (a 4xx, or the attempts used up): one alert of kind `escalation_refused`, the invoice listed by
`dunning status` and its reminders held until a human answers (`dunning.send.escalation_refusals`,
`dunning.ledger.stores.escalation_store`: `dunning retry`, `dunning resolve`).

The webhook URL's path and query carry the receiver's token: an error text never holds them. What `requests`
says is cut (`safe_text.redact`: URLs to their host, urllib3's `url: /path` too), and the URL's own path and query
are masked wherever they still appear, so the ledger, the alerts and the analysts' copy name the host only.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import polars as pl

from dunning.config import DunningConfig, Escalation
from dunning.ledger.base import Ledger
from dunning.safe_text import redact
from dunning.secret_env import read_secret, scrub
from dunning.send.providers.http import may_have_left, retry_after_seconds
from dunning.urls import token_parts
from dunning.vocabulary import SendStatus

if TYPE_CHECKING:  # imported where a webhook is built: a process that posts nothing does not load it (0.1 s)
    import requests

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


def recordable(text: str, url: str) -> str:
    """An error text as it may be stored or shown: secrets masked, URLs cut to their host, and whatever is left of
    the webhook URL's path or query masked."""
    text = redact(scrub(text))
    for part in token_parts(url):
        text = text.replace(part, "…")
    return text


class Webhook:
    """One policy's escalation endpoint, its secret read when it is built (a missing variable: ConfigError naming
    it, before anything is claimed)."""

    def __init__(self, rule: Escalation, key: str, session: requests.Session | None = None):
        self.rule = rule
        import requests

        self.secret = read_secret(rule.secret_env, key)
        self.session = session or requests.Session()
        self.host = urlsplit(rule.webhook_url).hostname or "the receiver"

    def post(self, idempotency_key: str, body: bytes, wall: dt.datetime) -> Answer:
        import requests

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
            text = recordable(f"{type(exc).__name__}: {exc}", self.rule.webhook_url)[:300]
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


class SimulatedWebhook(Webhook):
    """A policy's endpoint in a simulation (the resume guard's double pass): every hand-over is answered `sent`,
    nothing is posted and no secret is read."""

    def __init__(self, rule: Escalation, key: str, session: requests.Session | None = None):
        self.rule, self.secret, self.host = rule, "", "a simulation"

    def post(self, idempotency_key: str, body: bytes, wall: dt.datetime) -> Answer:
        return Answer(SendStatus.SENT)


def webhooks(config: DunningConfig, policies: set[str], simulated: bool = False) -> dict[str, Webhook]:
    """The endpoint of each policy in `policies` that escalates, secrets read now (`simulated`: none read, none
    called)."""
    built: dict[str, Webhook] = {}
    endpoint = SimulatedWebhook if simulated else Webhook
    for index, policy in enumerate(config.resolved_policies()):
        if policy.name in policies and policy.escalation is not None:
            where = "escalation" if policy.name == "default" else f"policies[{index}] ({policy.name}).escalation"
            built[policy.name] = endpoint(policy.escalation, f"{where}.secret_env")
    return built


def policy_of(payload: str) -> str:
    """The policy a kept body names: whose endpoint posts it again."""
    return str(json.loads(payload).get("policy") or "default")


def reminders_by_invoice(ledger: Ledger, rows: pl.DataFrame) -> dict[tuple[str, int], list[dict[str, object]]]:
    """The stage and `sent_at` of each reminder of the cycles of `rows` (`invoice_id`, `cycle`), for their bodies."""
    if rows.is_empty():
        return {}
    grouped: dict[tuple[str, int], list[dict[str, object]]] = {}
    for r in ledger.reminders_of(rows.select("invoice_id", "cycle")).to_dicts():
        sent_at = r["sent_at"]
        grouped.setdefault((str(r["invoice_id"]), int(r["cycle"])), []).append(
            {"stage": r["stage"], "sent_at": sent_at.isoformat() if isinstance(sent_at, dt.datetime) else None}
        )
    return grouped

"""Escalations refused for good: one alert each, and the invoice left in front of a human, never silently out of
collections.

"For good" is a 4xx (or 3xx) answer, not retried, or a retried failure (408, 429, 5xx, a request that never left)
whose `retry.max_attempts` are used up. Each run that sends marks such keys (`refused_at`) and raises one alert of
kind `escalation_refused` per refusal: the alert's id is written on the key's row in the same transaction as the
alert, so two runs, or a run that died after marking, never raise a second one; a key put back by `dunning retry`
and refused again raises a new one. Until a human answers, `dunning status` lists the invoice and its reminders wait
(audit reason `escalation_refused`, `dunning.plan.escalation`): the collections system does not have it, and an
outage of the receiver is no reason to start writing to the customer again on our own.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from urllib.parse import urlsplit

from dunning.config import DunningConfig
from dunning.ledger.base import Ledger
from dunning.send.alerts import Alert, deliver_stored, masked

ESCALATION_REFUSED = "escalation_refused"


def _hosts(config: DunningConfig) -> dict[str, str]:
    return {
        p.name: urlsplit(p.escalation.webhook_url).hostname or "the receiver"
        for p in config.resolved_policies()
        if p.escalation is not None
    }


def refusal_message(row: dict[str, object], host: str) -> str:
    """What the alert says: the invoice, the answer, what to do."""
    key = row["idempotency_key"]
    return (
        f"escalation {key} of invoice {row['invoice_id']} (customer {row['customer_id']}, {row['amount_minor']} "
        f"{row['currency']} in minor units) was refused for good by {host} after {row['attempts']} attempt(s) (last "
        f"answer: {row['last_error'] or 'none recorded'}). It is not retried and the invoice's reminders wait (audit "
        f"reason escalation_refused). Fix the cause, then `dunning retry {key}`; or `dunning resolve {key} --sent` "
        "if it was handed over another way, `--not-sent` to give the invoice back to its reminders"
    )


def page_refusals(
    ledger: Ledger, config: DunningConfig, *, run_id: str, as_of: dt.datetime, logger: logging.Logger | None = None
) -> int:
    """Mark the escalations refused for good now, and raise the one alert of each refusal not paged yet (also one
    marked by a run that died before paging). Returns the alerts raised."""
    ledger.mark_refused_escalations(config.retry.max_attempts, as_of)
    pending = ledger.refusals_to_page()
    hosts = _hosts(config)
    raised = 0
    for row in pending.to_dicts():
        key = str(row["idempotency_key"])
        alert = masked(
            Alert(
                ESCALATION_REFUSED,
                refusal_message(row, hosts.get(str(row["policy"]), "the collections system")),
                as_of,
                run_id,
                {k: row[k] for k in ("idempotency_key", "invoice_id", "customer_id", "policy", "attempts")}
                | {"answer": row["last_error"]},
                severity="error",
                dedup_key=f"dunning-escalation-refused-{key}-{row['refused_at']}"[:250],  # a new refusal: a new page
            )
        )
        alert_id = uuid.uuid4().hex
        with ledger.transaction():
            if not ledger.take_refusal_alert(key, alert_id):
                continue  # another run paged it first
            ledger.add_alert(alert.kind, alert.message, alert.created_at, run_id, alert.details, alert.severity,
                             alert_id=alert_id)  # fmt: skip
        deliver_stored(ledger, config.alerts, alert, alert_id, logger)
        raised += 1
    return raised

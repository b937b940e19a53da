"""Paging a human: every alert is stored, logged, and delivered to the configured backends.

Backends: the log (always), a generic JSON webhook (`{"text": ...}` plus the
details, which Slack's incoming webhooks accept; the text with Slack's `&`, `<`
and `>` escaped, so quoted data is never markup), and PagerDuty's Events API v2
(the documented `enqueue` payload; the routing key is read from the environment
variable the config names, never from the file). A delivery failure of any
kind is recorded on the alert and logged, with URLs cut to their host and the
routing key masked; it never changes the halt or its exit code.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from dunning.config import Alerts
from dunning.errors import ConfigError
from dunning.ledger.base import AlertStore
from dunning.safe_text import redact
from dunning.secret_env import holding_any, read_secret, scrub

log = logging.getLogger("dunning.send.alerts")


@dataclass(frozen=True)
class Alert:
    kind: str
    message: str
    created_at: dt.datetime
    run_id: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    severity: str = "critical"
    dedup_key: str | None = None


def _post_json(url: str, payload: dict[str, Any], timeout: float) -> None:
    request = urllib.request.Request(
        url, data=json.dumps(payload, default=str).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (configured URL)
        if response.status >= 300:
            raise urllib.error.HTTPError(url, response.status, "unexpected status", response.headers, None)


def slack_text(text: str) -> str:
    """`text` with the three characters Slack's message markup reads escaped (`&`, `<`, `>`): a message quoting a
    customer's subject or reply can never become `<!channel>` or a disguised link in the channel."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def webhook_payload(alert: Alert) -> dict[str, Any]:
    return {
        "text": slack_text(f"[dunning] {alert.kind}: {alert.message}"),
        "kind": alert.kind,
        "severity": alert.severity,
        "run_id": alert.run_id,
        "created_at": alert.created_at.isoformat(),
        "details": alert.details,
    }


def pagerduty_payload(alert: Alert, routing_key: str) -> dict[str, Any]:
    return {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": alert.dedup_key or f"dunning-{alert.kind}-{alert.run_id}",
        "payload": {
            "summary": f"dunning {alert.kind}: {alert.message}"[:1024],
            "source": "dunning-pipeline",
            "severity": alert.severity if alert.severity in ("critical", "error", "warning", "info") else "critical",
            "timestamp": alert.created_at.isoformat(),
            "custom_details": alert.details,
        },
    }


def _attempt(backend: str, url: str, payload: dict[str, Any], settings: Alerts, secrets: tuple[str, ...] = ()) -> str:
    try:
        _post_json(url, payload, settings.timeout_seconds)
    except Exception as exc:  # noqa: BLE001 - paging must never turn a halt into a crash
        reason = redact(f"{type(exc).__name__}: {exc}", secrets)
        log.error("%s delivery failed: %s", backend, reason)
        return f"{backend}: failed ({reason})"
    return f"{backend}: ok"


def deliver(alert: Alert, settings: Alerts, logger: logging.Logger | None = None) -> list[str]:
    """Send `alert` to every configured backend; returns what happened per backend, for the alerts table."""
    (logger or log).warning("ALERT %s: %s", alert.kind, alert.message)
    results = ["log: ok"]
    if settings.webhook_url:
        results.append(_attempt("webhook", settings.webhook_url, webhook_payload(alert), settings))
    if settings.pagerduty_routing_key_env:
        try:
            key = read_secret(settings.pagerduty_routing_key_env, "alerts.pagerduty_routing_key_env")
        except ConfigError as error:
            results.append(f"pagerduty: not sent ({error})")
        else:
            results.append(
                _attempt("pagerduty", settings.pagerduty_url, pagerduty_payload(alert, key), settings, (key,))
            )
    return results


def masked(alert: Alert) -> Alert:
    """`alert` with its text and details masked of every secret this process holds (`secret_env.scrub`)."""
    if not holding_any():
        return alert
    details = json.loads(scrub(json.dumps(alert.details, default=str))) if alert.details else alert.details
    return dataclasses.replace(alert, message=scrub(alert.message), details=details)


def deliver_stored(
    ledger: AlertStore, settings: Alerts, alert: Alert, alert_id: str, logger: logging.Logger | None = None
) -> None:
    """Deliver an alert already stored (masked) under `alert_id`, and record where it went. Inside a simulation
    (its row is rolled back) nothing is delivered: a page cannot be taken back, and the real run raises it again."""
    if getattr(ledger, "simulating", False):
        return
    ledger.mark_alert_delivered(alert_id, "; ".join(deliver(alert, settings, logger)))


def raise_alert(ledger: AlertStore, settings: Alerts, alert: Alert, logger: logging.Logger | None = None) -> str:
    """Store the alert, deliver it, and record where it went; its text and details masked of every secret this
    process holds first (`secret_env.scrub`), so no backend, log or table gets one. Returns the alert id."""
    alert = masked(alert)
    alert_id = ledger.add_alert(
        alert.kind, alert.message, alert.created_at, alert.run_id, alert.details, alert.severity
    )
    deliver_stored(ledger, settings, alert, alert_id, logger)
    return alert_id

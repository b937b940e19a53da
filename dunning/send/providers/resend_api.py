"""Resend's HTTP email API through the official `resend` SDK, with an `Idempotency-Key` on every send.

Resend answers a repeated `Idempotency-Key` with the first request's result for
24 hours instead of sending again. That turns the one case SMTP leaves to a
human, a request that left but whose answer never came, into something a
later cycle can settle itself: the exact request is kept (`payload`) and
resubmitted under the same key while the provider still remembers it
(`provider.idempotency_window_hours`, 23 by default, wall clock).

Every ending is classified by what Resend can have received:
- a connection that was never made (refused, DNS, connect timeout): `failed`;
- a timeout or a dropped connection after the request left: `unknown`;
- 200 with an id: `sent`, the id stored as `provider_message_id`;
- 400/422 (validation): `failed` with the reason, re-planned after the backoff like any failure;
- 401/403 (our key): the provider stops (`stopped_reason`, exit 6, one alert) and hands nothing more over;
- 429: `failed` (refused before sending), retried no sooner than its `Retry-After`, counted toward the health stop;
- 5xx, and a 2xx whose body cannot be read: `unknown` (the request reached Resend, which may have accepted it),
  counted toward the health stop;
- 409 (`invalid_idempotent_request`: the key was accepted before with another body;
  `concurrent_idempotent_requests`: the first request is still being processed): `unknown`, never re-planned.

Only an answer that proves the email was not accepted is `failed`: a `failed` key is re-planned from the current
snapshot, possibly as another email under another key, which is safe only because nothing went out.

The SDK keeps its key, address and HTTP client in module globals; one
provider per process sets them (the key is read from the environment variable
`provider.api_key_env` and never appears in an error). Transport failures
reach the SDK as a synthetic status 599 from our HTTP client, so they keep
their "before or after the request left" distinction through the SDK's
error mapping.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from email.header import Header, decode_header, make_header
from email.message import Message
from email.utils import getaddresses, quote
from typing import Any, cast

import requests
import resend
import resend.exceptions
from resend.http_client import HTTPClient

from dunning.config import Provider
from dunning.keys import idempotency_key_of
from dunning.secret_env import read_secret, scrub
from dunning.send.providers.base import LEASE_ENDED, EmailProvider, HealthStop, SendOutcome
from dunning.send.providers.http import may_have_left, retry_after_seconds
from dunning.vocabulary import LookupStatus, ProviderStatus, SendStatus

TRANSPORT_STATUS = 599  # not an HTTP status: our client's answer when the request failed on the way
NOT_SENT, MAYBE_SENT = "transport_not_sent", "transport_maybe_sent"
PASSED_HEADERS = ("Message-ID", "X-Dunning-Kind", "X-Dunning-Keys", "X-Dunning-Test")
DELIVERED_EVENTS = frozenset({"sent", "delivered", "delivery_delayed", "opened", "clicked", "complained"})
FAILED_EVENTS = frozenset({"bounced", "failed", "canceled"})


class _Transport(HTTPClient):
    """The SDK's HTTP client, classifying a failed request instead of raising a bare RuntimeError."""

    def __init__(self, timeout_seconds: float):
        self.timeout_seconds = timeout_seconds
        self.session = requests.Session()

    def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        json: dict[str, object] | list[object] | None = None,
        files: dict[str, Any] | None = None,
        data: dict[str, str] | None = None,
    ) -> tuple[bytes, int, Mapping[str, str]]:
        try:
            response = self.session.request(
                method,
                url,
                headers=headers,
                json=cast(Any, json),
                data=data,
                files=files,
                timeout=self.timeout_seconds,
            )
        except requests.RequestException as exc:  # which side of the hand-over: `providers.http`
            return _transport_answer(MAYBE_SENT if may_have_left(exc) else NOT_SENT, exc)
        return response.content, response.status_code, response.headers


def _transport_answer(kind: str, exc: BaseException) -> tuple[bytes, int, Mapping[str, str]]:
    body = {"name": kind, "message": scrub(f"{type(exc).__name__}: {exc}")[:300], "statusCode": TRANSPORT_STATUS}
    return json.dumps(body).encode(), TRANSPORT_STATUS, {"content-type": "application/json"}


def _decoded(value: object) -> str:
    return str(make_header(decode_header(str(value))))


def _sender(value: object) -> str:
    """The From header as Resend's `from` field: `"Display, Name" <address>`, the name decoded from RFC 2047 and
    quoted again, so a `,` or `"` in it cannot make the field ambiguous."""
    # a Header (a name that is not ASCII) as it goes on the wire, RFC 2047: its str() is the decoded text, whose
    # comma would split the name into two addresses
    [(name, address)] = getaddresses([value.encode() if isinstance(value, Header) else str(value)])
    name = _decoded(name) if name else ""
    return f'"{quote(name)}" <{address}>' if name else address


def _part_text(part: Message) -> str:
    raw = part.get_payload(decode=True)
    return raw.decode(part.get_content_charset() or "utf-8") if isinstance(raw, bytes) else str(raw)


def request_params(message: Message) -> dict[str, Any]:
    """Resend's send-email body for one of our messages: the same sender, recipient, subject, bodies and
    audit headers, so the email a customer gets through Resend says what the outbox file would."""
    params: dict[str, Any] = {
        "from": _sender(message["From"]),
        "to": [_sender(message["To"])],  # a display name (`Name <address>`) decoded and quoted as From's
        "subject": _decoded(message["Subject"]),
        "headers": {name: str(message[name]).replace("\r\n", "") for name in PASSED_HEADERS if message[name]},
    }
    if message["Cc"]:  # the copy addresses (`dunning.desk.contacts`)
        params["cc"] = [a.strip() for a in str(message["Cc"]).split(",") if a.strip()]
    if message["Reply-To"]:
        params["reply_to"] = [str(message["Reply-To"])]
    for part in message.walk():
        if part.get_content_type() == "text/plain":
            params["text"] = _part_text(part)
        elif part.get_content_type() == "text/html":
            params["html"] = _part_text(part)
    return params


class ResendProvider(EmailProvider):
    name = "resend"

    def __init__(self, settings: Provider):
        self.settings = settings
        # stripped (a secret file's newline made requests quote the whole header), checked, masked in every text
        resend.api_key = read_secret(settings.api_key_env, "provider.api_key_env")
        resend.api_url = settings.api_base.rstrip("/")
        resend.default_http_client = _Transport(settings.timeout_seconds)
        self._health = HealthStop(settings.max_consecutive_errors, "provider resend")

    def send(self, message: Message) -> SendOutcome:
        message_id = str(message["Message-ID"])
        if self.stopped_reason is not None:
            return SendOutcome(SendStatus.RELEASED, message_id, f"not handed over: {self.stopped_reason}"[:500])
        if not self.may_hand_over(message_id):
            return SendOutcome(SendStatus.RELEASED, message_id, LEASE_ENDED)
        payload = json.dumps(request_params(message), sort_keys=True, ensure_ascii=True)
        return self._submit(payload, idempotency_key_of(message), message_id)

    def resubmit(self, payload: str, idempotency_key: str, message_id: str) -> SendOutcome:
        if self.stopped_reason is not None:
            return SendOutcome(SendStatus.UNKNOWN, message_id, f"not resubmitted: {self.stopped_reason}"[:500])
        if not self.may_hand_over(message_id):
            return SendOutcome(SendStatus.UNKNOWN, message_id, f"not resubmitted: {LEASE_ENDED}")
        return self._submit(payload, idempotency_key, message_id)

    def _submit(self, payload: str, idempotency_key: str, message_id: str) -> SendOutcome:
        params = cast(resend.Emails.SendParams, json.loads(payload))
        try:
            answer = resend.Emails.send(params, {"idempotency_key": idempotency_key})
        except resend.exceptions.ResendError as exc:
            outcome = self._classify(exc, payload, message_id)
        else:
            outcome = SendOutcome(SendStatus.SENT, message_id, provider_message_id=str(answer.get("id") or "") or None)
        self._count(outcome)
        return outcome

    def _classify(self, exc: resend.exceptions.ResendError, payload: str, message_id: str) -> SendOutcome:
        """`failed` only where the answer proves Resend did not accept the email; anything that may have been
        accepted is `unknown`, kept to resubmit under the same key (`dunning.send.resubmission`)."""
        code = int(exc.code) if str(exc.code).isdigit() else 500
        kind = str(exc.error_type)
        reason = f"resend {code} {kind}: {exc.message}"[:500]
        status: ProviderStatus
        retry_after = None
        if code == TRANSPORT_STATUS:
            status = SendStatus.UNKNOWN if kind == MAYBE_SENT else SendStatus.FAILED
        elif code == 409:
            # the key is known to Resend: in flight (concurrent) or accepted before with another body (invalid);
            # either way an email may have gone under it, so it is never re-planned as a new one
            status = SendStatus.UNKNOWN
        elif code in (401, 403):
            self.stopped_reason = f"provider resend refused our credentials ({code} {kind})"
            status = SendStatus.FAILED
        elif code == 429:  # refused before anything was sent; retried no sooner than Resend asks
            status, retry_after = SendStatus.FAILED, retry_after_seconds(getattr(exc, "headers", None))
        elif code >= 500:
            # a 5xx, or a 2xx whose body could not be read (the SDK reports both as 5xx): the request reached
            # Resend, which may have accepted it
            status = SendStatus.UNKNOWN
        else:  # 400, 404, 422: refused as it stands
            status = SendStatus.FAILED
        transport = code == TRANSPORT_STATUS or code == 429 or code >= 500 or code in (401, 403)
        return SendOutcome(
            status,
            message_id,
            reason,
            transport_error=transport,
            payload=payload if status == SendStatus.UNKNOWN else None,
            retry_after_seconds=retry_after,
        )

    def _count(self, outcome: SendOutcome) -> None:
        """The health stop, as for SMTP: after `max_consecutive_errors` transport errors in a row, stop."""
        reason = self._health.count(outcome)
        if reason is not None and self.stopped_reason is None:
            self.stopped_reason = reason

    def lookup(self, message_id: str, provider_message_id: str | None = None) -> LookupStatus | None:
        """`GET /emails/{id}` where Resend gave us an id: its last event says sent or failed; else None."""
        if not provider_message_id:
            return None
        try:
            email = resend.Emails.get(provider_message_id)
        except resend.exceptions.ResendError:
            return None
        event = str(email.get("last_event") or "")
        if event in DELIVERED_EVENTS:
            return SendStatus.SENT
        if event in FAILED_EVENTS:
            return SendStatus.FAILED
        return None

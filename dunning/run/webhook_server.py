"""`dunning serve-webhooks`: a small ASGI app (Starlette, served by uvicorn) that receives Resend, Stripe, Chargebee
and Recurly webhooks.

- `POST /webhooks/resend`: the Svix signature (`svix-id`, `svix-timestamp`, `svix-signature`) is verified with the
  official `svix` library and `RESEND_WEBHOOK_SECRET` (`whsec_…`); missing, wrong or older than 5 minutes: 400.
- `POST /webhooks/stripe`: `Stripe-Signature` is verified with the `stripe` SDK and `STRIPE_WEBHOOK_SECRET`
  (tolerance 5 minutes); otherwise 400.
- `POST /webhooks/chargebee`: HTTP Basic with `CHARGEBEE_WEBHOOK_USERNAME` and `CHARGEBEE_WEBHOOK_PASSWORD`
  (constant time); `POST /webhooks/recurly`: `recurly-signature` with `RECURLY_WEBHOOK_SECRET` (any signature may
  match, 5 minutes' tolerance; `dunning.ingest.sources.webhooks`). Otherwise 401/400. Stored whatever `source.kind`
  is; the next run of that source fetches each back from the API before it changes anything (neither is applied
  here, even with a PostgreSQL ledger: the vendor's 5 s to answer must not wait on its API).
- A body over `feedback.webhook_max_bytes` (1 MB) is refused with 413 before it is read whole.
- uvicorn bounds no read of a request's head (a client sending a header a byte a minute held its socket for good):
  `server_config` serves h11 with a deadline, `feedback.webhook_timeout_seconds` (10 s) from the connection (or the
  answer before) to the request's last byte, past which the connection is closed, and at most
  `feedback.webhook_max_connections` (100) connections: a request past them is answered 503 (senders retry).
- A verified event is stored durably in the inbox (`dunning.run.inbox`), unique on its id, before the 2xx; a
  redelivery is answered 200 and stored once. With a PostgreSQL ledger it is applied to the ledger at once (the
  ledger has no single-writer lock to wait on); with DuckDB the next run applies it.
- A route whose secret is not set answers 404: nothing unverified is ever stored.

It binds 127.0.0.1 by default: put a TLS proxy in front of it (docs: after the send). Nothing from a request
reaches a log line unescaped; the secrets never appear in an answer or a log.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from pathlib import Path

import h11
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from dunning.config import DunningConfig
from dunning.ingest.sources import webhooks
from dunning.run import inbox
from dunning.secret_env import read_secret

RESEND_SECRET_ENV = "RESEND_WEBHOOK_SECRET"
STRIPE_SECRET_ENV = "STRIPE_WEBHOOK_SECRET"
CHARGEBEE_USER_ENV, CHARGEBEE_PASSWORD_ENV = "CHARGEBEE_WEBHOOK_USERNAME", "CHARGEBEE_WEBHOOK_PASSWORD"
RECURLY_SECRET_ENV = "RECURLY_WEBHOOK_SECRET"
TOLERANCE_SECONDS = 300
log = logging.getLogger("dunning.webhooks")


class TooLarge(Exception):
    pass


async def _body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _answer(status: int, what: str) -> JSONResponse:
    return JSONResponse({"status": what}, status_code=status)


async def _received(request: Request, secret: str | None, limit: int) -> bytes | JSONResponse:
    """The request's body, or the answer that ends it first: no secret for the route (404), too large (413), cut
    off (400)."""
    if secret is None:
        return _answer(404, "not configured")
    try:
        return await _body(request, limit)
    except TooLarge:
        return _answer(413, "too large")
    except ClientDisconnect:
        return _answer(400, "incomplete")


def _secret(name: str) -> str | None:
    import os

    return read_secret(name, f"${name}") if os.environ.get(name, "").strip() else None


def webhook_app(home: Path, config: DunningConfig, apply_now: bool | None = None) -> Starlette:
    """The receiver for `home`; `apply_now` (default: with a PostgreSQL ledger) applies each event to the ledger
    as soon as it is stored."""
    resend_secret, stripe_secret = _secret(RESEND_SECRET_ENV), _secret(STRIPE_SECRET_ENV)
    chargebee_user, chargebee_password = _secret(CHARGEBEE_USER_ENV), _secret(CHARGEBEE_PASSWORD_ENV)
    chargebee_secret = chargebee_password if chargebee_user is not None else None
    recurly_secret = _secret(RECURLY_SECRET_ENV)
    limit = config.feedback.webhook_max_bytes
    apply_now = config.ledger.kind == "postgres" if apply_now is None else apply_now

    def keep(provider: str, event_id: str, body: bytes) -> JSONResponse:
        new = inbox.store(home, provider, event_id, body, dt.datetime.now(dt.UTC))
        if new and apply_now and provider in inbox.PROVIDERS:  # a vendor's trigger waits for its source's run
            from dunning.ledger.factory import open_ledger_for

            with open_ledger_for(config, home, timeout_seconds=10) as ledger:
                inbox.apply_inbox(ledger, home, config, f"webhook:{provider}", dt.datetime.now(dt.UTC), False)
        return _answer(200, "stored" if new else "duplicate")

    async def resend(request: Request) -> JSONResponse:
        body = await _received(request, resend_secret, limit)
        if isinstance(body, JSONResponse):
            return body
        from svix.webhooks import Webhook

        headers = {k: v for k, v in request.headers.items() if k.lower().startswith(("svix-", "webhook-"))}
        try:
            Webhook(str(resend_secret)).verify(body, headers)  # signature and a timestamp within 5 minutes
            event = json.loads(body)
        except Exception:  # noqa: BLE001 - a wrong signature, and a malformed header that trips the library itself
            return _answer(400, "signature not verified")
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            return _answer(400, "not an event")
        return keep("resend", headers.get("svix-id") or headers.get("webhook-id") or "", body)

    async def stripe_hook(request: Request) -> JSONResponse:
        body = await _received(request, stripe_secret, limit)
        if isinstance(body, JSONResponse):
            return body
        import stripe

        try:
            stripe.WebhookSignature.verify_header(
                body.decode("utf-8"), request.headers.get("stripe-signature"), stripe_secret, TOLERANCE_SECONDS
            )
            event = json.loads(body)
        except (stripe.SignatureVerificationError, ValueError, UnicodeDecodeError):
            return _answer(400, "signature not verified")
        if not isinstance(event, dict) or not isinstance(event.get("id"), str) or not event["id"]:
            return _answer(400, "not an event")
        return keep("stripe", event["id"], body)

    async def chargebee_hook(request: Request) -> JSONResponse:
        body = await _received(request, chargebee_secret, limit)
        if isinstance(body, JSONResponse):
            return body
        if not webhooks.chargebee_authorized(request.headers.get("authorization"), str(chargebee_user),
                                             str(chargebee_password)):  # fmt: skip
            return _answer(401, "not authorized")
        try:
            event_id = webhooks.chargebee_event_id(json.loads(body))
        except (ValueError, RecursionError):
            event_id = None
        return _answer(400, "not an event") if event_id is None else keep("chargebee", event_id, body)

    async def recurly_hook(request: Request) -> JSONResponse:
        body = await _received(request, recurly_secret, limit)
        if isinstance(body, JSONResponse):
            return body
        now_ms = int(dt.datetime.now(dt.UTC).timestamp() * 1000)
        if not webhooks.recurly_verified(request.headers.get("recurly-signature"), body, str(recurly_secret), now_ms):
            return _answer(400, "signature not verified")
        try:
            notification_id = webhooks.recurly_notification_id(request.headers, json.loads(body))
        except (ValueError, RecursionError):
            notification_id = None
        if notification_id is None:
            return _answer(400, "not a notification")
        return keep("recurly", notification_id, body)

    async def health(_: Request) -> JSONResponse:
        return _answer(200, "ok")

    return Starlette(
        routes=[
            Route("/webhooks/resend", resend, methods=["POST"]),
            Route("/webhooks/stripe", stripe_hook, methods=["POST"]),
            Route("/webhooks/chargebee", chargebee_hook, methods=["POST"]),
            Route("/webhooks/recurly", recurly_hook, methods=["POST"]),
            Route("/healthz", health, methods=["GET"]),
        ]
    )


class _RequestDeadline(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request to arrive whole (its line, headers and body):
    `timeout` seconds from the connection, or from the answer to the request before, whatever the client trickles."""

    timeout: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline = self.loop.call_later(self.timeout, self._deadline_passed)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._deadline.cancel()
        if not self.transport.is_closing():  # kept alive: the next request has its own deadline
            self._deadline = self.loop.call_later(self.timeout, self._deadline_passed)

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline.cancel()
        super().connection_lost(exc)

    def _deadline_passed(self) -> None:
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
            self.transport.close()  # the request is still arriving (or never started): the client is too slow


def server_config(app: Starlette, host: str, port: int, config: DunningConfig) -> uvicorn.Config:
    """How `dunning serve-webhooks` serves `app`: h11 with each request's deadline, the connection limit, uvicorn's
    keep-alive of 5 s, no access log, no server header (module docstring)."""
    protocol = type("RequestDeadline", (_RequestDeadline,), {"timeout": config.feedback.webhook_timeout_seconds})
    return uvicorn.Config(
        app, host=host, port=port, http=protocol, limit_concurrency=config.feedback.webhook_max_connections,
        timeout_keep_alive=5, log_level="warning", access_log=False, server_header=False,
    )  # fmt: skip

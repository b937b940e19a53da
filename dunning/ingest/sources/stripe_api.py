"""The Stripe API as a billing source, through the official `stripe` SDK: every invoice, and the payment-failed
events newer than a cursor.

A `stripe.StripeClient` per pull, pointed at `source.api_base`, with the SDK's
own retries (`max_network_retries`, exponential backoff from 0.5 s doubling up
to 5 s, with jitter). The SDK retries 409, 5xx and network errors, and a 429
only when Stripe's `Stripe-Should-Retry` header asks for it; `_RateLimitRetrying`
adds every 429 that Stripe does not mark `Stripe-Should-Retry: false`, with the
same backoff. Lists are read with the SDK's auto-pagination (`limit`,
`starting_after`, `ending_before`, `has_more`).

Every failure ends as `BillingSourceFailed` (exit 7): one line naming what
failed and where, never the key, never text from the response (it is not ours
and may quote the key). A missing key variable is a `ConfigError` (exit 2)
naming the variable, not a value.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import stripe
from stripe.params import EventListParams

from dunning.config import Source
from dunning.errors import BillingSourceFailed
from dunning.safe_text import for_terminal
from dunning.secret_env import read_secret

PAYMENT_FAILED = "invoice.payment_failed"
PAGE_LIMIT = 100  # the largest page Stripe serves
_ERROR_CODE = re.compile(r"[a-z0-9_]{1,64}")  # Stripe's error codes: shown only when they look like one


def api_key(settings: Source, environ: Mapping[str, str] = os.environ) -> str:
    """The Stripe key from the environment variable the config names (`secret_env.read_secret`: stripped, checked,
    masked in every text); ConfigError naming the variable, never the value, when unset or unusable."""
    return read_secret(settings.api_key_env, "source.api_key_env", environ)


class _RateLimitRetrying(stripe.RequestsClient):
    """The SDK's default HTTP client, also retrying a 429 (with the SDK's backoff) unless Stripe says not to."""

    def _should_retry(
        self,
        response: tuple[Any, int, Mapping[str, str] | None] | None,
        api_connection_error: stripe.APIConnectionError | None,
        num_retries: int,
        max_network_retries: int | None,
    ) -> bool:
        if response is not None and response[1] == 429 and num_retries < (max_network_retries or 0):
            headers = response[2]
            if headers is None or headers.get("stripe-should-retry") != "false":
                return True
        return bool(super()._should_retry(response, api_connection_error, num_retries, max_network_retries))


def client(settings: Source, key: str) -> stripe.StripeClient:
    return stripe.StripeClient(
        key,
        base_addresses={"api": settings.api_base.rstrip("/")},
        max_network_retries=settings.max_network_retries,
        http_client=_RateLimitRetrying(timeout=settings.timeout_seconds),
    )


def _where(settings: Source) -> str:
    """The API's scheme, host and port: never a path or user info, which may hold a token."""
    parts = urlsplit(settings.api_base)
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a port out of range: the request fails as unreachable, the line still names the host
        port = ""
    return f"Stripe API at {parts.scheme}://{parts.hostname}{port}"


def _code(error: stripe.StripeError) -> str:
    code = error.code if isinstance(error.code, str) else None
    return f", {code}" if code and _ERROR_CODE.fullmatch(code) else ""


@contextlib.contextmanager
def api_errors(settings: Source, what: str) -> Iterator[None]:
    """Any failure of the SDK or of the response's shape, as one BillingSourceFailed line."""
    where = _where(settings)
    retries = f"after {settings.max_network_retries} retr{'y' if settings.max_network_retries == 1 else 'ies'}"
    try:
        yield
    except stripe.AuthenticationError:
        raise BillingSourceFailed(
            f"{what}: the {where} refused the key in ${settings.api_key_env} (401: wrong, expired or revoked key)"
        ) from None
    except stripe.PermissionError:
        raise BillingSourceFailed(
            f"{what}: the key in ${settings.api_key_env} may not read this at the {where} (403; a restricted key "
            "needs read access to invoices and events)"
        ) from None
    except stripe.RateLimitError:
        raise BillingSourceFailed(
            f"{what}: the {where} still answered 429 (rate limited) {retries}; nothing was sent, try again later"
        ) from None
    except stripe.APIConnectionError as error:
        cause = type(error.__cause__).__name__ if error.__cause__ is not None else "no response"
        raise BillingSourceFailed(f"{what}: the {where} is unreachable ({cause}) {retries}; nothing was sent") from None
    except stripe.StripeError as error:
        status = error.http_status
        if status is not None and 200 <= status < 300:
            raise BillingSourceFailed(f"{what}: the {where} answered with a malformed body (HTTP {status})") from None
        raise BillingSourceFailed(
            f"{what}: the {where} failed (HTTP {status if status is not None else '?'}{_code(error)}) {retries}"
        ) from None
    except ListedTwice as error:
        raise BillingSourceFailed(
            f"{what}: the {where} listed invoice {for_terminal(error.invoice_id)[:80]} twice (its pages went round in "
            "a circle, or the list changed while it was read); nothing was sent, try again"
        ) from None
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError):
        raise BillingSourceFailed(f"{what}: the {where} answered with a malformed body") from None


class ListedTwice(ValueError):
    """An invoice id came back twice while paging through the list."""

    def __init__(self, invoice_id: str) -> None:
        super().__init__(f"invoice {invoice_id} listed twice")
        self.invoice_id = invoice_id


def _plain(obj: Any, kind: str) -> dict[str, Any]:
    """A Stripe object as plain JSON data, refused (ValueError) unless it is an object of `kind` with a string id."""
    data = obj.to_dict(for_json=True) if isinstance(obj, stripe.StripeObject) else obj
    if not (isinstance(data, dict) and isinstance(data.get("id"), str) and data.get("object", kind) == kind):
        raise ValueError(f"not a Stripe {kind}")
    return data


def invoices(stripe_client: stripe.StripeClient) -> Iterator[dict[str, Any]]:
    """Every invoice of the account, every status (so a paid or voided invoice closes its cycle), newest first.

    Call inside `api_errors`. An id seen twice means the pagination is going round in circles: refused."""
    seen: set[str] = set()
    # the customer expanded: its `preferred_locales` is the language of the customer's emails (`customer_locale`)
    pages = stripe_client.v1.invoices.list(params={"limit": PAGE_LIMIT, "expand": ["data.customer"]})
    for item in pages.auto_paging_iter():
        invoice = _plain(item, "invoice")
        if invoice["id"] in seen:
            raise ListedTwice(invoice["id"])
        seen.add(invoice["id"])
        yield invoice


# what the event poll asks Stripe for: the payment-failed notices, and the payment signals that pause reminders
# (`dunning.plan.payment_signals`: disputes, payments in flight and their ends, payments between snapshots)
POLLED_TYPES = (
    PAYMENT_FAILED, "charge.dispute.created", "charge.dispute.closed", "payment_intent.processing",
    "invoice.payment_action_required", "invoice.paid", "invoice.payment_succeeded", "payment_intent.succeeded",
    "payment_intent.payment_failed", "payment_intent.canceled", "invoice.voided",
)  # fmt: skip


def _event_params(since: dt.datetime, limit: int = PAGE_LIMIT, ending_before: str | None = None) -> EventListParams:
    params = EventListParams(types=list(POLLED_TYPES), limit=limit, created={"gte": int(since.timestamp())})
    if ending_before is not None:
        params["ending_before"] = ending_before
    return params


def new_payment_failed_events(
    stripe_client: stripe.StripeClient, cursor: str | None, since: dt.datetime
) -> list[dict[str, Any]]:
    """The `invoice.payment_failed` events created at or after `since` and newer than the event `cursor`, oldest
    first. Call inside `api_errors`.

    With a cursor, `ending_before=cursor`: Stripe serves the page just newer than it and the SDK pages on towards
    the newest. A cursor Stripe no longer knows (events are kept 30 days) is answered 400/404 on the
    `ending_before` parameter: then the list is read from the newest down to `since`, stopping at the cursor.
    """
    if cursor:
        try:
            pages = stripe_client.v1.events.list(params=_event_params(since, ending_before=cursor))
            return [_plain(e, "event") for e in pages.auto_paging_iter()]
        except stripe.InvalidRequestError as error:
            if error.param != "ending_before":
                raise
    newest_first = []
    for item in stripe_client.v1.events.list(params=_event_params(since)).auto_paging_iter():
        event = _plain(item, "event")
        if event["id"] == cursor:
            break
        newest_first.append(event)
    return newest_first[::-1]


def newest_payment_failed_event(stripe_client: stripe.StripeClient, since: dt.datetime) -> str | None:
    """The id of the newest `invoice.payment_failed` event created at or after `since` (one item, one request)."""
    page = stripe_client.v1.events.list(params=_event_params(since, limit=1))
    for item in page:
        return str(_plain(item, "event")["id"])
    return None


def invoice_events(stripe_client: stripe.StripeClient, since: int) -> list[dict[str, Any]]:
    """The `invoice.*` events created at or after `since` (Unix seconds), newest first: each carries the invoice as
    it was then (`data.object`). Call inside `api_errors`."""
    params = EventListParams(type="invoice.*", limit=PAGE_LIMIT, created={"gte": since})
    return [_plain(e, "event") for e in stripe_client.v1.events.list(params=params).auto_paging_iter()]


def charge_invoice(stripe_client: stripe.StripeClient, charge_id: str) -> tuple[str | None, str | None]:
    """(the invoice, the customer) of a charge: a dispute names only its charge. Call inside `api_errors`; a charge
    the API does not know (404) names neither."""
    try:
        charge = _plain(stripe_client.v1.charges.retrieve(charge_id), "charge")
    except stripe.InvalidRequestError as error:
        if error.http_status == 404:
            return None, None
        raise
    invoice, customer = charge.get("invoice"), charge.get("customer")
    invoice = invoice.get("id") if isinstance(invoice, dict) else invoice
    customer = customer.get("id") if isinstance(customer, dict) else customer
    return (invoice if isinstance(invoice, str) else None, customer if isinstance(customer, str) else None)

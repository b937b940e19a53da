"""The email provider boundary: every send ends as `sent`, `failed` or `unknown`.

`failed` means the provider definitely did not accept the message (safe to
retry later); `unknown` means it may have (a timeout after the data was handed
over, a lost connection): never resent blindly, resolved with `lookup` where
the provider can answer, otherwise held for a human. `released` is not a
provider call at all: a provider stopped as unhealthy hands nothing more over,
and the message's keys go back to `failed` without counting an attempt.

`transport_error` marks failures of the transport itself (connect, TLS, login,
timeout, 421, a dropped connection), which count toward the health stop; a
per-recipient rejection does not.

Providers with an idempotency contract (an HTTP API with an `Idempotency-Key`
header, an SMTP relay with an idempotency header) answer a repeated key with
the first result for a while. For them an `unknown` outcome carries the exact
request (`payload`), which the ledger keeps, and a later cycle `resubmit`s it
under the same key within the provider's window: safe by that contract.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from email.message import Message
from typing import TYPE_CHECKING

from dunning.vocabulary import LookupStatus, ProviderStatus

if TYPE_CHECKING:
    from dunning.email.wire import WireEmail
    from dunning.send.handover import HandOverGate

LEASE_ENDED = "not handed over: the run's claim lease ended (a later run retries it)"


@dataclass(frozen=True)
class SendOutcome:
    status: ProviderStatus
    message_id: str | None = None
    error: str | None = None
    transport_error: bool = False
    provider_message_id: str | None = None  # the provider's own id of the accepted message, when it gives one
    payload: str | None = None  # the exact request of an `unknown` send, to resubmit under the same key
    retry_after_seconds: float | None = None  # a `failed` send the provider asked us not to retry sooner (429)


class HealthStop:
    """A provider's health stop: after `limit` transport errors in a row (a success resets the count), say why
    the provider must hand nothing more over. Thread-safe: pooled connections report from several threads."""

    def __init__(self, limit: int, who: str):
        self.limit, self.who = limit, who
        self._lock = threading.Lock()
        self._in_a_row = 0
        self._last: list[str] = []

    def count(self, outcome: SendOutcome) -> str | None:
        """The stop's reason once `limit` is reached (returned once), else None."""
        with self._lock:
            if not outcome.transport_error:
                self._in_a_row = 0
                return None
            self._in_a_row += 1
            self._last = (self._last + [outcome.error or "transport error"])[-3:]
            if self._in_a_row != self.limit:
                return None
            distinct = list(dict.fromkeys(self._last))  # the same error said once, not three times
            last = distinct[0] if len(distinct) == 1 else " | ".join(distinct)
            return f"{self.who} stopped as unhealthy after {self.limit} consecutive transport errors; last: {last}"


class EmailProvider(abc.ABC):
    """Sends RFC 5322 messages. Use as a context manager so connections are closed.

    A provider that `takes_wire` also sends emails already serialized (`send_wire`: bytes and envelope, the same
    bytes `send` would produce from the message), which lets a render pool build them in other processes.
    """

    name = "provider"
    stopped_reason: str | None = None  # set once the provider stops handing messages over (health stop)
    takes_wire = False
    gate: HandOverGate | None = None  # asked right before each hand-over (`dunning.send.handover`); None: always go

    def may_hand_over(self, message_id: str) -> bool:
        """Journal the email, then say whether it may still go (the run's claim lease); every provider asks right
        before the point from which its peer may accept the email."""
        return self.gate is None or self.gate.may_hand_over(message_id)

    @abc.abstractmethod
    def send(self, message: Message) -> SendOutcome: ...

    def send_many(self, messages: Iterable[Message]) -> list[SendOutcome]:
        """Outcomes in the order of `messages`; providers with connection pools send concurrently.

        `messages` may be a generator that renders as it goes, so a provider can
        overlap its waiting with the caller's rendering.
        """
        return [self.send(m) for m in messages]

    def send_wire(self, email: WireEmail) -> SendOutcome:
        """Send an email rendered elsewhere; only for providers that `takes_wire`."""
        raise NotImplementedError(f"provider {self.name} sends messages, not bytes")

    def send_many_wire(self, emails: Iterable[WireEmail]) -> list[SendOutcome]:
        """`send_many` for rendered emails: outcomes in order; `emails` may be a generator still rendering."""
        return [self.send_wire(e) for e in emails]

    def pool_outbox(self) -> str | None:
        """A directory the render pool's workers may write this provider's emails into themselves (the file
        outbox: no connection, no health stop, and `lookup` finds what a dead worker wrote); None when only the
        run's process hands emails over."""
        return None

    def resubmit(self, payload: str, idempotency_key: str, message_id: str) -> SendOutcome:
        """Send the kept `payload` of an `unknown` send again under its key; only for providers whose config says
        `resubmits_unknown`."""
        raise NotImplementedError(f"provider {self.name} cannot resubmit")

    def lookup(self, message_id: str, provider_message_id: str | None = None) -> LookupStatus | None:
        """Whether the message with `message_id` (the provider's own id when it gave one) was accepted; None when
        this provider cannot tell."""
        return None

    def close(self) -> None:
        return None

    def __enter__(self) -> EmailProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

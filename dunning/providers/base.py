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
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from dataclasses import dataclass
from email.message import Message

from dunning.vocabulary import LookupStatus, ProviderStatus


@dataclass(frozen=True)
class SendOutcome:
    status: ProviderStatus
    message_id: str | None = None
    error: str | None = None
    transport_error: bool = False


class EmailProvider(abc.ABC):
    """Sends RFC 5322 messages. Use as a context manager so connections are closed."""

    name = "provider"
    stopped_reason: str | None = None  # set once the provider stops handing messages over (health stop)

    @abc.abstractmethod
    def send(self, message: Message) -> SendOutcome: ...

    def send_many(self, messages: Iterable[Message]) -> list[SendOutcome]:
        """Outcomes in the order of `messages`; providers with connection pools send concurrently.

        `messages` may be a generator that renders as it goes, so a provider can
        overlap its waiting with the caller's rendering.
        """
        return [self.send(m) for m in messages]

    def lookup(self, message_id: str) -> LookupStatus | None:
        """Whether the message with `message_id` was accepted; None when this provider cannot tell."""
        return None

    def close(self) -> None:
        return None

    def __enter__(self) -> EmailProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

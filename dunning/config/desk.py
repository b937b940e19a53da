"""The collections desk's keys (`dunning.desk`): `promises:` (how long a promise to pay holds after its date),
`replies:` (how long a customer's reply pauses the chasing) and `feedback.imap:` (the mailbox `dunning feedback
--imap` reads replies and reports from)."""

from __future__ import annotations

from pydantic import Field

from dunning.config.base import Count, EnvName, Number, Strict


class Promises(Strict):
    """Promises to pay (`dunning promise`): while one is active the keys of the invoices it covers wait (audit reason
    `promised`), and so does their escalation."""

    grace_days: Count = Field(default=2, ge=0, le=365)
    """Calendar days after a promise's `until` date (business `timezone`) during which it still holds; the first
    run after them judges it `kept` (paid, or reduced by the promised amount) or `broken` (one `promise_broken`
    alert; dunning resumes at the stage reached by then)."""


class Replies(Strict):
    """Customers' replies (`dunning feedback`): a human reply pauses that customer's reminders and escalation (audit
    reason `replied`) until `dunning ack --customer ID`, or until the pause runs out."""

    pause_days: Count = Field(default=3, ge=1, le=365)
    """Business days (Monday to Friday in the business `timezone`, less the send window's holidays where configured)
    an unanswered reply pauses its customer; then one `reply_unanswered` alert, and dunning resumes."""


class Imap(Strict):
    """`dunning feedback --imap imaps://user@host:993/FOLDER`: the mailbox read, over TLS with the certificate and
    host name verified, by UID from a cursor kept in the ledger. Nothing is deleted, moved or flagged."""

    password_env: EnvName = "DUNNING_IMAP_PASSWORD"
    """The name of the environment variable holding the mailbox's password (never the password itself)."""
    ca_file: str | None = None
    """A PEM file of the certificate authority that signed the server's certificate (a private CA); default: the
    system's trusted authorities."""
    timeout_seconds: Number = Field(default=30.0, gt=0, le=600)
    """Seconds to wait for the server on connect and on each command."""
    batch: Count = Field(default=200, ge=1, le=10_000)
    """Messages fetched per request."""

"""`feedback:`: delivery feedback (`dunning feedback`, `dunning serve-webhooks`): what a bounce or complaint may
suppress, and the webhook receiver's bounds."""

from __future__ import annotations

from pydantic import Field

from dunning.config.base import Count, Flag, Number, Strict
from dunning.config.desk import Imap


class Feedback(Strict):
    """Delivery feedback (`dunning feedback`, `dunning serve-webhooks`): what a bounce or complaint may suppress."""

    trust_unmatched: Flag = False
    """A mailbox report (DSN or ARF) that names no Message-ID of ours, or names one sent to another address, is
    recorded but suppresses nothing unless true: anyone can mail the bounce address. Resend's own events and signed
    webhooks suppress their recipient either way."""
    webhook_max_bytes: Count = Field(default=1_048_576, ge=1024, le=16 * 1_048_576)
    """`dunning serve-webhooks`: a request body larger than this is refused (413)."""
    webhook_timeout_seconds: Number = Field(default=10.0, gt=0, le=300)
    """`dunning serve-webhooks`: a request whose line, headers and body have not all arrived this many seconds after
    its connection opened (or after the answer before it) is disconnected, so a slow client holds no socket long."""
    webhook_max_connections: Count = Field(default=100, ge=1, le=10_000)
    """`dunning serve-webhooks`: connections served at once; a request past them is answered 503 (senders retry)."""
    trust_legacy_message_ids: Flag = False
    """A mailbox report quoting a Message-ID minted before Message-IDs were signed (32 hex digits: anyone can compute
    one from an invoice number, a stage and the sender's domain) is recorded as unmatched, and listed in `dunning
    status` for a human to confirm, unless true: then it suppresses like a signed one when its recipient was that
    email's."""
    imap: Imap = Imap()
    """`dunning feedback --imap URL`: the password's variable, a private CA, timeouts."""

"""Idempotency keys from business identity, never from a request id; the Message-IDs of our emails; and the key a
provider dedupes an email on.

The same invoice, cycle and stage always give the same key, in any process, on
any day; the ledger's primary key on it is what stops a second send.

A Message-ID is an HMAC of the keys an email covers under the deployment's secret (`MessageIds`): the same keys
give the same Message-ID in every worker of one deployment (a receiving system can dedupe on it), and no one
without the secret can compute one, so a bounce or complaint that quotes it proves it is about an email we sent
(`verifies`; guarantee 15). Message-IDs minted before (`legacy_email_id`: sha256 of the keys, which anyone can
compute from an invoice number, a stage and the sender's domain) are recognized as such and trusted only by
configuration.
Where no secret may be read or created (`dunning preview`, a dry run on a ledger that has none yet) the ids are
`PLACEHOLDER`s, which no email ever carries.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from email.message import Message
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the key expressions only: a render worker (`dunning.send.render_pool`) imports no polars
    import polars as pl


def reminder_key(invoice_id: str, cycle: int, stage: str) -> str:
    return f"dunning:{invoice_id}:{cycle}:{stage}"


def apology_key(incident_id: str, customer_id: str) -> str:
    return f"apology:{incident_id}:{customer_id}"


def event_key(event_id: str) -> str:
    return f"event:{event_id}"


def invoice_key(invoice_id: str, billing_period: str | None) -> str:
    """The invoice email's key: one per invoice and billing period, forever (`none` when the period is unknown)."""
    return f"invoice:{invoice_id}:{billing_period or 'none'}"


def invoice_key_expr() -> pl.Expr:
    """`invoice_key` over columns `invoice_id`, `billing_period`."""
    import polars as pl

    return pl.concat_str(
        [pl.lit("invoice:"), pl.col("invoice_id"), pl.lit(":"), pl.col("billing_period").fill_null("none")]
    )


def reminder_key_expr() -> pl.Expr:
    """`reminder_key` over columns `invoice_id`, `cycle`, `stage`."""
    import polars as pl

    return pl.concat_str(
        [
            pl.lit("dunning:"),
            pl.col("invoice_id"),
            pl.lit(":"),
            pl.col("cycle").cast(pl.String),
            pl.lit(":"),
            pl.col("stage"),
        ]
    )


SIGNED = "d1."  # the left part of a Message-ID minted under a secret: `d1.` and 32 hex digits of the HMAC
PLACEHOLDER = "placeholder."  # a Message-ID no email carries: a preview or dry run without a secret to mint with
_HMAC_CONTEXT = b"dunning message-id v1\x00"  # so this HMAC of the keys is never another one's under the same secret
_SIGNED_ID = re.compile(r"d1\.[0-9a-f]{32}")
_LEGACY_ID = re.compile(r"[0-9a-f]{32}")
SIGNED_FORM, LEGACY_FORM, PLACEHOLDER_FORM, FOREIGN_FORM = "signed", "legacy", "placeholder", "foreign"
MIN_SECRET_BYTES = 16


def legacy_email_id(joined_keys: str) -> str:
    """The email id releases before the signed Message-IDs minted: sha256 of the keys sorted and comma-joined. Anyone
    can compute it; it still names the emails those releases sent (`reminder_ledger.email_id`, `message_id`)."""
    return hashlib.sha256(joined_keys.encode()).hexdigest()[:32]


def joined(keys: Iterable[str]) -> str:
    """`keys` sorted (by code point, as UTF-8 bytes sort) and comma-joined: what an email id is computed over."""
    return ",".join(sorted(keys))


@dataclass(frozen=True)
class MessageIds:
    """How one deployment mints its emails' ids: `secrets[0]` mints, every one of `secrets` verifies (the one
    `message_secret_env` names, and the ledger's when both exist). No secret: placeholders, never sent."""

    domain: str
    secrets: tuple[bytes, ...] = ()
    # the minting secret's HMAC with the context already fed in, copied per email: the same HMAC-SHA256, without
    # keying a new one each time (`hmac.new` per email was two thirds of minting 173,380 ids)
    _keyed: hmac.HMAC | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.secrets:
            object.__setattr__(self, "_keyed", hmac.new(self.secrets[0], _HMAC_CONTEXT, hashlib.sha256))

    def __repr__(self) -> str:  # never the secret, in a log, a traceback's locals or a test's failure
        return f"MessageIds(domain={self.domain!r}, secrets=<{len(self.secrets)}>)"

    @property
    def placeholders(self) -> bool:
        return not self.secrets

    def email_id_of_joined(self, joined_keys: str) -> str:
        """The left part of the Message-ID of the email covering the keys `joined_keys` (`joined`)."""
        if self._keyed is None:
            return PLACEHOLDER + legacy_email_id(joined_keys)
        mac: hmac.HMAC = self._keyed.copy()
        mac.update(joined_keys.encode())
        return SIGNED + mac.hexdigest()[:32]

    def email_id(self, keys: Iterable[str]) -> str:
        return self.email_id_of_joined(joined(keys))

    def message_id(self, keys: Iterable[str]) -> str:
        return f"<{self.email_id(keys)}@{self.domain}>"

    def verifies(self, message_id: str, keys: Iterable[str]) -> bool:
        """Whether `message_id` (as a report quotes it) is the signed Message-ID of the email covering `keys`, under
        one of this deployment's secrets (compared in constant time)."""
        left = local_part(message_id)
        if not _SIGNED_ID.fullmatch(left):
            return False
        text = joined(keys)
        return any(hmac.compare_digest(left, SIGNED + _mac(secret, text)) for secret in self.secrets)


def _mac(secret: bytes, joined_keys: str) -> str:
    return hmac.new(secret, _HMAC_CONTEXT + joined_keys.encode(), hashlib.sha256).hexdigest()[:32]


def local_part(message_id: str) -> str:
    """The left part of a Message-ID: `<abc@example.com>` -> `abc`."""
    return message_id.strip().strip("<>").partition("@")[0]


def message_id_form(message_id: str) -> str:
    """Which kind of id `message_id` is by its shape alone: `signed` (minted under a secret; `MessageIds.verifies`
    says whether it is ours), `legacy` (sha256 of keys, minted before secrets), `placeholder`, or `foreign`."""
    left = local_part(message_id)
    if _SIGNED_ID.fullmatch(left):
        return SIGNED_FORM
    if _LEGACY_ID.fullmatch(left):
        return LEGACY_FORM
    if left.startswith(PLACEHOLDER):
        return PLACEHOLDER_FORM
    return FOREIGN_FORM


def legacy_verifies(message_id: str, keys: Iterable[str]) -> bool:
    """Whether `message_id` is the legacy (sha256) Message-ID of the email covering `keys`."""
    left = local_part(message_id)
    return _LEGACY_ID.fullmatch(left) is not None and hmac.compare_digest(left, legacy_email_id(joined(keys)))


def idempotency_key_for(keys: Sequence[str], email_id: str) -> str:
    """The key a provider dedupes an email on: its one ledger key when that is a short printable-ASCII header
    value, else its email id (a hash of every key it covers, the left part of its Message-ID)."""
    if len(keys) == 1 and len(keys[0]) <= 256 and keys[0].isascii() and keys[0].isprintable():
        return keys[0]
    return email_id


def idempotency_key_of(message: Message) -> str:
    """`idempotency_key_for` the keys and Message-ID that `message` carries in its headers."""
    return idempotency_key_in(str(message["X-Dunning-Keys"] or ""), str(message["Message-ID"]))


def idempotency_key_in(keys_header: str, message_id: str) -> str:
    """`idempotency_key_for` the keys of an `X-Dunning-Keys` header's value and a Message-ID, as read back."""
    keys = [k.strip() for k in keys_header.split(",") if k.strip()]
    return idempotency_key_for(keys, local_part(message_id))

"""`provider:`: where accepted emails go (the file outbox, an SMTP server, the Resend API) and what its
idempotency contract makes safe."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from dunning.config.base import Count, EnvName, Flag, Number, Strict
from dunning.safe_text import has_control, is_address
from dunning.urls import http_url

# headers a message is built from: an idempotency header by one of these names would change who gets it, or how
STRUCTURAL_HEADERS = frozenset(
    h.lower()
    for h in (
        "To", "Cc", "Bcc", "From", "Sender", "Reply-To", "Subject", "Date", "Message-ID", "MIME-Version", "Received",
        "Return-Path", "DKIM-Signature", "X-Dunning-Keys", "X-Dunning-Kind",
    )
)  # fmt: skip
# how long Resend (its API and its SMTP relay's Resend-Idempotency-Key) answers a repeated key with the first result
PROVIDER_KEY_MEMORY_HOURS = 24.0


class Provider(Strict):
    """Where accepted emails go: `file` writes .eml files to DIR/outbox, `smtp` talks to a server."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    kind: Literal["file", "smtp", "resend"] = "file"
    """Where emails go: `file` writes each one as an `.eml` file to the outbox, `smtp` hands it to an SMTP server,
    `resend` posts it to the Resend API."""
    host: str = "127.0.0.1"
    """`smtp`: the server's host name or address."""
    port: Count = Field(default=25, ge=1, le=65535)
    """`smtp`: the server's port (587 with `starttls`, 465 with `tls: implicit`)."""
    timeout_seconds: Number = Field(default=10.0, gt=0, le=600)
    """`smtp` and `resend`: seconds to wait for the provider before the outcome of a send is `unknown` (asked again
    later, never resent blindly)."""
    starttls: Flag = False
    """`smtp`: upgrade the connection with STARTTLS (verified against the system CAs or `ca_file`)."""
    tls: Literal["none", "implicit"] = "none"
    """`smtp`: `implicit` is TLS from the first byte (SMTPS, usually port 465); `none` is plain, or STARTTLS when
    `starttls` is true."""
    ca_file: str | None = None
    """`smtp`: a PEM CA bundle to verify the server against instead of the system store (a private CA)."""
    username_env: EnvName | None = None
    """`smtp`: the name of the environment variable holding the login user (never the value itself)."""
    password_env: EnvName | None = None
    """`smtp`: the name of the environment variable holding the password (never the password itself)."""
    allow_insecure_auth: Flag = False
    """`smtp`: allow a login over an unencrypted connection (refused unless this is true)."""
    from_address: str = Field(default="billing@example.com", alias="from")
    """Key `from`: the sender address of every email and the SMTP envelope sender; its domain names the Message-IDs."""
    from_name: str | None = Field(default=None, min_length=1, max_length=64)
    """The From header's display name (`Acme Billing <billing@example.com>`, RFC 2047-encoded when not ASCII)."""
    reply_to: str | None = None
    """A Reply-To address on every email (where customers' answers go)."""
    connections: Count = Field(default=4, ge=1, le=32)
    """`smtp` and `resend`: parallel connections used to send one batch."""
    max_consecutive_errors: Count = Field(default=5, ge=1, le=10_000)
    """Consecutive transport errors (connect, TLS, login, timeout, 421, dropped connection) after which the send stops
    and the run says why."""
    outbox_dir: str | None = Field(default=None, min_length=1, max_length=4096)
    """`file`: the directory the `.eml` files are written to (default: HOME/outbox)."""
    api_key_env: EnvName = "RESEND_API_KEY"
    """`resend`: the name of the environment variable holding the API key."""
    api_base: str = "https://api.resend.com"
    """`resend`: the API's base URL (https, or http to this machine only)."""
    idempotency_header: str | None = Field(default=None, pattern=r"^[A-Za-z0-9-]{1,64}$")
    """`smtp`: a relay that honours an idempotency header (Resend: `Resend-Idempotency-Key`; EmailEngine:
    `X-EE-Idempotency-Key`). When set, the key travels in it and `unknown` sends are resubmitted under it."""
    idempotency_window_hours: Number = Field(default=23.0, gt=0, le=24 * 30)
    """How long (wall clock, from the first attempt) an `unknown` send may be resubmitted under its key: within what
    the provider remembers (24 h for Resend), with an hour to spare."""

    @field_validator("from_address")
    @classmethod
    def _one_address(cls, value: str) -> str:
        if not is_address(value):  # the rule every recipient follows; the domain names our Message-IDs
            raise ValueError("provider.from must be one plain address such as billing@example.com")
        return value

    @field_validator("from_name")
    @classmethod
    def _plain_name(cls, value: str | None) -> str | None:
        if value is not None and (has_control(value) or not value.strip()):
            raise ValueError("provider.from_name must be a name on one line, without control characters")
        return value

    @field_validator("reply_to")
    @classmethod
    def _one_reply_address(cls, value: str | None) -> str | None:
        if value is not None and not is_address(value):
            raise ValueError("provider.reply_to must be one plain address such as billing@example.com")
        return value

    @field_validator("api_base")
    @classmethod
    def _api_base_http(cls, value: str) -> str:
        return http_url(value, "provider.api_base") or value

    @field_validator("idempotency_header")
    @classmethod
    def _not_a_structural_header(cls, value: str | None) -> str | None:
        if value is not None and (value.lower() in STRUCTURAL_HEADERS or value.lower().startswith("content-")):
            raise ValueError(
                "provider.idempotency_header must not be a header the message is built from (To, Cc, Bcc, From, "
                "Sender, Reply-To, Subject, Date, Message-ID, Content-*, MIME-Version, Received, Return-Path, "
                "DKIM-Signature)"
            )
        return value

    @property
    def resubmits_unknown(self) -> bool:
        """Whether the provider's idempotency contract makes resubmitting an `unknown` send safe."""
        return self.kind == "resend" or (self.kind == "smtp" and self.idempotency_header is not None)

    @property
    def settles_unknown(self) -> bool:
        """Whether a later run may settle an `unknown` outcome (a lookup or a resubmission that can answer); a plain
        SMTP server cannot be asked, so its unknowns wait for a human."""
        return self.kind != "smtp" or self.resubmits_unknown

    @model_validator(mode="after")
    def _transport_is_coherent(self) -> Provider:
        if self.starttls and self.tls == "implicit":
            raise ValueError("provider.starttls and provider.tls: implicit cannot both be set")
        if (
            self.kind == "smtp"
            and (self.username_env or self.password_env)
            and not self.starttls
            and self.tls == "none"
            and not self.allow_insecure_auth
        ):
            raise ValueError(
                "provider.username_env/password_env: credentials would be sent unencrypted; "
                "set provider.starttls: true or provider.tls: implicit, "
                "or provider.allow_insecure_auth: true to accept that"
            )
        return self

    @model_validator(mode="after")
    def _window_within_the_providers_memory(self) -> Provider:
        if self.resubmits_unknown and self.idempotency_window_hours > PROVIDER_KEY_MEMORY_HOURS:
            raise ValueError(
                f"provider.idempotency_window_hours: at most {PROVIDER_KEY_MEMORY_HOURS:g} (Resend, and relays with an "
                f"idempotency header, remember a key {PROVIDER_KEY_MEMORY_HOURS:g} h; a resubmission after that "
                "would be a second email)"
            )
        return self

    @property
    def message_domain(self) -> str:
        """The right-hand side of our Message-IDs: the sender's domain."""
        return self.from_address.rpartition("@")[2] or "dunning.invalid"

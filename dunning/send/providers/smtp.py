"""SMTP with the standard library, classifying every ending as sent, failed or unknown.

The envelope (MAIL, RCPT) and the DATA exchange are driven step by step so we
know what the server can have received: anything that goes wrong before the
server's `354` to DATA, or before the final `CRLF.CRLF` has left in full, is a
definite `failed` (an unterminated message is discarded); an explicit 4xx/5xx
reply is `failed` too; only a timeout or a dropped connection after the final
dot is `unknown`, because the server may have accepted it. The run's hand-over gate
(`dunning.send.handover`: journal, then the claim lease) is asked right before the final
data leaves. Each worker thread of a
small bounded pool keeps one connection open across messages and reopens it
after any error. After `max_consecutive_errors` transport errors in a row the
provider stops handing messages over (`released`): a dead server is not fed
every message of the run.

Transport security: with `starttls` the session is upgraded right after EHLO,
before any AUTH or MAIL, and a server that does not offer STARTTLS is a `failed` send,
never a fall back to plain text; with `tls: implicit` the connection is TLS
from the first byte (SMTPS). Either way the server's certificate chain is
verified against the system trust store, or only against `ca_file` when that is
set, and its name must match `host` (certificate and hostname are checked); a
verification failure is a `failed` send ("rejected before data"). Credentials
go out only after the handshake, and no error text carries their values; the
configuration refuses credentials over a plain connection unless
`allow_insecure_auth` says so.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import re
import smtplib
import ssl
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from email.message import Message
from email.parser import BytesHeaderParser
from email.utils import parseaddr
from pathlib import Path
from typing import Any

from dunning.config import Provider
from dunning.email.wire import WireEmail
from dunning.errors import ConfigError
from dunning.secret_env import read_secret
from dunning.send.providers.base import LEASE_ENDED, EmailProvider, HealthStop, SendOutcome
from dunning.vocabulary import ProviderStatus, SendStatus


class _Connection:
    """One SMTP session, reused for many messages by one thread."""

    def __init__(self, settings: Provider, credentials: tuple[str, str] | None, tls_context: ssl.SSLContext):
        self.settings = settings
        self.credentials = credentials
        self.tls_context = tls_context
        self.client: smtplib.SMTP | None = None

    def open(self) -> smtplib.SMTP:
        if self.client is None:
            host, port, timeout = self.settings.host, self.settings.port, self.settings.timeout_seconds
            if self.settings.tls == "implicit":
                client: smtplib.SMTP = smtplib.SMTP_SSL(host, port, timeout=timeout, context=self.tls_context)
            else:
                client = smtplib.SMTP(host, port, timeout=timeout)
            try:
                client.ehlo()
                if self.settings.starttls:
                    # raises SMTPNotSupportedError when STARTTLS is not offered: no plain-text fallback
                    client.starttls(context=self.tls_context)
                    client.ehlo()
                if self.credentials:
                    client.login(*self.credentials)
            except BaseException:
                client.close()
                raise
            self.client = client
        return self.client

    def drop(self) -> None:
        if self.client is not None:
            try:
                self.client.close()
            finally:
                self.client = None

    def reset(self) -> None:
        try:
            if self.client is not None:
                self.client.rset()
        except (smtplib.SMTPException, OSError):
            self.drop()

    def quit(self) -> None:
        if self.client is not None:
            with contextlib.suppress(smtplib.SMTPException, OSError):
                self.client.quit()
            self.drop()

    def send_bytes(
        self, to: str | Sequence[str], message_id: str, data: bytes,
        may_hand_over: Callable[[str], bool] = lambda _: True,
    ) -> SendOutcome:  # fmt: skip
        """One message to `to` (an address, or the `To` then the copies: one RCPT each). The `To` refused: the
        message fails; a copy refused: it goes to the others."""
        recipients = [to] if isinstance(to, str) else list(to)
        try:
            client = self.open()
            code, reply = client.mail(self.settings.from_address)
            if code != 250:
                raise smtplib.SMTPSenderRefused(code, reply, self.settings.from_address)
            for index, recipient in enumerate(recipients):
                code, reply = client.rcpt(recipient)
                if code not in (250, 251) and index == 0:
                    raise smtplib.SMTPRecipientsRefused({recipient: (code, reply)})
        except (smtplib.SMTPSenderRefused, smtplib.SMTPRecipientsRefused) as exc:
            self.reset()
            return SendOutcome(
                SendStatus.FAILED,
                message_id,
                f"rejected before data: {exc!r}"[:500],
                transport_error=_code_of(exc) == 421,
            )
        except ConnectionRefusedError:  # nothing listens there: said plainly, with the address the config names
            where = f"{self.settings.host}:{self.settings.port}"
            return self._lost(message_id, SendStatus.FAILED, f"connection refused by provider.host:port {where}", None)
        except (smtplib.SMTPException, OSError) as exc:  # connect, TLS, login, timeout, dropped connection
            return self._lost(message_id, SendStatus.FAILED, "rejected before data", exc)
        return self._data(client, message_id, data, may_hand_over)

    def _data(
        self, client: smtplib.SMTP, message_id: str, data: bytes, may_hand_over: Callable[[str], bool]
    ) -> SendOutcome:
        """DATA in three steps, so each failure is classified by what the server can have received.

        Until the server's `354` nothing of the message has left; until the
        final `CRLF.CRLF` has been written in full the server cannot accept
        it (an unterminated message is discarded): both are `failed`. Only a
        failure after the final dot leaves the server's answer unknown.
        """
        try:
            client.putcmd("data")
            code, reply = client.getreply()
        except (smtplib.SMTPException, OSError) as exc:
            return self._lost(message_id, SendStatus.FAILED, "no 354 to DATA, nothing handed over", exc)
        if code != 354:
            return self._refused(message_id, code, reply, "DATA refused")
        if not may_hand_over(message_id):  # journaled; past the lease nothing is sent: an unterminated DATA is void
            self.drop()
            return SendOutcome(SendStatus.RELEASED, message_id, LEASE_ENDED)
        try:
            client.send(_dot_terminated(data))  # sendall: raises unless every byte, the final dot included, left
        except (smtplib.SMTPException, OSError) as exc:
            return self._lost(message_id, SendStatus.FAILED, "connection lost before the final dot", exc)
        try:
            code, reply = client.getreply()
        except (smtplib.SMTPException, OSError) as exc:
            return self._lost(message_id, SendStatus.UNKNOWN, "no answer after the final dot", exc)
        if code != 250:
            return self._refused(message_id, code, reply, "data rejected")
        return SendOutcome(SendStatus.SENT, message_id)

    def _lost(self, message_id: str, status: ProviderStatus, what: str, exc: BaseException | None) -> SendOutcome:
        """The connection failed (a transport error): drop it, and say which side of the hand-over it was on."""
        self.drop()
        said = what if exc is None else f"{what}: {exc!r}"
        return SendOutcome(status, message_id, said[:500], transport_error=True)

    def _refused(self, message_id: str, code: int, reply: bytes, what: str) -> SendOutcome:
        if code == 421:  # the server is closing the session: a transport problem, and the connection is gone
            self.drop()
        else:
            self.reset()
        return SendOutcome(
            SendStatus.FAILED, message_id, f"{what}: {code} {reply!r}"[:500], transport_error=code == 421
        )


def _code_of(exc: smtplib.SMTPException) -> int | None:
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        return next(iter(exc.recipients.values()))[0]
    return getattr(exc, "smtp_code", None)


def _dot_terminated(data: bytes) -> bytes:
    """The message as the DATA phase carries it: CRLF line ends only, leading dots doubled, `CRLF.CRLF` after.

    Bare CR or LF never reach the wire (no SMTP smuggling of an early end of data).
    """
    lines = _EOL.sub(b"\r\n", data)
    quoted = _LEADING_DOT.sub(b"..", lines)
    if not quoted.endswith(b"\r\n"):
        quoted += b"\r\n"
    return quoted + b".\r\n"


_EOL = re.compile(rb"\r\n|\n|\r")
_LEADING_DOT = re.compile(rb"(?m)^\.")


class SmtpProvider(EmailProvider):
    name = "smtp"

    def __init__(self, settings: Provider):
        self.settings = settings
        self._credentials = self._read_credentials()
        self._tls_context = self._make_tls_context()
        self._local = threading.local()
        self._connections: list[_Connection] = []
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._health = HealthStop(settings.max_consecutive_errors, f"provider smtp {settings.host}:{settings.port}")

    def _read_credentials(self) -> tuple[str, str] | None:
        username, password = self.settings.username_env, self.settings.password_env
        if not username and not password:
            return None
        if not username or not password:
            missing = "username_env" if not username else "password_env"
            raise ConfigError(f"provider.{missing}: not configured (username_env and password_env go together)")
        # stripped, checked, masked in every text (`secret_env`); errors name the variable, never a value
        user = read_secret(username, "provider.username_env", masked=False)  # a name, not a secret
        return user, read_secret(password, "provider.password_env")

    def _make_tls_context(self) -> ssl.SSLContext:
        """One verifying context for every connection: certificate chain and hostname (check_hostname stays on)."""
        ca_file = self.settings.ca_file
        if ca_file is not None and not Path(ca_file).is_file():
            raise ConfigError(f"provider.ca_file: file not found: {ca_file}")
        try:
            return ssl.create_default_context(cafile=ca_file)
        except OSError as exc:  # ssl.SSLError for a file that holds no PEM certificate
            raise ConfigError(f"provider.ca_file: not a usable PEM CA bundle: {ca_file} ({exc})") from None

    def _connection(self) -> _Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = _Connection(self.settings, self._credentials, self._tls_context)
            with self._lock:
                self._connections.append(connection)
        return connection

    takes_wire = True

    def send(self, message: Message) -> SendOutcome:
        if self.stopped_reason is not None:
            return SendOutcome(
                SendStatus.RELEASED, message["Message-ID"], f"not handed over: {self.stopped_reason}"[:500]
            )
        return self.send_wire(WireEmail.of(message))

    def send_wire(self, email: WireEmail) -> SendOutcome:
        if self.stopped_reason is not None:
            return SendOutcome(SendStatus.RELEASED, email.message_id, f"not handed over: {self.stopped_reason}"[:500])
        header = self.settings.idempotency_header
        if header is None:
            outcome = self._connection().send_bytes(email.recipients, email.message_id, email.data, self.may_hand_over)
        else:  # a relay with an idempotency contract: the key travels in its header, the bytes are kept if unknown
            data = email.with_header(header, email.idempotency_key)
            outcome = self._connection().send_bytes(email.recipients, email.message_id, data, self.may_hand_over)
            if outcome.status == SendStatus.UNKNOWN:
                outcome = dataclasses.replace(outcome, payload=base64.b64encode(data).decode("ascii"))
        self._count(outcome)
        return outcome

    def resubmit(self, payload: str, idempotency_key: str, message_id: str) -> SendOutcome:
        """The kept bytes again, key header included, to the same relay: it answers with the first result."""
        if self.stopped_reason is not None:
            return SendOutcome(SendStatus.UNKNOWN, message_id, f"not resubmitted: {self.stopped_reason}"[:500])
        data = base64.b64decode(payload)
        to = parseaddr(str(BytesHeaderParser().parsebytes(data)["To"]))[1]  # the envelope takes the bare address
        outcome = self._connection().send_bytes(to, message_id, data, self.may_hand_over)
        if outcome.status == SendStatus.RELEASED:  # a resubmission that did not go stays what it was
            outcome = dataclasses.replace(outcome, status=SendStatus.UNKNOWN)
        if outcome.status == SendStatus.UNKNOWN:
            outcome = dataclasses.replace(outcome, payload=payload)
        self._count(outcome)
        return outcome

    def _count(self, outcome: SendOutcome) -> None:
        """The health stop: after `max_consecutive_errors` transport errors in a row, hand nothing more over."""
        reason = self._health.count(outcome)
        if reason is not None and self.stopped_reason is None:
            self.stopped_reason = reason

    def send_many(self, messages: Iterable[Message]) -> list[SendOutcome]:
        return self._concurrently(self.send, messages)

    def send_many_wire(self, emails: Iterable[WireEmail]) -> list[SendOutcome]:
        return self._concurrently(self.send_wire, emails)

    def _concurrently(self, send: Callable[[Any], SendOutcome], items: Iterable[Any]) -> list[SendOutcome]:
        """Outcomes in order; with several connections, each worker thread sends on its own."""
        if self.settings.connections == 1:
            return [send(item) for item in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.settings.connections, thread_name_prefix="smtp")
        return list(self._pool.map(send, items))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        with self._lock:
            for connection in self._connections:
                connection.quit()
            self._connections.clear()

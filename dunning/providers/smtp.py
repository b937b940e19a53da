"""SMTP with the standard library, classifying every ending as sent, failed or unknown.

The envelope (MAIL, RCPT) and the DATA exchange are driven step by step so we
know whether the message content was handed over: anything that goes wrong
before that is a definite `failed`; an explicit 4xx/5xx reply to the data is
`failed` too; a timeout or a dropped connection once the data is on its way
is `unknown`, because the server may have accepted it. Each worker thread of a
small bounded pool keeps one connection open across messages and reopens it
after any error.
"""

from __future__ import annotations

import os
import smtplib
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from email.message import Message
from typing import Iterable

from dunning.config import Provider
from dunning.errors import ConfigError
from dunning.providers.base import EmailProvider, SendOutcome
from dunning.render import WIRE_POLICY


class _Connection:
    """One SMTP session, reused for many messages by one thread."""

    def __init__(self, settings: Provider, credentials: tuple[str, str] | None):
        self.settings = settings
        self.credentials = credentials
        self.client: smtplib.SMTP | None = None

    def open(self) -> smtplib.SMTP:
        if self.client is None:
            client = smtplib.SMTP(self.settings.host, self.settings.port, timeout=self.settings.timeout_seconds)
            try:
                client.ehlo()
                if self.settings.starttls:
                    client.starttls()
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
            try:
                self.client.quit()
            except (smtplib.SMTPException, OSError):
                pass
            self.drop()

    def send(self, message: Message) -> SendOutcome:
        message_id = message["Message-ID"]
        try:
            client = self.open()
            code, reply = client.mail(self.settings.from_address)
            if code != 250:
                raise smtplib.SMTPSenderRefused(code, reply, self.settings.from_address)
            code, reply = client.rcpt(message["To"])
            if code not in (250, 251):
                raise smtplib.SMTPRecipientsRefused({message["To"]: (code, reply)})
        except (smtplib.SMTPException, OSError) as exc:
            self.drop()
            return SendOutcome("failed", message_id, f"rejected before data: {exc!r}"[:500])
        try:
            code, reply = client.data(message.as_bytes(policy=WIRE_POLICY))
            if code != 250:  # smtplib returns the final reply to the data instead of raising
                raise smtplib.SMTPDataError(code, reply)
        except smtplib.SMTPDataError as exc:
            self.reset()
            return SendOutcome("failed", message_id, f"data rejected: {exc.smtp_code} {exc.smtp_error!r}"[:500])
        except (socket.timeout, smtplib.SMTPServerDisconnected, OSError, smtplib.SMTPException) as exc:
            self.drop()
            return SendOutcome("unknown", message_id, f"no answer after data was handed over: {exc!r}"[:500])
        return SendOutcome("sent", message_id)


class SmtpProvider(EmailProvider):
    name = "smtp"

    def __init__(self, settings: Provider):
        self.settings = settings
        self._credentials = self._read_credentials()
        self._local = threading.local()
        self._connections: list[_Connection] = []
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def _read_credentials(self) -> tuple[str, str] | None:
        names = (self.settings.username_env, self.settings.password_env)
        if not any(names):
            return None
        values = tuple(os.environ.get(n or "") for n in names)
        missing = [n for n, v in zip(names, values) if not v]
        if missing:
            raise ConfigError(f"provider: environment variable(s) {', '.join(str(m) for m in missing)} not set")
        return values  # type: ignore[return-value]

    def _connection(self) -> _Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = _Connection(self.settings, self._credentials)
            with self._lock:
                self._connections.append(connection)
        return connection

    def send(self, message: Message) -> SendOutcome:
        return self._connection().send(message)

    def send_many(self, messages: Iterable[Message]) -> list[SendOutcome]:
        if self.settings.connections == 1:
            return [self.send(m) for m in messages]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.settings.connections, thread_name_prefix="smtp")
        return list(self._pool.map(self.send, messages))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        with self._lock:
            for connection in self._connections:
                connection.quit()
            self._connections.clear()

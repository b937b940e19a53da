"""SMTP with the standard library, classifying every ending as sent, failed or unknown.

The envelope (MAIL, RCPT) and the DATA exchange are driven step by step so we
know whether the message content was handed over: anything that goes wrong
before that is a definite `failed`; an explicit 4xx/5xx reply to the data is
`failed` too; a timeout or a dropped connection once the data is on its way
is `unknown`, because the server may have accepted it. One connection is
reused across messages and reopened after any error.
"""

from __future__ import annotations

import os
import smtplib
import socket
from email.message import EmailMessage
from email.policy import SMTP as SMTP_POLICY

from dunning.config import Provider
from dunning.errors import ConfigError
from dunning.providers.base import EmailProvider, SendOutcome


class SmtpProvider(EmailProvider):
    name = "smtp"

    def __init__(self, settings: Provider):
        self.settings = settings
        self._client: smtplib.SMTP | None = None
        self._credentials = self._read_credentials()

    def _read_credentials(self) -> tuple[str, str] | None:
        names = (self.settings.username_env, self.settings.password_env)
        if not any(names):
            return None
        values = tuple(os.environ.get(n or "") for n in names)
        missing = [n for n, v in zip(names, values) if not v]
        if missing:
            raise ConfigError(f"provider: environment variable(s) {', '.join(str(m) for m in missing)} not set")
        return values  # type: ignore[return-value]

    def _connect(self) -> smtplib.SMTP:
        if self._client is None:
            client = smtplib.SMTP(self.settings.host, self.settings.port, timeout=self.settings.timeout_seconds)
            try:
                client.ehlo()
                if self.settings.starttls:
                    client.starttls()
                    client.ehlo()
                if self._credentials:
                    client.login(*self._credentials)
            except BaseException:
                client.close()
                raise
            self._client = client
        return self._client

    def _drop(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None

    def send(self, message: EmailMessage) -> SendOutcome:
        message_id = message["Message-ID"]
        try:
            client = self._connect()
            code, reply = client.mail(self.settings.from_address)
            if code != 250:
                raise smtplib.SMTPSenderRefused(code, reply, self.settings.from_address)
            code, reply = client.rcpt(message["To"])
            if code not in (250, 251):
                raise smtplib.SMTPRecipientsRefused({message["To"]: (code, reply)})
        except (smtplib.SMTPException, OSError) as exc:
            self._drop()
            return SendOutcome("failed", message_id, f"rejected before data: {exc!r}"[:500])
        try:
            client.data(message.as_bytes(policy=SMTP_POLICY))
        except smtplib.SMTPDataError as exc:
            self._reset()
            return SendOutcome("failed", message_id, f"data rejected: {exc.smtp_code} {exc.smtp_error!r}"[:500])
        except (socket.timeout, smtplib.SMTPServerDisconnected, OSError, smtplib.SMTPException) as exc:
            self._drop()
            return SendOutcome("unknown", message_id, f"no answer after data was handed over: {exc!r}"[:500])
        return SendOutcome("sent", message_id)

    def _reset(self) -> None:
        try:
            if self._client is not None:
                self._client.rset()
        except (smtplib.SMTPException, OSError):
            self._drop()

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.quit()
            except (smtplib.SMTPException, OSError):
                pass
            self._drop()

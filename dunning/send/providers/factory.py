"""Builds the configured provider; the one place that maps `provider.kind` to a class."""

from __future__ import annotations

from pathlib import Path

from dunning.config import Provider
from dunning.send.providers.base import EmailProvider
from dunning.send.providers.file_outbox import FileOutbox
from dunning.send.providers.smtp import SmtpProvider


def build_provider(settings: Provider, home: Path) -> EmailProvider:
    if settings.kind == "smtp":
        return SmtpProvider(settings)
    if settings.kind == "resend":  # imported here: the SDK is a tenth of a second of every run's start otherwise
        from dunning.send.providers.resend_api import ResendProvider

        return ResendProvider(settings)
    # a relative outbox_dir is under the home, whatever directory the command was started from
    return FileOutbox(home / Path(settings.outbox_dir).expanduser() if settings.outbox_dir else home / "outbox")

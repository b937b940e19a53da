"""The default provider: each accepted email is one `.eml` file in DIR/outbox.

Files are written to a temporary name and renamed into place, so an email is
either wholly in the outbox or not at all; the name derives from the
Message-ID, so `lookup` can answer whether a message was accepted after a
crash, and a repeated write of the same message replaces rather than adds.
"""

from __future__ import annotations

import os
import re
from email.message import Message
from pathlib import Path

from dunning.providers.base import EmailProvider, SendOutcome, Status
from dunning.render import WIRE_POLICY


def _file_name(message_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", message_id.strip("<>")) + ".eml"


class FileOutbox(EmailProvider):
    name = "file"

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def path_for(self, message_id: str) -> Path:
        return self.directory / _file_name(message_id)

    def send(self, message: Message) -> SendOutcome:
        message_id = message["Message-ID"]
        target = self.path_for(message_id)
        temporary = target.with_suffix(".eml.partial")
        try:
            temporary.write_bytes(message.as_bytes(policy=WIRE_POLICY))
            os.replace(temporary, target)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            return SendOutcome("failed", message_id, f"outbox write failed: {exc}")
        return SendOutcome("sent", message_id)

    def lookup(self, message_id: str) -> Status | None:
        return "sent" if self.path_for(message_id).exists() else "failed"

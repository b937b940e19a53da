"""The default provider: each accepted email is one `.eml` file in DIR/outbox.

Files are written to a temporary name and renamed into place, so an email is
either wholly in the outbox or not at all; the name derives from the
Message-ID, so `lookup` can answer whether a message was accepted after a
crash, and a repeated write of the same message replaces rather than adds.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
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
        self._pool: ThreadPoolExecutor | None = None

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

    def send_many(self, messages: list[Message]) -> list[SendOutcome]:
        """Writes a chunk with a few threads: file creation waits on the disk, not on the interpreter."""
        if len(messages) < 8:
            return [self.send(m) for m in messages]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="outbox")
        return list(self._pool.map(self.send, messages))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def lookup(self, message_id: str) -> Status | None:
        return "sent" if self.path_for(message_id).exists() else "failed"

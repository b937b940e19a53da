"""The default provider: each accepted email is one `.eml` file in DIR/outbox.

Files are written to a temporary name (created new, 0600, never through a
link) and renamed into place within the directory, so an email is either wholly
in the outbox or not at all; the name derives from the
Message-ID, so `lookup` can answer whether a message was accepted after a
crash, and a repeated write of the same message replaces rather than adds.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from email.message import Message
from pathlib import Path

from dunning.email.wire import WireEmail, wire_bytes
from dunning.private_files import private_dir
from dunning.send.providers.base import LEASE_ENDED, EmailProvider, SendOutcome
from dunning.vocabulary import LookupStatus, SendStatus

WRITES_PER_HANDOFF = 16  # emails given to the writer thread at once
MAX_STEM = 200  # file systems allow 255 bytes per name; the Message-ID's domain comes from config


UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9_.-]")
# a new file only, never through a link planted at its name: a symlink at `<name>.eml.partial` made the write
# overwrite its target
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def file_name(message_id: str) -> str:
    stem = UNSAFE_IN_NAME.sub("_", message_id.strip("<>"))
    if len(stem) > MAX_STEM:
        stem = stem[: MAX_STEM - 17] + "_" + hashlib.sha256(stem.encode()).hexdigest()[:16]
    return stem + ".eml"


def _create(temporary: str) -> int:
    """The temporary file, created new (0600, never through a link); one left by a crash, or planted, is removed
    first (unlinking a symlink removes the link, not its target)."""
    try:
        return os.open(temporary, NEW_FILE, 0o600)
    except FileExistsError:
        os.unlink(temporary)
        return os.open(temporary, NEW_FILE, 0o600)


class FileOutbox(EmailProvider):
    name = "file"
    takes_wire = True

    def __init__(self, directory: str | Path):
        self.directory = private_dir(directory)  # the emails name customers and what they owe
        self._directory = str(self.directory)
        self._writer: ThreadPoolExecutor | None = None

    def pool_outbox(self) -> str:
        return str(self.directory)

    def path_for(self, message_id: str) -> Path:
        return self.directory / file_name(message_id)

    def send(self, message: Message) -> SendOutcome:
        return self._write(message["Message-ID"], wire_bytes(message))

    def send_wire(self, email: WireEmail) -> SendOutcome:
        return self._write(email.message_id, email.data)

    def _write(self, message_id: str, data: bytes) -> SendOutcome:
        """The file's bytes under a temporary name, then renamed into place. Plain `os` calls, not `Path.write_bytes`:
        its buffered file object makes more system calls and pathlib's own work, and together they were half
        of an email's cost in the outbox (`bench/RESULTS.md`, 2026-12-01, writes on disk)."""
        if not self.may_hand_over(message_id):
            return SendOutcome(SendStatus.RELEASED, message_id, LEASE_ENDED)
        target = os.path.join(self._directory, file_name(message_id))
        temporary = target + ".partial"
        try:
            descriptor = _create(temporary)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(descriptor, view) :]
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, temporary) from exc  # name the file, as open() does
            finally:
                os.close(descriptor)
            os.replace(temporary, target)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            return SendOutcome(SendStatus.FAILED, message_id, f"outbox write failed: {exc}")
        return SendOutcome(SendStatus.SENT, message_id)

    def send_many(self, messages: Iterable[Message]) -> list[SendOutcome]:
        """Serializes on the caller's thread and writes on one writer thread, so rendering and disk overlap.

        One writer, not several: creating and renaming files in one directory
        serializes on the directory anyway, and on this project's benchmark
        machine four writer threads were up to 4x slower than one.
        """
        return self._write_all((m["Message-ID"], wire_bytes(m)) for m in messages)

    def send_many_wire(self, emails: Iterable[WireEmail]) -> list[SendOutcome]:
        """As `send_many`, for emails a render pool built: written on the writer thread as they arrive."""
        return self._write_all((e.message_id, e.data) for e in emails)

    def _write_all(self, items: Iterable[tuple[str, bytes]]) -> list[SendOutcome]:
        """Every item written in order on the writer thread, handed to it a few at a time (a future per email was
        a tenth of the send's time in the run's process)."""
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox")
        pending, batch = [], []
        for item in items:
            batch.append(item)
            if len(batch) == WRITES_PER_HANDOFF:
                pending.append(self._writer.submit(self._write_batch, batch))
                batch = []
        if batch:
            pending.append(self._writer.submit(self._write_batch, batch))
        return [outcome for f in pending for outcome in f.result()]

    def _write_batch(self, batch: list[tuple[str, bytes]]) -> list[SendOutcome]:
        return [self._write(message_id, data) for message_id, data in batch]

    def close(self) -> None:
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None

    def lookup(self, message_id: str, provider_message_id: str | None = None) -> LookupStatus | None:
        return SendStatus.SENT if self.path_for(message_id).exists() else SendStatus.FAILED

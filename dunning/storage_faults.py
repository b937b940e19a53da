"""Which errors are storage failures: a full disk, a quota, a read-only file system, a failing disk.

Told by errno where the exception is still there, by message where only its text
is left (a step's error as Dagster recorded it). The CLI names the file and exits 8
(`errors.StorageError`); the send loop lets such an error through as it is, where a
ledger that failed otherwise is `errors.LedgerLost` (exit 4).
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass

# what the operator reads of each, and whether SQLite (the Dagster instance) said it
STORAGE_ERRNOS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
}
_STORAGE_MESSAGES = (  # (lower-case text in the message, reason, said by SQLite)
    ("no space left on device", "no space left on device", False),
    ("os error 28", "no space left on device", False),
    ("database or disk is full", "no space left on device (database or disk is full)", True),
    ("disk quota exceeded", "disk quota exceeded", False),
    ("read-only file system", "read-only file system", False),
    ("attempt to write a readonly database", "read-only database", True),
    ("disk i/o error", "disk I/O error (a full or failing disk)", True),
)
_QUOTED_PATH = re.compile(r"""["'](/[^"'\n]+)["']""")


@dataclass(frozen=True)
class StorageFault:
    reason: str
    path: str | None  # the file or directory named by the error, when it names one
    kind: str  # "sqlite" (the Dagster instance), "duckdb" (the ledger) or "file"


def storage_fault(message: str, cls_name: str = "") -> StorageFault | None:
    """The storage failure an error's text describes, or None for any other error."""
    text = (message or "").lower()
    matched = next(((reason, by_sqlite) for needle, reason, by_sqlite in _STORAGE_MESSAGES if needle in text), None)
    if matched is None:
        return None
    reason, said_by_sqlite = matched
    if said_by_sqlite or "sqlite" in text or "sqlite" in cls_name.lower():
        return StorageFault(reason, None, "sqlite")  # its text can quote SQL parameters, never the database's path
    kind = "duckdb" if "duckdb" in cls_name.lower() or text.startswith(("io error:", "fatal error:")) else "file"
    path = _QUOTED_PATH.search(message)
    return StorageFault(reason, path.group(1) if path else None, kind)


def storage_fault_of(error: BaseException) -> StorageFault | None:
    """The storage failure behind an exception (itself, its cause or its context), or None."""
    pending: list[BaseException | None] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in STORAGE_ERRNOS:
            path = str(current.filename) if current.filename else None
            return StorageFault(STORAGE_ERRNOS[current.errno], path, "file")
        found = storage_fault(str(current), f"{type(current).__module__}.{type(current).__name__}")
        if found is not None:
            return found
        pending += [current.__cause__, current.__context__]
    return None

"""The bench's scratch files are deleted after its timed runs, not between them: `discard` renames, `empty` deletes.

On an ext4 file system without a journal (the benchmark VM's disk), the
kernel's inode allocator passes over inodes freed in the last 60 seconds (360
while their inode-table block is not yet written back: `recently_deleted` in
fs/ext4/ialloc.c), and scans the whole block group for every new file while
such inodes fill it. Creating 70,000 files the outbox's way took 6.6 s in a
fresh directory and 52 s (49 s of it in the kernel) right after deleting
70,000 others (`bench/RESULTS.md`, 2026-12-01T14:00). The bench used to delete
each run's outbox just before the next run, which made the 1M full cycle
bimodal (about 31 s or 65 s). A deployment does not delete tens of thousands
of files in the minute before each run, so the bench does not either: a
run's scratch is renamed aside, which frees no inode, and deleted when the
bench ends.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

TRASH_NAME = ".bench-trash"  # beside what it holds, so the rename stays on one file system
_trashes: set[Path] = set()


def discard(path: Path) -> None:
    """Move `path` (a file or a directory tree, if it exists) out of the way, to be deleted by `empty`."""
    if not path.exists() and not path.is_symlink():
        return
    trash = path.parent / TRASH_NAME
    trash.mkdir(exist_ok=True)
    path.rename(trash / f"{path.name}-{uuid.uuid4().hex[:12]}")
    _trashes.add(trash)


def empty(*roots: Path) -> None:
    """Delete everything `discard` moved aside (the bench's last step, after every timed run): what this process
    discarded, and the trash directly under each of `roots` (where the bench's child processes discarded)."""
    for trash in sorted(_trashes | {root / TRASH_NAME for root in roots}):
        shutil.rmtree(trash, ignore_errors=True)
    _trashes.clear()

"""The hand-over: what may still be given to a provider, and the journal of what was.

A claimed key whose run dies is in one of two states the ledger cannot tell
apart: its email was handed to the provider (it may have gone: `unknown`) or
it never was (it is safe to send: `failed`). Marking every such key `unknown`
left hundreds of keys for a human after one crash, most of them never sent.

So a run writes one line per email, its Message-ID, to an append-only journal
(`HOME/journal/{run_id}.journal`) just before the point from which the
provider may accept it (the SMTP envelope, the HTTP request, the outbox file),
and then checks its claim lease. A later run that expires the dead run's
claims reads the journal: keys of emails named there become `unknown`, the
others `failed` without counting an attempt, retried like any failure.

Why the order and why no fsync. A `write` to a file is in the kernel's page
cache when it returns, and a process's death does not take the page cache
with it, so on the same boot the journal is complete. Across a reboot it may
not be: the journal names the boot it was written in (`/proc/sys/kernel/random/
boot_id`) and a journal from another boot, like a missing one (another home,
another machine), is not trusted: every claim becomes `unknown`, as before.
The line is written before the lease check: a run that expires claims after
their lease ended either finds the line, or the line was written after the
lease ended, and then the check that follows it refuses the hand-over. One
`write` per email costs a few microseconds (`bench/RESULTS.md`).

The deadline is the claim lease as this run last wrote it, less a margin for
clocks that differ between machines. Nothing is handed over, and no render
worker writes into the outbox, after it: a stalled run whose claims another
run took over must not send them. It lives in shared memory, so the render
pool's workers (`dunning.send.render_pool`) read the same value the run renews.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import multiprocessing
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
JOURNAL_DIR = "journal"  # under the home
HEADER = "dunning-journal 1"
SUFFIX = ".journal"
_SAFE_RUN = re.compile(r"[^A-Za-z0-9_.:-]")
MAX_MARGIN_SECONDS = 60.0


def boot_id() -> str | None:
    """This boot's id (Linux), or None where the system gives none (then no journal is ever trusted)."""
    try:
        return Path(BOOT_ID_FILE).read_text().strip() or None
    except OSError:
        return None


def journal_path(directory: str | Path, run_id: str) -> Path:
    return Path(directory) / (_SAFE_RUN.sub("_", run_id) + SUFFIX)


class Deadline:
    """The wall-clock time (epoch seconds) after which nothing may be handed over; shared with worker processes.
    It starts unlimited (no claim yet holds a lease)."""

    def __init__(self, value: Any | None = None) -> None:
        self._shared = value if value is not None else multiprocessing.get_context("spawn").RawValue("d", math.inf)

    @property
    def shared(self) -> Any:
        """The shared value, to give a worker process when it starts."""
        return self._shared

    def until(self, lease_until: dt.datetime, lease: dt.timedelta, now: dt.datetime) -> None:
        """Hand over only until `lease_until` (on the run's clock `now`), less a tenth of the lease (at most a
        minute) for clocks that differ between machines. Kept as this machine's wall-clock time, which workers read."""
        self._shared.value = self._wall(lease_until, lease, now)

    def cap(self, lease_until: dt.datetime, lease: dt.timedelta, now: dt.datetime) -> None:
        """As `until`, but never later than the deadline already set: a new chunk's lease is later than those
        claimed before it, which are renewed only together (`renew_leases`)."""
        self._shared.value = min(float(self._shared.value), self._wall(lease_until, lease, now))

    @staticmethod
    def _wall(lease_until: dt.datetime, lease: dt.timedelta, now: dt.datetime) -> float:
        margin = min(lease.total_seconds() / 10, MAX_MARGIN_SECONDS)
        return time.time() + (lease_until - now).total_seconds() - margin

    def stop(self) -> None:
        """Nothing more, from now on (the ledger failed: no outcome could be recorded)."""
        self._shared.value = -math.inf

    def passed(self, now: Callable[[], float] = time.time) -> bool:
        return now() >= float(self._shared.value)


class HandOverGate:
    """What a provider asks right before handing an email over: journal it, then may it still go?"""

    def __init__(self, deadline: Deadline, journal: str | Path | None = None) -> None:
        self.deadline = deadline
        self.journal = str(journal) if journal is not None else None
        self._fd: int | None = None
        if self.journal is not None:
            self._fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def may_hand_over(self, message_id: str) -> bool:
        """True when the email may go now; its Message-ID is in the journal before this returns either way."""
        if self._fd is not None:
            os.write(self._fd, (message_id.replace("\n", " ") + "\n").encode("utf-8", "replace"))
        return not self.deadline.passed()

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def open_journal(directory: str | Path, run_id: str) -> Path:
    """Start `run_id`'s journal (before its first claim): the directory private, the header naming this boot."""
    folder = Path(directory)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = journal_path(folder, run_id)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if os.fstat(fd).st_size == 0:  # a re-executed step appends to its run's journal
            os.write(fd, f"{HEADER} boot {boot_id() or '-'} run {run_id}\n".encode())
    finally:
        os.close(fd)
    return path


def read_journal(directory: str | Path, run_id: str) -> set[str] | None:
    """The Message-IDs `run_id` may have handed over, or None when its journal cannot be trusted: missing, or
    written on another boot (a machine crash may have lost its last lines). A last line without its line end was
    being written when the run died, before that email's hand-over began: it is left out."""
    try:
        text = journal_path(directory, run_id).read_bytes().decode("utf-8", "replace")
    except OSError:
        return None
    lines = text.split("\n")
    header = lines[0].split()
    current = boot_id()
    if len(header) < 4 or " ".join(header[:2]) != HEADER or current is None or header[3] != current:
        return None
    return {line for line in lines[1:-1] if line}


def remove_journal(directory: str | Path, run_id: str) -> None:
    """Every outcome of the run is recorded: its journal has nothing more to tell."""
    with contextlib.suppress(OSError):
        journal_path(directory, run_id).unlink()


def prune_journals(directory: str | Path, older_than: dt.timedelta = dt.timedelta(days=30)) -> int:
    """Journals of runs long settled (their claims were expired by a later run): removed."""
    folder = Path(directory)
    if not folder.is_dir():
        return 0
    cutoff = time.time() - older_than.total_seconds()
    removed = 0
    for path in folder.glob("*" + SUFFIX):
        with contextlib.suppress(OSError):
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
    return removed

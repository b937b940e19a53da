"""An in-memory DuckDB kept per DuckDB file in a process, that the file is ATTACHed to for as long as a block needs it.

Opening a DuckDB file with `duckdb.connect` starts a database instance: about 23 ms of CPU registering DuckDB's
built-in functions, even for `:memory:`, before the file is read, and a run opened the ledger nine times. The
instance here starts once per file and process; a block then `ATTACH`es the file (about 3 ms), works on a cursor of
its own whose default database is that file (`USE`), and `DETACH`es it when the last block in the process that
holds it ends. The file's lock goes with the DETACH exactly as it went with `close()`: another process (a `dunning
pause`, a daemon's run, an analyst) can take the file between two steps of a run, as before. What is kept is an
instance with no file in it, never a file held open.

One instance per file, not one per process, so that each keeps what `duckdb.connect(path)` gave: spill files next
to the file (`temp_directory`), its own `memory_limit`, and a failure that only its own file's blocks see. An
instance with no block is kept for the next (at most `IDLE_KEPT` of them; the least recently used is closed).

Two rules for callers: a block's connection is a cursor whose default database is the file, and a cursor made
from it (`con.cursor()`) is not (its default is the instance's empty memory database: open the file again
instead, which joins the attachment); and while a block holds a file, `duckdb.connect` of the same file in this
process is refused by DuckDB (one handle per file and process); a `duckdb.connect` made first is joined instead
(`connect` falls back to it). A child forked while an instance exists starts instances of its own and never
touches, nor destroys, its parent's (their threads did not come along).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb

from dunning.ledger.sql import quote_identifier, sql_string

IDLE_KEPT = 8  # instances with no block kept per process: a few MB each (a test worker touches hundreds of homes)
ALIAS = "attached_file"


@dataclasses.dataclass
class _Host:
    con: duckdb.DuckDBPyConnection
    read_only: bool = False
    users: int = 0


_lock = threading.Lock()
_owner: int | None = None  # the thread inside `_locked`
_pending: list[tuple[str, _Host]] = []  # detaches asked for by that same thread meanwhile (below)
_hosts: collections.OrderedDict[str, _Host] = collections.OrderedDict()
_inherited: list[_Host] = []


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """The bookkeeping's lock. A block abandoned without its end runs its end when the garbage collector finds it,
    which can be in this same thread while it holds the lock: that end is queued (`_detach`) and done here, just
    before the lock is let go, rather than waiting forever on a lock its own thread holds."""
    global _owner
    with _lock:
        _owner = threading.get_ident()
        try:
            yield
            while _pending:
                _release(*_pending.pop())
        finally:
            _owner = None


def _forget_parents_instances() -> None:
    """In a forked child: the parent's instances are left alone for good (their destructor would wait on threads
    that are not in this process, or crash at exit), and the lock starts free."""
    global _lock, _owner
    for host in _hosts.values():
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(host.con))  # never destroyed, not even at interpreter exit
        _inherited.append(host)
    _hosts.clear()
    _pending.clear()
    _lock, _owner = threading.Lock(), None


if hasattr(os, "register_at_fork"):  # no fork where there is none (Windows)
    os.register_at_fork(after_in_child=_forget_parents_instances)


def _close(host: _Host) -> None:
    with contextlib.suppress(duckdb.Error):
        host.con.close()


def _trim(keep: str) -> None:
    """Close the least recently used instances with no block beyond `IDLE_KEPT`."""
    idle = [k for k, h in list(_hosts.items()) if h.users == 0 and k != keep]
    for stale in idle[: max(0, len(idle) - IDLE_KEPT)]:
        _close(_hosts.pop(stale))


def _host_for(key: str) -> _Host:
    host = _hosts.get(key)
    if host is None:
        host = _hosts[key] = _Host(duckdb.connect(":memory:", config={"temp_directory": key + ".tmp"}))
        _trim(keep=key)
    _hosts.move_to_end(key)
    return host


def _attach(key: str, read_only: bool) -> _Host:
    with _locked():
        host = _host_for(key)
        if host.users == 0:
            # TYPE duckdb: a file of another kind at the path (SQLite's) is refused, never opened through an
            # extension DuckDB would load for it
            options = " (TYPE duckdb, READ_ONLY)" if read_only else " (TYPE duckdb)"
            try:
                host.con.execute(f"ATTACH {sql_string(key)} AS {quote_identifier(ALIAS)}{options}")
            except duckdb.IOException:
                raise  # a lock another process holds, a file that is not DuckDB's: the instance is fine
            except duckdb.Error:
                _close(_hosts.pop(key))  # whatever went wrong, the next block starts afresh
                raise
            host.read_only = read_only
        elif host.read_only != read_only:
            held = "read-only" if host.read_only else "for writing"
            raise duckdb.ConnectionException(f"{key} is open {held} in this process until that block ends")
        host.users += 1
        return host


def _detach(key: str, host: _Host) -> None:
    if _owner == threading.get_ident():  # the garbage collector ending an abandoned block inside `_locked`
        _pending.append((key, host))
        return
    with _locked():
        _release(key, host)


def _release(key: str, host: _Host) -> None:
    host.users -= 1
    if host.users > 0 or _hosts.get(key) is not host:
        return
    try:
        host.con.execute(f"DETACH {quote_identifier(ALIAS)}")  # checkpoints and releases the file's lock
    except duckdb.Error:
        # a checkpoint that failed (a full disk) loses nothing: every commit is in the write-ahead log, replayed by
        # the next open. Closing the instance releases the file all the same; raising here would hide the error
        # the block itself is ending with
        _close(_hosts.pop(key))
        return
    _trim(keep=key)


@contextlib.contextmanager
def attached(path: Path, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection whose default database is the file at `path`, for the block; the file is attached to its
    instance while any block of this process holds it. Raises as `duckdb.connect` does (IOException: another
    process holds the file's lock, or it is not a DuckDB file), and ResourceInUseException when this process has
    the file open through `duckdb.connect`."""
    key = os.path.realpath(path)  # one instance per file, however its path is spelled (a symlinked home)
    host = _attach(key, read_only)
    try:
        cursor = host.con.cursor()
        try:
            cursor.execute(f"USE {quote_identifier(ALIAS)}")
            yield cursor
        finally:
            cursor.close()  # an open transaction of the block is rolled back, as `close()` did
    finally:
        _detach(key, host)

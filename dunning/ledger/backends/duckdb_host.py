"""One in-memory DuckDB per process, that each DuckDB file is ATTACHed to for as long as a block needs it.

Opening a DuckDB file with `duckdb.connect` starts a database instance: about 23 ms of CPU registering DuckDB's
built-in functions, even for `:memory:`, before the file is read, and a run opened the ledger nine times. The
instance here starts once per process; a block then `ATTACH`es the file (about 3 ms), works on a cursor of its own
whose default database is that file (`USE`), and `DETACH`es it when the last block in the process that holds it
ends. The file's lock goes with the DETACH exactly as it went with `close()`: another process (a `dunning pause`, a
daemon's run, an analyst) can take the file between two steps of a run, as before. What is shared is only DuckDB's
catalog of functions, never a file held open.

A process that forked (a render worker) starts an instance of its own; an instance a fatal error invalidated (a
disk that filled during a write) is dropped, and the next block starts a new one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb

from dunning.ledger.sql import quote_identifier, sql_string


@dataclasses.dataclass
class _Attached:
    alias: str
    read_only: bool
    users: int = 0


class _Host:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.con = duckdb.connect(":memory:")
        self.attached: dict[str, _Attached] = {}


_lock = threading.Lock()
_host: _Host | None = None
_aliases = itertools.count(1)


_inherited: list[_Host] = []


def _current_host() -> _Host:
    global _host
    if _host is not None and _host.pid != os.getpid():
        # a forked child never uses its parent's instance (its threads did not come along), nor lets it go:
        # destroying it would wait forever for those threads
        _inherited.append(_host)
        _host = None
    if _host is None:
        _host = _Host()
    return _host


def _drop_host(host: _Host) -> None:
    """Close an instance that can no longer be trusted (every file it held is released with it)."""
    global _host
    if _host is host:
        _host = None
    with contextlib.suppress(duckdb.Error):
        host.con.close()


def _attach(key: str, read_only: bool) -> tuple[_Host, _Attached]:
    with _lock:
        host = _current_host()
        entry = host.attached.get(key)
        if entry is None:
            alias = f"file_{next(_aliases)}"
            options = " (READ_ONLY)" if read_only else ""
            try:
                host.con.execute(f"ATTACH {sql_string(key)} AS {quote_identifier(alias)}{options}")
            except duckdb.IOException:
                raise  # a lock held by another process, or a file that is not DuckDB's: the caller decides
            except duckdb.Error:
                _drop_host(host)  # an invalidated instance refuses everything: the next attempt starts a new one
                raise
            entry = host.attached[key] = _Attached(alias, read_only)
        elif entry.read_only and not read_only:
            raise duckdb.ConnectionException(
                f"{key} is open read-only in this process and cannot be opened for writing until that ends"
            )
        entry.users += 1
        return host, entry


def _detach(host: _Host, key: str, entry: _Attached) -> None:
    with _lock:
        entry.users -= 1
        if entry.users > 0 or host.attached.get(key) is not entry:
            return
        del host.attached[key]
        try:
            host.con.execute(f"DETACH {quote_identifier(entry.alias)}")  # checkpoints and releases the file's lock
        except duckdb.Error:
            # a checkpoint that failed (a full disk) loses nothing: every commit is in the write-ahead log, replayed
            # by the next open. Closing the instance releases the file all the same; raising here would hide the
            # error the block itself is ending with
            _drop_host(host)


@contextlib.contextmanager
def attached(path: Path, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection whose default database is the file at `path`, for the block; the file is attached to this
    process's instance while any block holds it. Raises duckdb.IOException as `duckdb.connect` does (another
    process holds the file's lock; not a DuckDB file)."""
    key = os.path.abspath(path)
    host, entry = _attach(key, read_only)
    try:
        cursor = host.con.cursor()
        try:
            cursor.execute(f"USE {quote_identifier(entry.alias)}")
            yield cursor
        finally:
            cursor.close()  # an open transaction of the block is rolled back, as `close()` did
    finally:
        _detach(host, key, entry)

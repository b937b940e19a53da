"""Everything under the home is its owner's alone, whatever the umask: directories 0700, files 0600.

The home holds the ledger, the outbox's emails, pulled Stripe snapshots (whole
customer objects), journals and the analysts' copy: each names customers, their
addresses and what they owe. With the common umask 022 all of it was readable
by every local user. So the command and every Dagster run set the umask to 077
(`keep_private`) before anything is written, which covers the files DuckDB,
SQLite and the outbox create, and the directories the project creates are made
0700 (`private_dir`; one an older release created more open is closed too).

The analysts' copy alone may be shared with a group (`analytics_group`):
`share_with_group` gives it to that group, files 0640 and directories 0750,
and lets the group through the home (0710: enter, not list), nothing else.
"""

from __future__ import annotations

import contextlib
import grp
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from dunning.errors import ConfigError

PRIVATE_UMASK = 0o077


def keep_private() -> int:
    """From now on this process creates files 0600 and directories 0700; returns the umask it replaced."""
    return os.umask(PRIVATE_UMASK)


@contextlib.contextmanager
def kept_private() -> Iterator[None]:
    """`keep_private` for the block, the previous umask back after it (a command run inside a test's process)."""
    previous = keep_private()
    try:
        yield
    finally:
        os.umask(previous)


def private_dir(path: str | Path) -> Path:
    """`path` as a directory only its owner may enter: created 0700, or closed to 0700 if it is ours and more open
    (one that is shared on purpose, with the analysts' group, keeps its group's traverse bit: `share_with_group`)."""
    folder = Path(path)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        info = folder.stat()
        if info.st_uid == os.geteuid() and info.st_mode & 0o066:
            os.chmod(folder, stat.S_IMODE(info.st_mode) & 0o710)
    return folder


def _gid(group: str) -> int:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(f"analytics_group: no group named {group!r} on this machine") from None


def share_with_group(home: str | Path, paths: list[Path], group: str) -> None:
    """The analysts' copy (`paths`: files and directories under `home`) readable by `group`: files 0640,
    directories 0750, the home 0710 (the group may pass through it to them, not list it)."""
    gid = _gid(group)
    root = Path(home)
    os.chown(root, -1, gid)
    os.chmod(root, 0o710)
    for path in paths:
        if not path.exists():
            continue
        targets = [path, *path.rglob("*")] if path.is_dir() else [path]
        for target in targets:
            if target.is_symlink():
                continue
            os.chown(target, -1, gid)
            os.chmod(target, 0o750 if target.is_dir() else 0o640)

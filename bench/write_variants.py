"""Ways to create the outbox's files, compared: `python -m bench.write_variants DIR COUNT VARIANT...`.

VARIANT is one of `path` (`Path.write_bytes`, then `os.replace`: the outbox
before 2026-12-01), `os` (`os.open`/`os.write`/`os.close`, then `os.replace`:
the outbox now), `osdir` (the same relative to a directory descriptor),
`tmpfile` (`O_TMPFILE`, then `linkat` to the name) and `excl` (`O_EXCL`
straight to the name: not atomic, for reference only). Each variant writes
COUNT files of 3.5 KB into a new directory under DIR and prints wall, user and
system seconds and files per second. Nothing is deleted (see `bench/trash.py`
for why): remove DIR afterwards.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

from dunning.send.providers.file_outbox import NEW_FILE  # the outbox's own flags: the same system calls

DATA = b"x" * 3500


def names(count: int) -> list[str]:
    return [f"msg-{i:08d}-abcdefabcdef.20261130.r2@dunning.example.com.eml" for i in range(count)]


def v_path(directory: str, count: int) -> None:
    for name in names(count):
        target = Path(directory) / name
        temporary = target.with_suffix(".eml.partial")
        temporary.write_bytes(DATA)
        os.replace(temporary, target)


def v_os(directory: str, count: int) -> None:
    for name in names(count):
        target = os.path.join(directory, name)
        descriptor = os.open(target + ".partial", NEW_FILE, 0o666)
        try:
            os.write(descriptor, DATA)
        finally:
            os.close(descriptor)
        os.replace(target + ".partial", target)


def v_osdir(directory: str, count: int) -> None:
    at = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    for name in names(count):
        descriptor = os.open(name + ".partial", NEW_FILE, 0o666, dir_fd=at)
        try:
            os.write(descriptor, DATA)
        finally:
            os.close(descriptor)
        os.rename(name + ".partial", name, src_dir_fd=at, dst_dir_fd=at)
    os.close(at)


def v_tmpfile(directory: str, count: int) -> None:
    at = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    for name in names(count):
        descriptor = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o666, dir_fd=at)
        try:
            os.write(descriptor, DATA)
            os.link(f"/proc/self/fd/{descriptor}", name, dst_dir_fd=at, follow_symlinks=True)
        finally:
            os.close(descriptor)
    os.close(at)


def v_excl(directory: str, count: int) -> None:
    for name in names(count):
        descriptor = os.open(os.path.join(directory, name), NEW_FILE | os.O_EXCL, 0o666)
        os.write(descriptor, DATA)
        os.close(descriptor)


VARIANTS = {"path": v_path, "os": v_os, "osdir": v_osdir, "tmpfile": v_tmpfile, "excl": v_excl}


def main(argv: list[str]) -> None:
    base, count = argv[0], int(argv[1])
    for variant in argv[2:]:
        directory = os.path.join(base, f"{variant}-{time.time_ns()}")
        os.makedirs(directory)
        before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        VARIANTS[variant](directory, count)
        wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
        print(
            f"{variant:8s} {wall:6.2f} s  user {after.ru_utime - before.ru_utime:5.2f}"
            f"  sys {after.ru_stime - before.ru_stime:5.2f}  {count / wall:7.0f} files/s",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])

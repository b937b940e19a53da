"""How fast this disk creates small files: `python -m bench.disk_probe DIR [SIZE_BYTES] [--after-deletion]`.

Each file is written to a temporary name and renamed, with the system calls
the file outbox makes. Prints files per second for each batch of 2,000, then
deletes DIR. `--after-deletion` creates and deletes as many files first, in a
directory beside DIR, and creates DIR's right after: on an ext4 file system
without a journal this is several times slower, because the inode allocator
passes over recently freed inodes (see `bench/trash.py`).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from dunning.send.providers.file_outbox import NEW_FILE  # the outbox's own flags: the same system calls


def create_files(directory: Path, count: int, data: bytes, prefix: str) -> float:
    """Create `count` files holding `data` the outbox's way (temporary name, then rename); returns files per second."""
    base = str(directory)
    started = time.perf_counter()
    for i in range(count):
        target = os.path.join(base, f"{prefix}{i}.eml")
        temporary = target + ".partial"
        descriptor = os.open(temporary, NEW_FILE, 0o666)
        try:
            os.write(descriptor, data)
        finally:
            os.close(descriptor)
        os.replace(temporary, target)
    return count / (time.perf_counter() - started)


def probe(
    directory: Path, size: int = 1700, batches: int = 10, batch: int = 2000, after_deletion: bool = False
) -> list[int]:
    if after_deletion:
        deleted = directory.with_name(directory.name + "-deleted")
        probe(deleted, size, batches, batch)
    directory.mkdir(parents=True)
    data = b"x" * size
    try:
        return [round(create_files(directory, batch, data, prefix=f"{n}_")) for n in range(batches)]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    positional = [a for a in sys.argv[1:] if not a.startswith("--")]
    print(
        probe(
            Path(positional[0]),
            int(positional[1]) if len(positional) > 1 else 1700,
            after_deletion="--after-deletion" in flags,
        )
    )

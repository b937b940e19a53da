"""How fast this disk creates small files, 2,000 at a time: `python -m bench.disk_probe DIR [SIZE_BYTES]`.

Each file is written to a temporary name and renamed, as the file outbox does.
Prints files per second for each batch, then deletes DIR. On the benchmark VM
the first batches in a new directory, and the batches after a large deletion,
were 5 to 10 times slower than the rest.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path


def create_files(directory: Path, count: int, data: bytes, prefix: str) -> float:
    """Create `count` files holding `data` the outbox's way (temporary name, then rename); returns files per second."""
    started = time.perf_counter()
    for i in range(count):
        target = directory / f"{prefix}{i}.eml"
        temporary = target.with_suffix(".eml.partial")
        temporary.write_bytes(data)
        os.replace(temporary, target)
    return count / (time.perf_counter() - started)


def probe(directory: Path, size: int = 1700, batches: int = 10, batch: int = 2000) -> list[int]:
    directory.mkdir(parents=True)
    data = b"x" * size
    try:
        return [round(create_files(directory, batch, data, prefix=f"{n}_")) for n in range(batches)]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    print(probe(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1700))

"""The landing folder: snapshots dropped as files, one or more per business day.

Naming: `YYYY-MM-DD<anything>.csv|.parquet|.json`, e.g. `2026-11-05.csv` or
`2026-11-05T0900-stripe.json`. The date is the business day the snapshot
belongs to; within a day, files are taken in name order (the last is the
latest).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from pathlib import Path

NAME = re.compile(r"^(\d{4}-\d{2}-\d{2}).*\.(csv|parquet|json)$", re.IGNORECASE)


def landing_files(directory: Path) -> list[tuple[dt.date, Path]]:
    """(business date, path) for every well-named file, in name order; others are ignored."""
    if not directory.is_dir():
        return []
    found = []
    for path in sorted(directory.iterdir()):
        match = NAME.match(path.name)
        if match and path.is_file():
            try:
                found.append((dt.date.fromisoformat(match.group(1)), path))
            except ValueError:
                continue
    return found


def latest_for_day(directory: Path, day: dt.date) -> Path | None:
    matching = [p for d, p in landing_files(directory) if d == day]
    return matching[-1] if matching else None


def content_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

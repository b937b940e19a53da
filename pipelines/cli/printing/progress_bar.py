"""A tqdm progress bar for long sends in the CLI, fed by `dunning.send.progress` records."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

from tqdm import tqdm

from dunning.send.progress import PROGRESS_LOGGER


class _SendBar(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.bar: tqdm | None = None

    def emit(self, record: logging.LogRecord) -> None:
        progress = getattr(record, "dunning_progress", None)
        if not progress:
            return
        if self.bar is None:
            self.bar = tqdm(
                total=progress["total"],
                unit="email",
                desc="sending",
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=0.5,
            )
        self.bar.update(progress["done"] - self.bar.n)
        self.bar.set_postfix(
            sent=progress["sent"], failed=progress["failed"], unknown=progress["unknown"], refresh=False
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        super().close()


@contextlib.contextmanager
def send_progress_bar(enabled: bool | None) -> Iterator[None]:
    """Draw a bar while the block runs: always (True), never (False), or when stderr is a terminal (None)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield
        return
    handler = _SendBar()
    PROGRESS_LOGGER.addHandler(handler)
    try:
        yield
    finally:
        PROGRESS_LOGGER.removeHandler(handler)
        handler.close()

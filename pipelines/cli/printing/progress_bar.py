"""A tqdm progress bar for long sends in the CLI, fed by `dunning.send.progress` records.

The bar writes to its own copy of the terminal's stderr, taken before the run starts: while the run's steps go,
Dagster points the process's stderr at the run's captured-output file (`pipelines.instance.compute_logs`), so a
bar drawn on `sys.stderr` would land in that file, not before the person who asked for it."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from collections.abc import Iterator
from typing import TextIO

from tqdm import tqdm

from dunning.send.progress import PROGRESS_LOGGER


class _SendBar(logging.Handler):
    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream
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
                file=self.stream,
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


def _terminal_stderr() -> TextIO:
    """A stream on a duplicate of stderr's file descriptor (what stderr is now, whatever it is pointed at later);
    stderr itself when it has no descriptor (a test's StringIO: nothing redirects it)."""
    try:
        descriptor = sys.stderr.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return sys.stderr
    return os.fdopen(os.dup(descriptor), "w", buffering=1, encoding="utf-8", errors="replace")


@contextlib.contextmanager
def send_progress_bar(enabled: bool | None) -> Iterator[None]:
    """Draw a bar while the block runs: always (True), never (False), or when stderr is a terminal (None)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield
        return
    stream = _terminal_stderr()
    handler = _SendBar(stream)
    PROGRESS_LOGGER.addHandler(handler)
    try:
        yield
    finally:
        PROGRESS_LOGGER.removeHandler(handler)
        handler.close()
        if stream is not sys.stderr:
            stream.close()

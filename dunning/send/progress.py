"""Send progress as log records on one logger, so any front end can draw it without knowing who sends.

The send step reports after each chunk; the CLI turns the records into a
progress bar (`pipelines/cli/printing/progress_bar.py`), the Dagster step log keeps its own
line per chunk. Nothing is printed unless a front end attaches a handler.
"""

from __future__ import annotations

import logging

PROGRESS_LOGGER = logging.getLogger("dunning.send.progress")
PROGRESS_LOGGER.propagate = False  # only a front end that asks for progress sees it
PROGRESS_LOGGER.setLevel(logging.INFO)


def report_send_progress(emails_done: int, emails_total: int, sent: int, failed: int, unknown: int) -> None:
    PROGRESS_LOGGER.info(
        "sent %d/%d emails",
        emails_done,
        emails_total,
        extra={
            "dunning_progress": {
                "done": emails_done,
                "total": emails_total,
                "sent": sent,
                "failed": failed,
                "unknown": unknown,
            }
        },
    )

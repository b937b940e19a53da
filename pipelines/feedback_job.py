"""The feedback import job: one file of bounce or complaint reports, read, then recorded and applied
(`dunning.run.feedback`).

Launched by the `feedback_files` sensor for each new file dropped in `HOME/landing/feedback/` (`*.mbox`, `*.eml`
as a one-message mbox, `*.json` and `*.jsonl` of Resend events, or a Maildir directory), and by the
webhook receiver's inbox being applied at the start of each cycle. Importing is idempotent: the same file twice
records nothing new.

Two steps, so a slow file never holds the ledger: `read_feedback` parses the file (each message bounded in size,
structure and time, `dunning.ingest.delivery_reports`) without the `dunning_ledger` pool slot, and only
`record_feedback`, which writes, takes it. The reports pass between them through the job's default IO manager
(the run's storage under the private home, like every run's outputs; no secret is in them).
"""

import hashlib
from pathlib import Path

import dagster as dg

from assets.common import LEDGER_POOL, as_operator_failure
from dunning.errors import DunningError
from dunning.ingest.delivery_reports import Reading
from dunning.ingest.landing import content_hash
from dunning.plan.clock import utc_now
from dunning.run import feedback
from resources.dunning import DunningHome

FEEDBACK_LANDING = Path("landing") / "feedback"
KINDS = {".mbox": "mbox", ".eml": "mbox", ".json": "resend", ".jsonl": "resend"}


def feedback_kind(path: Path) -> str | None:
    """How a file in the feedback landing folder is read, or None when it is not one to read."""
    if path.is_dir():
        return "maildir" if (path / "cur").is_dir() or (path / "new").is_dir() else None
    return KINDS.get(path.suffix.lower()) if path.is_file() and not path.name.startswith(".") else None


def feedback_files(home: Path) -> list[tuple[Path, str, str]]:
    """(path, kind, digest) of each file or Maildir in the landing folder; a Maildir's digest names its messages."""
    folder = home / FEEDBACK_LANDING
    found = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        kind = feedback_kind(path)
        if kind is None:
            continue
        if kind == "maildir":
            names = sorted(p.name for sub in ("cur", "new") if (path / sub).is_dir() for p in (path / sub).iterdir())
            digest = hashlib.sha256("\n".join(names).encode()).hexdigest()
        else:
            digest = content_hash(path)
        found.append((path, kind, digest))
    return found


class FeedbackRequest(dg.Config):
    path: str
    kind: str


@dg.op(tags={"dunning/kind": "feedback"})
def read_feedback(config: FeedbackRequest) -> Reading:
    """Reads the file's reports (outside the ledger's pool slot: reading a large mailbox holds no writer back)."""
    try:
        return feedback.read_file(Path(config.path), config.kind)
    except DunningError as error:
        raise dg.Failure(description=str(error), allow_retries=False) from None


@dg.op(tags={"dunning/kind": "feedback"}, pool=LEDGER_POOL)
def record_feedback(context: dg.OpExecutionContext, reading: Reading, dunning_home: DunningHome) -> dict:
    """Records each report once, and suppresses what a verified hard bounce or complaint allows."""
    try:
        settings = dunning_home.settings()
        with dunning_home.ledger() as ledger:
            result = feedback.apply_reports(ledger, reading, settings, dunning_home.root, utc_now())
    except DunningError as error:
        raise as_operator_failure(error) from None
    summary = {"read": result.read, "new": result.recorded, "matched": result.matched,
               "suppressed": len(result.suppressed), "unmatched": result.not_trusted,
               "unreadable": result.unreadable, **result.by_kind}  # fmt: skip
    context.add_output_metadata(summary)
    return summary


@dg.job(
    executor_def=dg.in_process_executor,
    tags={"dunning/kind": "feedback"},
    description="Imports one file of delivery reports (bounces, complaints): read outside the ledger's pool slot, "
    "recorded once inside it, suppressing what they may.",
)
def feedback_import():
    record_feedback(read_feedback())

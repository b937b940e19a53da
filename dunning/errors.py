"""Errors an operator can act on.

Each carries a one-line message meant for stderr; the CLI prints it without a
traceback and exits with the class's `exit_code`.
"""


class DunningError(Exception):
    exit_code = 1


class UserInputError(DunningError):
    """Something the operator gave us is missing or unusable."""

    exit_code = 2


class ConfigError(UserInputError):
    pass


class SnapshotError(UserInputError):
    pass


class SnapshotRefused(SnapshotError):
    """The snapshot was read, and a guard refused its content before anything was applied: older than the last
    one, shrunk, empty, none of its rows accepted. The run records the refusal and skips every later step (its
    checks are skipped, not failed: they were never evaluated); the command still exits 2."""


class InvalidRowsHalt(SnapshotRefused):
    """Rows were rejected and the policy says `on_invalid_rows: halt`."""


class BreakerTripped(DunningError):
    exit_code = 3


class LedgerBusy(DunningError):
    """Another process holds the DuckDB file for longer than we are willing to wait."""

    exit_code = 4


class LedgerUnreadable(UserInputError):
    """The ledger's path holds a file DuckDB cannot open as a database (replaced, truncated, damaged): never
    waited on as if it were busy, and never overwritten."""


class LedgerLost(LedgerBusy):
    """The ledger failed in the middle of a send: nothing more was handed over; what was is on record as claimed,
    for the next run to settle."""


class GuardNotLive(DunningError):
    exit_code = 5


class ProviderUnhealthy(DunningError):
    """The provider failed at the transport level too many times in a row; the send stopped early."""

    exit_code = 6


class BillingSourceFailed(DunningError):
    """The billing system (API error, wrong key) could not give us the invoices."""

    exit_code = 7


class SourceHeld(BillingSourceFailed):
    """A pull held by the size rules (`dunning.run.snapshot_guard`: empty, or shrunk): exit 7 like any failure of
    the source, and the one alert of kind `kind` pages for every run it holds, so the run's failure itself pages no
    one (the run's tag `dunning/held_by`, `pipelines.sensors`)."""

    kind = "source_shrank"


class StorageError(DunningError):
    """A write to the home's storage failed: a full disk, a quota, a read-only file system, an I/O error.

    Whatever refused it (the DuckDB ledger, the Dagster instance's SQLite, the outbox
    files, a run's frames), the message names the file or directory and, when known,
    the step and the run. Nothing half-done is lost: the next run with space recovers.
    """

    exit_code = 8


def exit_codes_by_class() -> dict[str, int]:
    """Each operator-facing error class's exit code by class name (how a failed Dagster step names its error)."""
    found: dict[str, int] = {}
    pending: list[type[DunningError]] = [DunningError]
    while pending:
        cls = pending.pop()
        found[cls.__name__] = cls.exit_code
        pending.extend(cls.__subclasses__())
    return found

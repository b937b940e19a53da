"""The one place a command's end becomes its exit code and its one line: every failure an operator can cause
(missing snapshot, bad config, a tripped breaker, a busy ledger) ends with one line on stderr and the exit code of
its class in `dunning.errors`, never a traceback; anything unforeseen still ends as one line (exit 1, or 8 for a
storage failure, naming the file, the step and the run).

Imported by every command module, so it imports only the standard library when loaded: the domain and Dagster
come in when a command ends in one of their failures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dunning.storage_faults import StorageFault

SEEN: dict[str, Any] = {}  # what this invocation got to: its start, the home, the instance (to name them in an error)


def exit_by_error_class() -> dict[str, int]:
    """The exit code of each error class by name: one source of truth, the classes in `dunning/errors.py`."""
    from dunning.errors import exit_codes_by_class

    return exit_codes_by_class()


def say(text: str, file: IO[str] | None = None) -> None:
    """Print for an operator: control and escape characters that came from data are shown escaped."""
    from dunning.safe_text import for_terminal
    from dunning.secret_env import scrub

    print(for_terminal(scrub(str(text))), file=file or sys.stdout)


class _WithoutLogWriteNoise:
    """stderr without Dagster's own "Exception while writing logger call to event log" lines (a full disk
    prints one per log call); the CLI says what failed in one line instead. Counted, so a run that
    still succeeds can say so."""

    NOISE = "Exception while writing logger call to event log"

    def __init__(self, stream: Any) -> None:
        self.stream, self.dropped = stream, []

    def write(self, text: str) -> int:
        if text.startswith(self.NOISE):
            self.dropped.append(text.strip().splitlines()[0])
            return len(text)
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _skipped_check_noise() -> Any:
    """Dagster warns that a blocking check "emitted no result" when its asset was not materialized: a run skipped
    as unchanged (`dunning.plan.unchanged`), whose gated steps are skipped with it. Our checks always emit a result
    when they run, so the warning would only mislead."""
    import logging

    class SkippedCheckNoise(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return "emitted no result in step" not in record.getMessage()

    return SkippedCheckNoise()


_QUIETED: list[Any] = []  # the one filter above, made once per process


def _quiet_logs() -> None:
    import logging

    logging.getLogger("dunning").addHandler(logging.NullHandler())  # the CLI prints what matters itself
    if not _QUIETED:
        _QUIETED.append(_skipped_check_noise())
        logging.getLogger("dagster._core.execution.plan.active").addFilter(_QUIETED[0])


def storage_line(
    fault: StorageFault,
    home: str | os.PathLike[str] | None = None,
    *,
    step: str | None = None,
    run_id: str | None = None,
) -> str:
    """One line for stderr: what failed, where, in which step and run."""
    from pathlib import Path

    home = home or os.environ.get("DUNNING_HOME")
    if fault.path:
        target = fault.path
    elif fault.kind == "sqlite":
        instance_dir = Path(home) / "dagster" if home else os.environ.get("DAGSTER_HOME", "")
        target = f"the Dagster instance's storage {instance_dir}"
    elif fault.kind == "duckdb":
        target = f"the ledger {Path(home) / 'dunning.duckdb' if home else ''}"
    else:
        target = f"a file under {home}" if home else "a file"
    where = ", ".join(part for part in (step and f"step {step}", run_id and f"run {run_id[:8]}") if part)
    return (
        f"storage error: {fault.reason} writing {str(target).strip()}{f' ({where})' if where else ''}; "
        f"free space there and run again"
    )


def unexpected(error: Exception, args: argparse.Namespace) -> tuple[str, int]:
    """Any other exception as one line: a storage failure (exit 8) names the file, the step and the run when known;
    the run this process left unfinished is marked failed with that line, if its storage lets us."""
    import traceback

    from dunning.errors import StorageError
    from dunning.storage_faults import storage_fault_of

    instance, home = SEEN.get("instance"), SEEN.get("home")
    run, step, written = None, None, []
    if instance is not None:  # a command that got this far has Dagster loaded already
        from pipelines.instance import last_own_run, runs_written_since

        run, step = last_own_run(instance, since=SEEN["started"]) or (None, None)
        written = runs_written_since(home, SEEN["started"]) if run is None else []
    run_id = run.run_id if run else (written[0] if len(written) == 1 else None)  # storage unreadable: its files
    if getattr(args, "verbose", False):
        traceback.print_exception(error, file=sys.stderr)
    fault = storage_fault_of(error)
    if fault is not None:
        text, code = storage_line(fault, home, step=step, run_id=run_id), StorageError.exit_code
    else:
        first = (str(error).strip().splitlines() or [""])[0][:300]
        where = ", ".join(part for part in (step and f"step {step}", run_id and f"run {run_id[:8]}") if part)
        hint = "run again with -v for the traceback" if hasattr(args, "verbose") else "please report it"
        text = (
            f"unexpected error{f' ({where})' if where else ''}: {type(error).__name__}: {first}; {hint}"
            f"{' or see the run in the Dagster UI' if run_id else ''}"
        )
        code = 1
    if run is not None:
        from pipelines.instance import end_run_failed

        end_run_failed(instance, run, text)
    return text, code


def run_command(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """The command's handler, its every end mapped to an exit code and at most one line on stderr; the process's
    stderr, umask and `DUNNING_HOME` put back after it, for a later command in the same process (a test's)."""
    from dunning.errors import DunningError
    from dunning.plan.clock import utc_now
    from dunning.private_files import keep_private

    _quiet_logs()
    SEEN.clear()
    SEEN["started"] = utc_now()
    stderr = sys.stderr
    sys.stderr = quiet = _WithoutLogWriteNoise(stderr)  # type: ignore[assignment]
    named_home = os.environ.get("DUNNING_HOME")  # `common.open_instance` sets it for the run's resources
    umask = keep_private()  # every file the command writes under the home: 0600 (`dunning.private_files`)
    try:
        code = handler(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below, not at interpreter exit
        if code == 0 and quiet.dropped:
            say(
                f"dunning: warning: {len(quiet.dropped)} log line(s) could not be written to the Dagster instance "
                f"({quiet.dropped[0]})",
                file=sys.stderr,
            )
        return code
    except DunningError as error:
        say(f"dunning: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        say("dunning: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `dunning status --json | head`: the reader left; nothing is wrong with us
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # what a shell reports for a command ended by SIGPIPE
    except Exception as error:  # noqa: BLE001 - anything unforeseen still ends as one line, never a traceback
        text, code = unexpected(error, args)
        say(f"dunning: {text}", file=sys.stderr)
        return code
    finally:
        _dispose(SEEN.get("instance"))
        sys.stderr = stderr
        os.umask(umask)
        if named_home is None:  # a later command in this process (a test's) must not take it for one it was given
            os.environ.pop("DUNNING_HOME", None)
        else:
            os.environ["DUNNING_HOME"] = named_home


def _dispose(instance: Any) -> None:
    """Close the command's Dagster instance: its SQLite connections are kept open for the command's life
    (`pipelines.instance.DunningInstance`), and a later command in this process (a test's) opens its own."""
    if instance is None:
        return
    with contextlib.suppress(Exception):  # the storage may be what failed; the command has answered already
        instance.dispose()

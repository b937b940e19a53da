"""What a Dagster run's result says went wrong, as the CLI tells it: each failed step's one line and the exit
code of its error class (a storage failure names the file, the step and the run), from the run's events alone (the
ledger may be what failed); and the last failed live run, kept beside the ledger for `dunning status`."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.cli.exit_codes import exit_by_error_class, storage_line

if TYPE_CHECKING:
    import dagster as dg

    from dunning.storage_faults import StorageFault


def _error_chain(error: Any) -> list[Any]:
    """A recorded error (SerializableErrorInfo), its causes and contexts, outermost first."""
    chain, pending = [], [error]
    while pending:
        current = pending.pop(0)
        if current is not None and len(chain) < 50:
            chain.append(current)
            pending += [current.cause, current.context]
    return chain


def _run_home(result: dg.ExecuteJobResult) -> str | None:
    try:
        return result.dagster_run.run_config["resources"]["dunning_home"]["config"]["home"]
    except (KeyError, TypeError, AttributeError):
        return os.environ.get("DUNNING_HOME")


def _recorded_storage_fault(error: Any) -> StorageFault | None:
    from dunning.storage_faults import storage_fault

    for current in _error_chain(error):
        found = storage_fault(current.message, current.cls_name or "")
        if found is not None:
            return found
    return None


def _failures(result: dg.ExecuteJobResult) -> list[tuple[str, str]]:
    """(error class, one-line message) for each failed step."""
    import dagster as dg

    found = []
    for event in result.all_events:
        if not event.is_step_failure:
            continue
        data = event.step_failure_data
        user = data.user_failure_data
        fault = _recorded_storage_fault(data.error) if user is None or not user.description else None
        if user is not None and user.description:
            cls = user.metadata.get("error_class")
            cls = cls.value if cls is not None else "Failure"
            named = cls != "StorageError" or "(step " in user.description
            where = "" if named else f" (step {event.step_key}, run {result.run_id[:8]})"
            found.append((cls, user.description + where))
        elif fault is not None:
            line = storage_line(fault, _run_home(result), step=event.step_key, run_id=result.run_id)
            found.append(("StorageError", line))
        else:
            error = data.error
            while error is not None and error.cause is not None:
                error = error.cause
            message = (error.message if error else "step failed").strip().splitlines()
            found.append(
                (
                    "Error",
                    f"step {event.step_key} failed: {message[0] if message else ''} "
                    f"(run {result.run_id}; see the Dagster UI for the full log)",
                )
            )
    if not found:  # no step failed: the run itself may have (its storage, outside any step)
        for event in result.all_events:
            if event.event_type == dg.DagsterEventType.RUN_FAILURE and event.job_failure_data is not None:
                fault = _recorded_storage_fault(event.job_failure_data.error)
                if fault is not None:
                    found.append(("StorageError", storage_line(fault, _run_home(result), run_id=result.run_id)))
                    break
    return found


def refusal(instance: dg.DagsterInstance, result: dg.ExecuteJobResult) -> tuple[str, int] | None:
    """A run whose snapshot a guard refused (`assets.snapshot.refuse_input`): its line and exit code (2), read from
    the run's tags (added while it ran); None for any other run."""
    from dunning.run.snapshot_guard import REFUSED_CLASS_TAG, REFUSED_TAG

    run = instance.get_run_by_id(result.run_id)
    if run is None or REFUSED_TAG not in run.tags:
        return None
    cls = run.tags.get(REFUSED_CLASS_TAG, "SnapshotRefused")
    return f"dunning: {run.tags[REFUSED_TAG]}", exit_by_error_class().get(cls, 2)


def failed_on_storage(result: dg.ExecuteJobResult) -> bool:
    """A step (or the run) failed on a storage error: exit code 8."""
    return any(cls == "StorageError" for cls, _ in _failures(result))


def first_failure(result: dg.ExecuteJobResult) -> str:
    failures = _failures(result)
    return failures[0][1] if failures else "run failed"


def _failed_checks(result: dg.ExecuteJobResult) -> list[dg.AssetCheckEvaluation]:
    return [e for e in result.get_asset_check_evaluations() if not e.passed]


FAILURE_FILE = "last_failure.json"  # under the home: the last live run that failed, for `dunning status`


def failed_run_report(result: dg.ExecuteJobResult) -> tuple[str, int]:
    """A run that failed in a step (not halted by a check): its first failure's line and exit code, read from the
    run's events alone (the ledger may be what failed)."""
    failures = _failures(result)
    cls, message = failures[0] if failures else ("Error", "run failed")
    return f"dunning: {message}", exit_by_error_class().get(cls, 1)


def record_failure(home: Path, run_id: str, text: str, code: int) -> None:
    """Keep the failed run's line beside the ledger (a file, written whole), so `dunning status` shows the failed
    run and why even when the failure was the ledger's; never fatal."""
    from dunning.plan.clock import utc_now

    payload = {
        "run_id": run_id,
        "at": utc_now().isoformat(),
        "exit_code": code,
        "message": text.removeprefix("dunning: "),
    }
    target = home / FAILURE_FILE
    temporary = target.with_name(target.name + ".partial")
    with contextlib.suppress(OSError):
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(payload, handle)
        os.replace(temporary, target)


def last_failure(home: Path | None, after: dt.datetime | None) -> dict | None:
    """The last recorded failed run, when it is newer than `after` (the last live run on record), else None."""
    if home is None:
        return None
    try:
        failure = json.loads((home / FAILURE_FILE).read_text(encoding="utf-8"))
        at = dt.datetime.fromisoformat(str(failure["at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if after is not None and at <= after:
        return None
    return {"run_id": str(failure.get("run_id", ""))[:64], "at": at, "exit_code": failure.get("exit_code"),
            "message": str(failure.get("message", ""))[:1000]}  # fmt: skip


def recovery_report(result: dg.ExecuteJobResult) -> tuple[str, int]:
    if not result.success:
        failures = _failures(result)
        cls, message = failures[0] if failures else ("Error", "recovery run failed")
        return f"dunning: {message}", exit_by_error_class().get(cls, 1)
    s = result.output_for_node("send_flood_apologies")
    lines = [
        f"incident {s['incident_id']}: {s['flooded_customers']} flooded customer(s); "
        f"apologies sent: {s['apologies_sent']}; already apologized for this incident: {s['already_apologized']}"
    ]
    if s["failed"] or s["unknown"]:
        lines.append(f"warning: {s['failed']} apology send(s) failed, {s['unknown']} unknown")
    if s["unmapped_addresses"]:
        lines.append(
            "send-log addresses matching no customer in the snapshot (no apology): "
            + ", ".join(s["unmapped_addresses"][:20])
        )
    if s["unreachable_customers"]:
        lines.append(
            "flooded customers without a valid email address (apology held: no_email_address): "
            + ", ".join(s["unreachable_customers"][:20])
        )
    return "\n".join(lines), 0

"""What the CLI tells the operator after a run, and which exit code it ends with."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import dagster as dg
import polars as pl

from dunning.config import Alerts, DunningConfig, load_config
from dunning.errors import ConfigError, ProviderUnhealthy, exit_codes_by_class
from dunning.ledger.base import Ledger
from dunning.ledger.stores.operations import PauseState, RunSummary
from dunning.plan.clock import utc_now
from dunning.send import liveness
from dunning.storage_faults import StorageFault, storage_fault, storage_fault_of
from resources.dunning import CONFIG_FILE_NAME

EXIT_BY_ERROR_CLASS = exit_codes_by_class()  # one source of truth: the classes in dunning/errors.py
__all__ = ["StorageFault", "storage_fault", "storage_fault_of"]  # re-exported for the CLI and tests


def storage_line(
    fault: StorageFault, home: str | Path | None = None, *, step: str | None = None, run_id: str | None = None
) -> str:
    """One line for stderr: what failed, where, in which step and run."""
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
        f"storage error: {fault.reason} writing {target.strip()}{f' ({where})' if where else ''}; "
        f"free space there and run again"
    )


def _error_chain(error) -> list:
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


def _recorded_storage_fault(error) -> StorageFault | None:
    for current in _error_chain(error):
        found = storage_fault(current.message, current.cls_name or "")
        if found is not None:
            return found
    return None


def _failures(result: dg.ExecuteJobResult) -> list[tuple[str, str]]:
    """(error class, one-line message) for each failed step."""
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
    return f"dunning: {message}", EXIT_BY_ERROR_CLASS.get(cls, 1)


def record_failure(home: Path, run_id: str, text: str, code: int) -> None:
    """Keep the failed run's line beside the ledger (a file, written whole), so `dunning status` shows the failed
    run and why even when the failure was the ledger's; never fatal."""
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


def run_report(
    result: dg.ExecuteJobResult,
    ledger: Ledger,
    *,
    as_of: dt.datetime,
    dry_run: bool,
    config: DunningConfig | None = None,
    home: Path | None = None,
) -> tuple[str, int]:
    run_id = result.run_id
    shard = result.dagster_run.tags.get("dunning/shard")  # a sharded run counts only its customers
    header = (
        f"dunning cycle {run_id[:8]} as of {as_of.isoformat()}"
        f"{f' (shard {shard})' if shard else ''}"
        f"{' (dry run: nothing claimed or sent)' if dry_run else ''}"
    )
    if not result.success:
        checks = _failed_checks(result)
        if checks:
            details = "; ".join(
                c.description or f"{c.check_name}: {dict((k, v.value) for k, v in c.metadata.items())}" for c in checks
            )
            names = ", ".join(c.check_name for c in checks)
            return f"dunning: halted by {names}, nothing was sent: {details}", 3
        failures = _failures(result)
        cls, message = failures[0] if failures else ("Error", "run failed")
        return f"dunning: {message}", EXIT_BY_ERROR_CLASS.get(cls, 1)
    skipped = ledger.unchanged_run(run_id)
    if skipped is not None:
        return _unchanged_text(header, skipped), 0
    summary = ledger.run_summary(run_id)
    if summary is None:
        return f"dunning: run {run_id[:8]} completed but recorded no summary (see the Dagster UI)", 1
    text, code = _summary_text(header, summary, ledger.pause_state(), dry_run)
    if config is not None and home is not None:
        text += "\n" + _where_and_next(result, summary, config, home, dry_run)
    return text, code


def _first_emails(result: dg.ExecuteJobResult) -> list[dict]:
    for event in result.all_events:
        materialization = event.step_materialization_data.materialization if event.is_step_materialization else None
        if materialization is not None and materialization.asset_key == dg.AssetKey("send_batch"):
            value = materialization.metadata.get("first_emails")
            return list(value.value) if value is not None else []  # type: ignore[arg-type]
    return []


def _where_and_next(
    result: dg.ExecuteJobResult, summary: RunSummary, config: DunningConfig, home: Path, dry_run: bool
) -> str:
    """Where the emails went, the first recipients and their subjects, and what to run next."""
    lines = []
    if not dry_run and summary.counts["emails"]:
        lines.append(f"emails went to {where_emails_go(config, home)}; the first ones:")
        lines += [f"  {e['to']}: {e['subject']}" for e in _first_emails(result)]
        more = summary.counts["emails"] - len(_first_emails(result))
        if more > 0:
            lines.append(f"  … and {more} more")
    analytics = home / "analytics.duckdb"
    query = (
        f"{Path(sys.executable).parent / 'python'} -c \"import duckdb; print(duckdb.connect('{analytics}', "
        "read_only=True).sql('SELECT status, count(*) FROM reminder_ledger GROUP BY ALL'))\""
    )
    lines += [
        "next:",
        f"  dunning --home {home} status            # pause, last run, unknown keys, alerts",
        f"  make ui HOME_DIR={home}                 # runs, lineage and backfills in the Dagster UI",
        f"  {query}",
    ]
    return "\n".join(lines)


def _unchanged_text(header: str, skipped: dict) -> str:
    """A live run skipped because nothing it decides from changed (`dunning.plan.unchanged`)."""
    reference = str(skipped["reference_run_id"])[:8]
    as_of = skipped["reference_as_of"].isoformat() if skipped["reference_as_of"] else "?"
    return "\n".join(
        [
            header,
            f"nothing changed since run {reference} (as of {as_of}): skipped; nothing written but this run's record",
            f"checked: the snapshot (sha256 {str(skipped['snapshot_sha256'])[:16]}), the configuration, the business "
            f"date {skipped['business_date']}, the ledger's state, retries come due, open claims, unknown outcomes",
        ]
    )


EARLIER = {"unknown_outcome": "unknown", "provider_failure": "failed awaiting retry"}  # audit reasons of older keys


def _summary_text(header: str, summary: RunSummary, pause: PauseState, dry_run: bool) -> tuple[str, int]:
    c = summary.counts
    lines = [header, f"snapshot: {c['snapshot_rows']} invoices accepted, {c['rejected_rows']} rejected"]
    if c["rejected_rows"]:
        lines.append(
            "  rejected rows are in table snapshot_quarantine: "
            + "; ".join(f"{r} ({n})" for r, n in summary.rejected_by_rule)
        )
    if pause.paused:
        lines.append(
            f"PAUSED since {pause.changed_at} ({pause.reason or 'no reason given'}): nothing was claimed or sent"
        )
    lines.append(f"reminders newly due: {c['due']} (earlier stages recorded as skipped: {c['skipped']})")
    earlier = {reason: n for reason, n in summary.held_by_reason if reason in EARLIER}
    if earlier:
        lines.append(
            f"still held from earlier cycles: {sum(earlier.values())} ("
            + ", ".join(f"{label} {earlier.get(reason, 0)}" for reason, label in EARLIER.items())
            + ")"
        )
    if dry_run:
        lines.append(f"would send: {summary.would_send} reminder key(s)")
    else:  # the emails' keys: escalations are hand-overs, said apart below
        audited = dict(summary.escalations_audited)
        lines.append(
            f"sent: {c['sent'] - audited.get('sent', 0)} reminder key(s) in {c['emails']} email(s); "
            f"failed: {c['failed'] - audited.get('failed', 0)}; unknown: {c['unknown'] - audited.get('unknown', 0)}"
        )
    if summary.settled:  # unknown outcomes of earlier runs, answered in this one
        total = sum(n for _, _, n in summary.settled)
        lines.append(
            f"settled from earlier runs: {total} unknown key(s): "
            + ", ".join(f"{n} {status} by {how}" for how, status, n in summary.settled)
        )
    other = [(kind, n) for kind, n in summary.other_kinds if dry_run or kind != "escalation"]
    if other:  # the counts above are of every email's key; say which were not reminders
        label = "would send also" if dry_run else "of which not reminders"
        lines.append(f"{label}: " + ", ".join(f"{kind} {n}" for kind, n in other))
    handed = dict(summary.escalations)
    if not dry_run and handed:
        lines.append(
            f"{handed.get('sent', 0)} escalation(s) handed to the collections system"
            + (f"; failed: {handed.get('failed', 0)}; unknown: {handed.get('unknown', 0)}"
               if handed.get("failed") or handed.get("unknown") else "")
        )  # fmt: skip
    if summary.escalations_refused:
        lines.append(
            f"warning: {summary.escalations_refused} escalation(s) refused for good: one alert each, their invoices "
            "wait for a human (`dunning status`, then `dunning retry` or `dunning resolve`)"
        )
    if summary.set_aside:  # stored, but nothing comes of them: expired, or another customer's payment signal
        lines.append("billing events set aside (table event_quarantine): "
                     + ", ".join(f"{kind} {n}" for kind, n in summary.set_aside))  # fmt: skip
    held_now = [(reason, n) for reason, n in summary.held_by_reason if reason not in EARLIER]
    if held_now:
        lines.append("held: " + ", ".join(f"{reason} {n}" for reason, n in held_now))
    lines.append(f"reminders for invoices not owed: {c['not_owed_reminded']}")
    if c["failed"] or c["unknown"]:
        lines.append(
            f"warning: {c['failed']} failed (retried by a later cycle) and {c['unknown']} unknown "
            "(never resent blindly)"
        )
    if summary.provider_stopped:
        lines.append(f"dunning: {summary.provider_stopped}")
        return "\n".join(lines), ProviderUnhealthy.exit_code
    return "\n".join(lines), 0


def recovery_report(result: dg.ExecuteJobResult) -> tuple[str, int]:
    if not result.success:
        failures = _failures(result)
        cls, message = failures[0] if failures else ("Error", "recovery run failed")
        return f"dunning: {message}", EXIT_BY_ERROR_CLASS.get(cls, 1)
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


def _home_config(ledger: Ledger, home: Path | None = None) -> tuple[DunningConfig, str | None]:
    """HOME/config.yaml (`home`, else the directory of the ledger file; defaults when there is none), for the
    `alerts` thresholds and the business timezone; a broken file gives the defaults and its error, so `status`
    still answers."""
    database = ledger.database_path()
    directory = home if home is not None else (Path(database).parent if database else None)
    path = directory / CONFIG_FILE_NAME if directory is not None else None
    if path is None or not path.is_file():
        return DunningConfig(), None
    try:
        return load_config(path), None
    except ConfigError as error:
        return DunningConfig(), str(error)


def _exclusions_in_force(ledger: Ledger, today: dt.date) -> list[dict]:
    """The exclusions that hold today (not included, `until` not passed), as `status` lists them."""
    rows = ledger.open_exclusions().filter(pl.col("until_date").is_null() | (pl.col("until_date") >= today))
    return [
        {
            "scope": row["scope"],
            "target_id": row["target_id"],
            "reason": row["reason"],
            "since": row["excluded_at"],
            "by": row["excluded_by"],
            "until": row["until_date"],
            "updated_at": row["updated_at"],
            "updated_by": row["updated_by"],
        }
        for row in rows.to_dicts()
    ]


def _run_fields(run: dict | None, *names: str) -> dict | None:
    return {name: run[name] for name in names} if run else None


def status(
    ledger: Ledger, now: dt.datetime | None = None, settings: Alerts | None = None, home: Path | None = None
) -> dict:
    """Pause, the last live run (not dry, not backfill) and the last backfill apart, counts, alerts, liveness.

    `settings`: the `alerts` section; None reads `home`'s config.yaml (without `home`: the one beside a ledger
    file). `now`: the wall clock."""
    config, config_error = _home_config(ledger, home)
    settings = settings if settings is not None else config.alerts
    live = liveness.assess(ledger, settings, now or utc_now())
    pause = ledger.pause_state()
    last = ledger.last_live_run()
    counts = ledger.status_counts()
    hours = live.hours_since_last_live_run
    return {
        "paused": bool(pause.paused),
        "pause_reason": pause.reason if pause.paused else None,
        "last_run": {**last, "dry_run": False} if last else None,
        "last_live_run": _run_fields(live.last_live_run, "run_id", "as_of", "finished_wall_at"),
        "hours_since_last_live_run": round(hours, 2) if hours is not None else None,
        "stale_runs": live.stale_runs,
        "stale_after_hours": live.stale_after_hours,
        "last_dry_run": _run_fields(ledger.last_dry_run(), "run_id", "as_of", "finished_wall_at"),
        "last_backfill": _run_fields(ledger.last_backfill(), "run_id", "as_of", "finished_wall_at"),
        "ledger_counts": counts.by_status,
        "open_alerts": counts.open_alerts,
        "unknown_keys": counts.unknown_keys,
        "unknown_overdue": live.unknown_overdue,
        "unknown_after_hours": live.unknown_after_hours,
        "oldest_unknown_overdue": (
            {"idempotency_key": live.oldest_unknown_key, "since": live.oldest_unknown_since}
            if live.unknown_overdue
            else None
        ),
        "now": live.now,
        "last_failure": last_failure(home, last["finished_wall_at"] if last else None),
        "config_error": config_error,
        "exclusions": _exclusions_in_force(ledger, live.now.astimezone(config.zone).date()),
        "suppressions": ledger.open_suppressions(live.now.astimezone(config.zone).date()).to_dicts(),
        "contacts_to_fix": ledger.contacts_to_fix(live.now.astimezone(config.zone).date()).to_dicts(),
        # escalations refused for good: the invoice is in no one's hands until a human answers
        "escalations_refused": ledger.refused_escalations().drop("refusal_alert_id").to_dicts(),
        "events_set_aside": ledger.set_aside_counts(),  # stored billing events that yield nothing, by kind
        "reports_to_confirm": ledger.reports_to_confirm(
            live.now - dt.timedelta(days=CONFIRM_DAYS), live.now.astimezone(config.zone).date()
        ).to_dicts(),
    }


CONFIRM_DAYS = 30  # how far back `status` lists the bounces and complaints a human should confirm
CONFIRM_WHY = {
    "no_message_id": "quoting no Message-ID",
    "legacy": "quoting a Message-ID minted before they were signed",
}


def _finished(run: dict, now: dt.datetime) -> str:
    return (
        f"finished {liveness.wall(run['finished_wall_at'])} "
        f"({liveness.hours_between(run['finished_wall_at'], now):.1f} h ago)"
    )


def _threshold(hours: float) -> str:
    return f"{hours:g}" if float(hours).is_integer() else f"{hours:.1f}"


def status_text(s: dict) -> str:
    now = s["now"]
    lines = [f"paused: {'yes (' + str(s['pause_reason']) + ')' if s['paused'] else 'no'}"]
    last, completed = s["last_run"], s["last_live_run"]
    if last:
        halted = f" ({last['outcome']})" if last.get("outcome") not in (None, "completed") else ""
        lines.append(
            f"last live run: {last['run_id'][:8]} {_finished(last, now)}{halted}; as of {last['as_of']}, "
            f"sent {last['sent']}, failed {last['failed']}, unknown {last['unknown']}, held {last['held']}"
        )
        if completed and completed["run_id"] != last["run_id"]:
            lines.append(f"last completed live run: {completed['run_id'][:8]} {_finished(completed, now)}")
    else:
        lines.append("last live run: never")
    failure = s.get("last_failure")
    if failure:
        lines.append(
            f"LAST RUN FAILED: {str(failure['run_id'])[:8]} at {liveness.wall(failure['at'])} "
            f"(exit {failure['exit_code']}): {failure['message']}"
        )
    if s["stale_runs"]:
        lines.append(
            f"WARNING: no live run has completed for {s['hours_since_last_live_run']:.1f} h "
            f"(alerts.stale_after_hours: {_threshold(s['stale_after_hours'])})"
            + ("; paused, so the dead man's switch does not page" if s["paused"] else "")
        )
    if s["last_dry_run"] and (not last or s["last_dry_run"]["finished_wall_at"] > last["finished_wall_at"]):
        lines.append(f"last dry run: {s['last_dry_run']['run_id'][:8]} {_finished(s['last_dry_run'], now)}")
    backfill = s["last_backfill"]
    lines.append(
        f"last backfill: {backfill['run_id']} {_finished(backfill, now)}" if backfill else "last backfill: none"
    )
    lines.append("ledger: " + (", ".join(f"{k} {v}" for k, v in sorted(s["ledger_counts"].items())) or "empty"))
    lines.append(f"open alerts: {len(s['open_alerts'])}")
    lines += [f"  {a['created_at']} {a['kind']}: {a['message']}" for a in s["open_alerts"]]
    if s["unknown_keys"]:
        lines.append("unknown outcomes held for a human: " + ", ".join(s["unknown_keys"]))
    oldest = s["oldest_unknown_overdue"]
    lines.append(
        f"unknown keys waiting over {_threshold(s['unknown_after_hours'])} h: {s['unknown_overdue']}"
        + (f" (oldest {oldest['idempotency_key']} since {liveness.wall(oldest['since'])})" if oldest else "")
    )
    lines.append(f"exclusions in force: {len(s['exclusions'])}")
    lines += [
        f"  {e['scope']} {e['target_id']} since {liveness.wall(e['since'])} by {e['by']}, "
        + (f"through {e['until']}" if e["until"] else "until `dunning include`")
        + (f": {e['reason']}" if e["reason"] else "")
        for e in s["exclusions"]
    ]
    lines.append(f"suppressed addresses: {len(s['suppressions'])}")
    lines += [
        f"  {x['email']} ({x['reason']}, {x['source']}) since {liveness.wall(x['created_at'])}"
        + (f" through {x['until']}" if x["until"] else "")
        + (f", then {x['pending_reason']} ({x['pending_source']}) for good" if x.get("pending_reason") else "")
        + (f": {x['note']}" if x["note"] else "")
        for x in s["suppressions"][:20]
    ]
    if len(s["suppressions"]) > 20:
        lines.append(f"  … and {len(s['suppressions']) - 20} more (analytics view suppressions)")
    if s["contacts_to_fix"]:
        lines.append(f"customers who need a new contact: {len(s['contacts_to_fix'])}")
        lines += [f"  {c['customer_id']}: {c['email']} ({c['reason']})" for c in s["contacts_to_fix"][:20]]
    refused = s["escalations_refused"]
    if refused:
        lines.append(f"escalations refused, waiting for a human: {len(refused)} (their reminders wait too)")
        lines += [
            f"  {e['idempotency_key']}: invoice {e['invoice_id']} of {e['customer_id']}, refused "
            f"{liveness.wall(e['refused_at'])} after {e['attempts']} attempt(s): {e['last_error']}"
            for e in refused[:20]
        ]
        if len(refused) > 20:
            lines.append(f"  … and {len(refused) - 20} more (analytics view escalations)")
        lines.append(
            "  fix the cause, then `dunning retry KEY...`; `dunning resolve KEY --sent` if handed over another way, "
            "`--not-sent` to give the invoice back to its reminders"
        )
    set_aside = {kind: n for kind, n in s.get("events_set_aside", {}).items() if n}
    if set_aside:
        lines.append("billing events set aside: " + ", ".join(f"{k} {n}" for k, n in set_aside.items())
                     + " (table event_quarantine)")  # fmt: skip
    if s["reports_to_confirm"]:
        lines.append(
            f"bounces and complaints to confirm: {len(s['reports_to_confirm'])} (nothing proves they are about our "
            f"email; `dunning suppress --email ADDR` confirms one)"
        )
        lines += [
            f"  {r['email']}: {r['kind']} from {r['source']}, {CONFIRM_WHY.get(r['verdict'], r['verdict'])}, "
            f"recorded {liveness.wall(r['recorded_at'])}"
            for r in s["reports_to_confirm"][:20]
        ]
    if s["config_error"]:
        lines.append(f"config: {s['config_error']} (default thresholds used above)")
    return "\n".join(lines)


def preview_text(result, snapshot: str, out: str | None) -> str:
    """`dunning preview` for a person: one line per email, then what waits and why (`dunning.run.preview`)."""
    lines = [
        f"dunning preview as of {result.as_of.isoformat()} of {snapshot} (nothing claimed, sent or written)",
        f"snapshot: {result.snapshot_rows} invoices accepted, {result.rejected_rows} rejected",
    ]
    if not result.breaker.passed:
        lines.append(f"the breaker would halt this run: {result.breaker.describe()}")
    lines.append(f"{len(result.emails)} email(s) would be sent" + (":" if result.emails else ""))
    for email in result.emails:
        flag = (
            f"  [already emailed {email.emailed_in_window} time(s) in the breaker's window]"
            if email.emailed_in_window
            else ""
        )
        stages = ",".join(email.stages) or "-"
        lines.append(f"  {email.customer_id}  {email.to}  {email.kind}  {stages}  {email.subject!r}{flag}")
    for keys, why in result.not_built:
        lines.append(f"  not built ({', '.join(keys[:3])}): {why}")
    if result.escalations:
        lines.append(f"{len(result.escalations)} invoice(s) would be handed to collections (escalation):")
        lines += [
            f"  {e.customer_id}  {e.invoice_id}  {e.policy}  {e.amount_minor} {e.currency} (minor units)  {e.key}"
            for e in result.escalations
        ]
    lines.append("waiting: " + (", ".join(f"{r} {n}" for r, n in sorted(result.held.items())) or "nothing"))
    if out:
        lines.append(f"each email is in {out} as it would be sent")
    lines.append("next: `dunning test-send --to you@example.com` to see one in a mailbox, then `dunning run`")
    return "\n".join(lines)


def where_emails_go(config: DunningConfig, home: Path) -> str:
    """Where a provider hands emails: the outbox directory, the SMTP server, or the HTTP API's host."""
    provider = config.provider
    if provider.kind == "smtp":
        return f"SMTP {provider.host}:{provider.port}"
    if provider.kind == "resend":
        return f"Resend at {urlsplit(provider.api_base).hostname}"
    outbox = home / Path(provider.outbox_dir).expanduser() if provider.outbox_dir else home / "outbox"
    return f"the outbox {outbox}"

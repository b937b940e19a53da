"""What `dunning run` tells the operator after a cycle, and the exit code it ends with: the counts of the run's
summary in the ledger (or why a run was skipped as unchanged, or halted by a check), where the emails went and what
to run next."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pipelines.cli.exit_codes import exit_by_error_class
from pipelines.cli.printing.failures import _failed_checks, _failures
from pipelines.cli.printing.held import held_for_data_lines

if TYPE_CHECKING:
    import datetime as dt

    import dagster as dg

    from dunning.config import DunningConfig
    from dunning.ledger.base import Ledger
    from dunning.ledger.stores.operations import PauseState, RunSummary


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
        return f"dunning: {message}", exit_by_error_class().get(cls, 1)
    skipped = ledger.unchanged_run(run_id)
    if skipped is not None:
        return _unchanged_text(header, skipped), 0
    summary = ledger.run_summary(run_id)
    if summary is None:
        return f"dunning: run {run_id[:8]} completed but recorded no summary (see the Dagster UI)", 1
    text, code = _summary_text(header, summary, ledger.pause_state(), dry_run, _rejected_detail(result))
    if not dry_run and config is not None and (config.fees is not None or config.policies):
        text += _fees_line(ledger, run_id)
    if config is not None and home is not None:
        text += "\n" + _where_and_next(result, summary, config, home, dry_run)
    return text, code


def _fees_line(ledger: Ledger, run_id: str) -> str:
    """The late fees this run claimed, and what became of them (`dunning fees` lists them all)."""
    import polars as pl

    claimed = ledger.charges().filter(pl.col("run_id") == run_id)
    if claimed.is_empty():
        return ""
    by_status = ", ".join(f"{s} {n}" for s, n in claimed.group_by("status").len().sort("status").iter_rows())
    proposed = claimed.filter(pl.col("status") == "proposed").height
    then = "; `dunning fees approve --all` (or --invoice ID) posts them with the next run" if proposed else ""
    return f"\nlate fees claimed: {claimed.height} ({by_status}){then}"


def _rejected_detail(result: dg.ExecuteJobResult) -> dict[str, Any] | None:
    """The rules broken and the first rejected rows, from the snapshot step's metadata (`assets.snapshot`)."""
    import dagster as dg

    for event in result.all_events:
        materialization = event.step_materialization_data.materialization if event.is_step_materialization else None
        if materialization is not None and materialization.asset_key == dg.AssetKey("invoice_snapshot"):
            value = materialization.metadata.get("rejected_detail")
            return dict(value.value) if value is not None else None  # type: ignore[arg-type]
    return None


def _first_emails(result: dg.ExecuteJobResult) -> list[dict[str, Any]]:
    import dagster as dg

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


def _summary_text(
    header: str, summary: RunSummary, pause: PauseState, dry_run: bool, rejected: dict[str, Any] | None = None
) -> tuple[str, int]:
    from dunning.ingest.rejections import detail_lines, explain

    c = summary.counts
    detail = rejected or {"by_rule": dict(summary.rejected_by_rule), "first_rows": [], "copies": 0}
    explained = explain(c["rejected_rows"], int(detail.get("copies", 0)), int(detail.get("duplicated_ids", 0)))
    lines = [header, f"snapshot: {c['snapshot_rows']} invoices accepted, {explained}"]
    if c["rejected_rows"]:
        lines += detail_lines(detail)
        lines.append(
            "  a dry run stores no rejected rows; a live run keeps them in table snapshot_quarantine"
            if dry_run
            else "  rejected rows are in table snapshot_quarantine, each with its rule"
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
        lines.append("held: " + ", ".join(f"{reason} {n}" for reason, n in held_now)
                     + (" (a key counted under each reason it waits for)" if len(held_now) > 1 else ""))  # fmt: skip
    lines += held_for_data_lines(summary.held_for_data, "`dunning status --json` lists them all")
    lines.append(f"reminders for invoices not owed: {c['not_owed_reminded']}")
    if c["failed"] or c["unknown"]:
        lines.append(
            f"warning: {c['failed']} failed (retried by a later cycle) and {c['unknown']} unknown "
            "(never resent blindly)"
        )
    if summary.provider_stopped:
        from dunning.errors import ProviderUnhealthy

        lines.append(f"dunning: {summary.provider_stopped}")
        return "\n".join(lines), ProviderUnhealthy.exit_code
    return "\n".join(lines), 0


def where_emails_go(config: DunningConfig, home: Path) -> str:
    """Where a provider hands emails: the outbox directory, the SMTP server, or the HTTP API's host."""
    provider = config.provider
    if provider.kind == "smtp":
        return f"SMTP {provider.host}:{provider.port}"
    if provider.kind == "resend":
        return f"Resend at {urlsplit(provider.api_base).hostname}"
    outbox = home / Path(provider.outbox_dir).expanduser() if provider.outbox_dir else home / "outbox"
    return f"the outbox {outbox}"

"""`dunning status`: what a person on call reads first, gathered from the ledger (pause, the last live run and
the last failure, counts, alerts, the dead man's switch, who is held and why) as one mapping (`--json`) and as
text."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from dunning.config import DunningConfig, load_config
from dunning.errors import ConfigError
from dunning.plan.clock import utc_now
from dunning.send import liveness
from dunning.vocabulary import DATA_PROBLEMS
from pipelines.cli.printing.failures import last_failure
from pipelines.cli.printing.held import held_for_data_lines
from resources.dunning import CONFIG_FILE_NAME

if TYPE_CHECKING:
    from dunning.config import Alerts
    from dunning.ledger.base import Ledger


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
    # the last live run's held keys per reason (a key under each reason it has) and every invoice held for its data
    held_by_reason = dict(ledger.held_by_reason(last["run_id"])) if last else {}
    held_for_data = ledger.held_for_data(last["run_id"], DATA_PROBLEMS) if last else []
    return {
        "paused": bool(pause.paused),
        "pause_reason": pause.reason if pause.paused else None,
        "last_run": {**last, "dry_run": False} if last else None,
        "held_by_reason": held_by_reason,
        "held_for_data": held_for_data,
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
        "fees": _fees(ledger, config),
        "replies_waiting": _replies_waiting(ledger, live.now, config),
        "promises_active": ledger.promise_coverage().get_column("promise_id").n_unique(),
    }


def _fees(ledger: Ledger, config: DunningConfig) -> dict:
    """Late fees on record (`dunning.report.fee_audit`): claimed against allowed, and the proposed ones waiting for
    `dunning fees approve`."""
    from dunning.report.fee_audit import claimed_against_allowed

    try:
        charges = ledger.charges()
    except ledger.database_errors:  # a ledger this command may not migrate (older than the charges table)
        return {}
    proposed = charges.filter(pl.col("status") == "proposed").select(
        "charge_key", "invoice_id", "customer_id", "kind", "amount_minor", "currency"
    )
    return {**claimed_against_allowed(charges, config), "proposed": proposed.to_dicts()}


def _replies_waiting(ledger: Ledger, now: dt.datetime, config: DunningConfig) -> list[dict]:
    """The customers whose reply waits for an answer (`dunning ack`), oldest reply first: whether it still pauses
    them, or its pause ran out (`replies.pause_days`)."""
    from dunning.desk import replies

    unanswered = ledger.unanswered_replies(now)
    if unanswered.is_empty():
        return []
    paused = set(replies.waiting(ledger, now, config).paused)
    first = unanswered.group_by("customer_id", maintain_order=True).agg(
        pl.col("received_at").first().alias("since"), pl.col("subject").first(), pl.len().alias("replies")
    )
    return [{**row, "pauses": row["customer_id"] in paused} for row in first.to_dicts()]


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
        if s.get("held_by_reason"):
            lines.append("  held by reason (a key under each reason it has): "
                         + ", ".join(f"{r} {n}" for r, n in s["held_by_reason"].items()))  # fmt: skip
        lines += ["  " + line for line in held_for_data_lines(s.get("held_for_data", []), "--json lists them all")]
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
    fees = s.get("fees") or {}
    if fees.get("charges"):
        from dunning.currencies import in_major_units  # babel, only when amounts are shown

        wrong = {k: fees[k] for k in ("consumer_charged", "charged_twice", "above_the_law") if fees[k]}
        lines.append("fees: " + ", ".join(f"{k} {v}" for k, v in fees["by_status"].items())
                     + (f"; AGAINST THE LAW: {wrong}" if wrong else ""))  # fmt: skip
        lines += [f"  proposed {p['charge_key']}: {in_major_units(p['amount_minor'], p['currency'])} {p['currency']}"
                  for p in fees["proposed"][:20]]  # fmt: skip
        if fees["proposed"]:
            lines.append("  `dunning fees approve --all` (or --invoice ID) posts them with the next run; "
                         "`dunning fees waive --invoice ID` drops them")  # fmt: skip
    if s.get("replies_waiting"):
        lines.append(f"customers waiting for an answer: {len(s['replies_waiting'])} (oldest first; `dunning ack "
                     "--customer ID` once answered)")  # fmt: skip
        lines += [
            f"  {r['customer_id']}: {r['replies']} reply(ies) since {liveness.wall(r['since'])}"
            + (f" {r['subject']!r}" if r["subject"] else "")
            + ("" if r["pauses"] else " (pause ran out: their reminders go on)")
            for r in s["replies_waiting"][:20]
        ]
    if s.get("promises_active"):
        lines.append(f"promises to pay active: {s['promises_active']} (`dunning promises`)")
    if s["config_error"]:
        lines.append(f"config: {s['config_error']} (default thresholds used above)")
    return "\n".join(lines)

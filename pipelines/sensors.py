"""Sensors: snapshots landing in DIR/landing start runs; a failed run pages a human; so does silence.

The landing sensor asks for one run per new file, keyed by the file's content
hash (`run_key`), so the same file dropped twice, or renamed, never starts a
second run; its cursor remembers the hashes it has seen. The dead man's switch starts no runs: it pages when no
live run has completed for a while or `unknown` keys wait too long (see dunning/send/liveness.py).
"""

import datetime as dt
import json

import dagster as dg

from dunning.errors import DunningError, LedgerBusy
from dunning.ingest.landing import content_hash, landing_files
from dunning.ingest.sources import pulls
from dunning.plan.clock import utc_now
from dunning.run.snapshot_guard import HELD_TAG
from dunning.send import liveness
from dunning.send.alerts import Alert, deliver, raise_alert
from pipelines.feedback_job import feedback_files, feedback_import
from pipelines.jobs import dunning_cycle_job, dunning_ingest_job
from pipelines.recovery_job import flood_recovery
from pipelines.schedules import INGEST_AS_OF_TAG, shard_requests
from resources.dunning import SHARD_TAG, DunningHome


@dg.run_failure_sensor(
    monitored_jobs=[dunning_cycle_job, dunning_ingest_job, flood_recovery],
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Raises one alert per failed dunning run; a breaker trip has already paged, so it is not paged twice.",
)
def page_on_run_failure(context: dg.RunFailureSensorContext, dunning_home: DunningHome) -> None:
    run = context.dagster_run
    with dunning_home.ledger() as ledger:
        if not ledger.alerts_for_run(run.run_id).is_empty():
            return
        held_by = run.tags.get(HELD_TAG)  # a pull held while its one alert is open: that alert pages for it
        if held_by and ledger.open_alert(held_by) is not None:
            return
        message = context.failure_event.message or "run failed"
        raise_alert(
            ledger,
            dunning_home.settings().alerts,
            Alert(
                kind="run_failure",
                message=f"run {run.run_id} of {run.job_name} failed: {message}"[:2000],
                created_at=utc_now(),
                run_id=run.run_id,
                details={"job": run.job_name, "tags": dict(run.tags)},
            ),
        )


@dg.sensor(
    job=dunning_cycle_job,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="One run per new snapshot file in DIR/landing (named YYYY-MM-DD*.csv|parquet|json).",
)
def landing_snapshots(context: dg.SensorEvaluationContext, dunning_home: DunningHome):
    seen = set(json.loads(context.cursor)) if context.cursor else set()
    requests = []
    for day, path in landing_files(dunning_home.root / "landing"):
        digest = content_hash(path)
        if digest in seen:
            continue
        seen.add(digest)
        requests.append(
            dg.RunRequest(
                run_key=f"landing-{digest}",
                partition_key=day.isoformat(),
                run_config={"resources": {"cycle_request": {"config": {"snapshot_path": str(path)}}}},
                tags={"dunning/trigger": "landing", "dunning/snapshot": path.name},
            )
        )
    context.update_cursor(json.dumps(sorted(seen)))
    return requests or dg.SkipReason("no new snapshot in the landing folder")


@dg.sensor(
    minimum_interval_seconds=300,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Dead man's switch: pages (kinds stale_runs, stale_unknown) when no live run has completed for "
    "alerts.stale_after_hours or unknown keys wait over alerts.unknown_after_hours; once per episode.",
)
def dead_mans_switch(context: dg.SensorEvaluationContext, dunning_home: DunningHome):
    settings = dunning_home.settings().alerts
    now = utc_now()
    try:
        # a short wait: a tick must end well inside the daemon's timeout, and the next tick comes soon
        with dunning_home.ledger(timeout_seconds=20) as ledger:
            state, actions = liveness.watch(ledger, settings, now)
    except LedgerBusy:
        return _ledger_held(context, settings, now)
    context.update_cursor(None)
    return dg.SkipReason(liveness.describe(state, actions))


def _ledger_held(context: dg.SensorEvaluationContext, settings, now) -> dg.SkipReason:
    """Usually a run is writing. Held past stale_after_hours (a hung run), page once without the ledger:
    the alert cannot be stored, so the cursor remembers that it was sent."""
    held = json.loads(context.cursor) if context.cursor else {}
    since = dt.datetime.fromisoformat(held["held_since"]) if "held_since" in held else now
    hours = liveness.hours_between(since, now)
    if hours > settings.stale_after_hours and not held.get("paged"):
        deliver(
            Alert(
                kind=liveness.STALE_RUNS,
                created_at=now,
                dedup_key=f"dunning-ledger-held-{since.isoformat()}",
                message=f"the ledger has been held by another process for {hours:.1f} h since "
                f"{liveness.wall(since)} (a hung run?); no run can complete until it is released",
                details={"held_since": since, "hours": round(hours, 2)},
            ),
            settings,
        )
        held["paged"] = True
    context.update_cursor(json.dumps({**held, "held_since": since.isoformat()}))
    return dg.SkipReason(
        f"the ledger is held by another process since {liveness.wall(since)}"
        + (" (paged)" if held.get("paged") else "; checking again at the next tick")
    )


STRIPE_EVENTS_INTERVAL_SECONDS = 120  # one small request per tick, far under Stripe's rate limits


@dg.sensor(
    job=dunning_cycle_job,
    minimum_interval_seconds=STRIPE_EVENTS_INTERVAL_SECONDS,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="With source.kind: stripe, asks Stripe for the newest invoice.payment_failed event and, when it is "
    "newer than the ledger's cursor, asks for a dunning run (one per shard), keyed by that event's id.",
)
def stripe_events(context: dg.SensorEvaluationContext, dunning_home: DunningHome):
    """A run pulls and polls by itself (`assets/snapshot.py`); this only decides when one is worth starting.

    The run key names the newest event, so the daemon starts one run per new event however many ticks see it; the
    run advances the cursor once the notices are claimed, and the next ticks skip. Skips while paused, and says
    why when the source is not Stripe or cannot be asked (a wrong key, the API down: the scheduled runs fail loudly
    on the same error)."""
    settings = dunning_home.settings()
    if settings.source.kind != "stripe":
        return dg.SkipReason("source.kind is not stripe: nothing to poll")
    try:
        with dunning_home.ledger(timeout_seconds=20) as ledger:
            pause = ledger.pause_state()
            cursor = ledger.source_cursor(pulls.EVENTS_CURSOR)
        if pause.paused:
            return dg.SkipReason(f"dunning is paused since {pause.changed_at} by {pause.changed_by}: {pause.reason}")
        now = utc_now()
        newest = pulls.newest_event(settings.source, now)
    except LedgerBusy:
        return dg.SkipReason("the ledger is busy; asking again at the next tick")
    except DunningError as error:
        return dg.SkipReason(f"cannot ask Stripe for new events: {error}")
    if newest is None or newest == cursor:
        return dg.SkipReason(f"no payment-failed event newer than the cursor ({cursor or 'none yet'})")
    partition = now.astimezone(settings.zone).date().isoformat()
    tags = {"dunning/trigger": "stripe_events", "dunning/newest_event": newest}
    if settings.shards == 1:
        return dg.RunRequest(run_key=f"stripe-events-{newest}", partition_key=partition, tags=tags)
    shards = [f"{k}/{settings.shards}" for k in range(settings.shards)]
    return [
        dg.RunRequest(
            run_key=f"stripe-events-{newest}-shard-{shard}",
            partition_key=partition,
            run_config={"resources": {"cycle_request": {"config": {"shard": shard}}}},
            tags={**tags, SHARD_TAG: shard},
        )
        for shard in shards
    ]


@dg.sensor(
    job_name=feedback_import.name,  # by name: a sensor holding an op job's object is copied with a beta warning
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="One import per new file of delivery reports in DIR/landing/feedback (*.mbox, *.eml, *.json, "
    "*.jsonl, or a Maildir): bounces and complaints suppress what they may.",
)
def feedback_files_landed(context: dg.SensorEvaluationContext, dunning_home: DunningHome):
    seen = set(json.loads(context.cursor)) if context.cursor else set()
    requests = []
    for path, kind, digest in feedback_files(dunning_home.root):
        if digest in seen:
            continue
        seen.add(digest)
        requests.append(
            dg.RunRequest(
                run_key=f"feedback-{digest}",
                run_config={"ops": {"read_feedback": {"config": {"path": str(path), "kind": kind}}}},
                tags={"dunning/trigger": "feedback", "dunning/file": path.name[:200]},
            )
        )
    context.update_cursor(json.dumps(sorted(seen)))
    return requests or dg.SkipReason("no new file in the feedback landing folder")


@dg.run_status_sensor(
    run_status=dg.DagsterRunStatus.SUCCESS,
    monitored_jobs=[dunning_ingest_job],
    request_job=dunning_cycle_job,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="When an ingest succeeds, one cycle run per shard K of N, each reading only its part of it.",
)
def shards_after_ingest(context: dg.RunStatusSensorContext, dunning_home: DunningHome):
    """A run-status sensor rather than an asset dependency: the shard runs are N runs of the cycle job, each with its
    own shard tag (the run queue's per-shard limit keys on it), which one asset materialization cannot ask for; the
    lineage still shows ingest -> shards (`invoice_snapshot` depends on `ingested_snapshot`)."""
    run = context.dagster_run
    as_of = run.tags.get(INGEST_AS_OF_TAG)
    if not as_of:  # an ingest started by hand in the UI without the tag: its config says the hour
        as_of = run.run_config.get("ops", {}).get("ingested_snapshot", {}).get("config", {}).get("as_of")
    if not as_of:
        return dg.SkipReason(f"ingest run {run.run_id[:8]} names no hour")
    partition = run.tags.get("dagster/partition") or as_of[:10]
    return shard_requests(as_of, partition, _ingested_shards(context, run.run_id) or dunning_home.settings().shards,
                          "ingest")  # fmt: skip


def _ingested_shards(context: dg.RunStatusSensorContext, run_id: str) -> int | None:
    """How many parts the ingest run wrote (its materialization's metadata): the config may have changed since."""
    for record in context.instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
        materialization = record.asset_materialization
        if materialization is not None and "shards" in materialization.metadata:
            return int(str(materialization.metadata["shards"].value))
    return None

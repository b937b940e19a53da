"""Retention, last step of the hourly job: what the home lets go (`dunning.run.retention`), and Dagster's own runs,
event logs, compute logs and ticks, through the instance's public methods.

The step (`retention_sweep`) must never hold up or fail a send. It runs after every other step (the lowest
priority, and it depends only on `billing_events`, which every run materializes, so an hour skipped as unchanged
prunes too); it takes no ledger pool slot and opens the ledger for a moment, with a short wait: a busy ledger
leaves its parts (journals, delivery events) for the next hour. Anything that fails is a warning in the run's
log, never a failed run. Only a live run prunes, and of a sharded hour only shard 0: every age is judged on the
wall clock, so one sweep an hour is enough.

SQLite keeps the pages of deleted rows in its file; they are reused by the runs that follow, so the instance's
tables stop growing at about `runs_days` of runs without a VACUUM (which would lock the instance while it copies
the file). The per-run event-log shards and compute logs are files: deleted, they free their space at once
(`bench/retention.py`).
"""

import datetime as dt
from collections.abc import Callable
from pathlib import Path

import dagster as dg

from assets.common import GROUP, OWNERS
from assets.sending import LIVE_RUN_STATUSES
from dunning.config import DunningConfig, Retention
from dunning.errors import LedgerBusy
from dunning.ledger.factory import open_ledger_for
from dunning.plan.clock import utc_now
from dunning.run.retention import Pruned, Removal, file_size, prune_home, remove
from resources.dunning import CycleRequest, DunningHome
from resources.partitions import daily_partitions

LEDGER_WAIT_SECONDS = 5.0
FINISHED = (dg.DagsterRunStatus.SUCCESS,)
FAILED = (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)


def live_runs(instance: dg.DagsterInstance) -> Callable[[list[str]], set[str]]:
    """Which of some run ids this instance reports live (a run it does not know is not)."""

    def ask(run_ids: list[str]) -> set[str]:
        found = (
            instance.get_run_records(dg.RunsFilter(run_ids=run_ids, statuses=list(LIVE_RUN_STATUSES)))
            if run_ids
            else []
        )
        return {record.dagster_run.run_id for record in found}

    return ask


def _run_files(home: Path, run_id: str) -> list[Path]:
    """What a run leaves beside the instance's tables (SQLite storage): its event-log shard and its compute logs."""
    history = home / "dagster" / "history" / "runs"
    return [*(history / f"{run_id}.db{end}" for end in ("", "-wal", "-shm")), home / "dagster" / "storage" / run_id]


def prune_instance(
    instance: dg.DagsterInstance, home: Path, retention: Retention, now: dt.datetime, dry_run: bool
) -> list[Removal]:
    """Runs (with their event logs and compute logs) that ended more than `runs_days` ago, failed and canceled ones
    `failed_runs_days`; schedule and sensor ticks likewise. Live runs are never touched."""
    removals = []
    kinds = (
        (FINISHED, retention.runs_days, "Dagster run(s)"),
        (FAILED, retention.failed_runs_days, "failed or canceled Dagster run(s)"),
    )
    for statuses, days, what in kinds:
        cutoff = now - dt.timedelta(days=days)
        records = instance.get_run_records(dg.RunsFilter(statuses=list(statuses), updated_before=cutoff))
        size = 0
        for record in records:
            run_id = record.dagster_run.run_id
            files = _run_files(home, run_id)
            size += sum(file_size(f) for f in files)
            if not dry_run:
                instance.delete_run(run_id)  # the run and its event log
                instance.compute_log_manager.delete_logs(prefix=[run_id])
                for leftover in files:  # SQLite keeps an emptied shard file per run
                    remove(leftover)
        removals.append(Removal(f"{what} with their event and compute logs", len(records), size))
    removals.append(_prune_ticks(instance, retention, now, dry_run))
    return removals


def _prune_ticks(instance: dg.DagsterInstance, retention: Retention, now: dt.datetime, dry_run: bool) -> Removal:
    """Ticks older than `runs_days`, failed ones `failed_runs_days` (the statuses are the ticks' own enum: Dagster
    exports it from no public module)."""
    runs_cutoff = (now - dt.timedelta(days=retention.runs_days)).timestamp()
    failed_cutoff = (now - dt.timedelta(days=retention.failed_runs_days)).timestamp()
    count = 0
    for state in instance.all_instigator_state():
        origin, selector = state.instigator_origin_id, state.selector_id
        if selector is None:  # a state written before selectors were stored: its ticks are the daemon's to purge
            continue
        old = instance.get_ticks(origin, selector, before=max(runs_cutoff, failed_cutoff))
        gone = [t for t in old if t.timestamp < (failed_cutoff if t.status.name == "FAILURE" else runs_cutoff)]
        count += len(gone)
        if gone and not dry_run:
            kinds = type(gone[0].status)
            instance.purge_ticks(origin, selector, runs_cutoff, [s for s in kinds if s.name != "FAILURE"])
            instance.purge_ticks(origin, selector, failed_cutoff, [s for s in kinds if s.name == "FAILURE"])
    return Removal("schedule and sensor tick(s)", count)


def sweep(
    instance: dg.DagsterInstance, home: Path, config: DunningConfig, now: dt.datetime, *, dry_run: bool,
    ledger_wait: float = LEDGER_WAIT_SECONDS,
) -> Pruned:  # fmt: skip
    """Everything `retention:` lets go of this home, as of the wall clock `now` (or, dry, what would go)."""
    pruned = Pruned(dry_run)
    try:
        pruned.removals += prune_instance(instance, home, config.retention, now, dry_run)
    except Exception as error:  # noqa: BLE001 - one part's failure never stops the others
        pruned.errors.append(f"Dagster storage: {type(error).__name__}: {str(error)[:300]}")
    try:
        with open_ledger_for(config, home, ledger_wait) as ledger:
            prune_home(ledger, home, config, now, dry_run=dry_run, live_runs=live_runs(instance), pruned=pruned)
    except LedgerBusy:
        prune_home(None, home, config, now, dry_run=dry_run, live_runs=live_runs(instance), pruned=pruned)
        pruned.ledger_busy = True
        pruned.errors.append("journals, delivery events: the ledger is busy; they wait for the next sweep")
    return pruned


@dg.asset(
    group_name=GROUP, partitions_def=daily_partitions, owners=OWNERS, kinds={"sqlite", "duckdb"},
    deps=["billing_events"], op_tags={"dagster/priority": "-100"},
)  # fmt: skip
def retention_sweep(
    context: dg.AssetExecutionContext, dunning_home: DunningHome, cycle_request: CycleRequest
) -> dg.MaterializeResult:
    """One sweep per live hour of what `retention:` lets go: Dagster runs and ticks, old ingests, finished runs'
    journals, inbox leftovers, old delivery events (module docstring). Never fails the run."""
    try:
        config = dunning_home.settings()
        clock = cycle_request.cycle_clock(context, config)
        if not clock.live or cycle_request.shard_spec().index != 0:
            return dg.MaterializeResult(metadata={"pruned": "nothing: only a live run (of shard 0) prunes"})
        pruned = sweep(context.instance, dunning_home.root, config, utc_now(), dry_run=False)
    except Exception as error:  # noqa: BLE001 - pruning never fails the run: the next hour tries again
        context.log.warning(f"retention: not pruned this hour: {type(error).__name__}: {str(error)[:300]}")
        return dg.MaterializeResult(metadata={"pruned": "nothing (failed, see the log)"})
    for line in pruned.errors:
        context.log.warning(f"retention: not pruned: {line}")
    return dg.MaterializeResult(
        metadata={
            "pruned": "; ".join(pruned.lines()),
            "freed_bytes": pruned.freed,
            **{r.what: r.count for r in pruned.removals},
        }
    )

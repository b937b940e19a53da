"""Dagster's own cost: a job of the dunning cycle's shape whose steps do nothing, run the way the CLI runs one.

Seven assets and three asset checks with the cycle's names, dependencies, partitions, pools and blocking checks
(eight steps: two checks are evaluated in their asset's step, as the cycle's are; one process, the in-process
executor, outputs kept in memory), executed by `dg.execute_job` on a `reconstructable` job, on an instance
configured by the `dagster.yaml` the CLI writes, in a process of its own: `python -m bench.empty_job HOME
[one_step]` (HOME/dagster/dagster.yaml must exist). `measure` runs it twice, on a home with no instance yet (the
first run of a deployment creates and migrates it) and again on the same home, then a job of one asset
(`one_step`: the least a run recorded in Dagster can be).
What it shows is the floor under any `dunning run` that keeps its runs in Dagster.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import sys
import time
from pathlib import Path

import dagster as dg

POOL = "dunning_ledger"  # the cycle's ledger pool (`assets.common.LEDGER_POOL`)
DAY = "2026-11-30"
daily = dg.DailyPartitionsDefinition(start_date="2024-01-01")
common = {"group_name": "empty", "partitions_def": daily, "io_manager_key": "frames"}


@dg.asset(**common, pool=POOL)
def billing_events() -> int:
    return 0


@dg.asset(**common, pool=POOL)
def invoice_snapshot() -> int:
    return 0


@dg.asset(
    **common,
    pool=POOL,
    check_specs=[dg.AssetCheckSpec("reminders_due_are_sound", asset="reminders_due", blocking=True)],
)
def reminders_due(invoice_snapshot: int, billing_events: int):
    yield dg.Output(invoice_snapshot + billing_events)
    yield dg.AssetCheckResult(check_name="reminders_due_are_sound", passed=True)


@dg.asset_check(asset=reminders_due, blocking=True, additional_ins={"invoice_snapshot": dg.AssetIn("invoice_snapshot")})
def circuit_breaker(reminders_due: int, invoice_snapshot: int) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=True)


@dg.asset(**common, pool=POOL)
def send_batch(reminders_due: int) -> int:
    return reminders_due


@dg.asset(
    **common, pool=POOL, check_specs=[dg.AssetCheckSpec("no_reminders_for_unowed_invoices", asset="dunning_audit")]
)
def dunning_audit(invoice_snapshot: int, reminders_due: int, send_batch: int):
    yield dg.Output(send_batch)
    yield dg.AssetCheckResult(check_name="no_reminders_for_unowed_invoices", passed=True)


@dg.asset(group_name="empty", partitions_def=daily, deps=[dunning_audit], pool=POOL)
def analyst_history() -> dg.MaterializeResult:
    return dg.MaterializeResult()


@dg.asset(group_name="empty", partitions_def=daily, deps=[billing_events], op_tags={"dagster/priority": "-100"})
def retention_sweep() -> dg.MaterializeResult:
    return dg.MaterializeResult()


@dg.asset(group_name="one", partitions_def=daily, io_manager_key="frames")
def only_step() -> int:
    return 0


def one_step() -> dg.JobDefinition:
    """The least a run through Dagster can be: one asset, no check (what an hour with nothing new cannot go below
    while its run is recorded in the instance)."""
    job = dg.define_asset_job("one_step", dg.AssetSelection.groups("one"), executor_def=dg.in_process_executor)
    defs = dg.Definitions(assets=[only_step], jobs=[job], resources={"frames": dg.InMemoryIOManager()})
    return defs.resolve_job_def("one_step")


def empty_cycle() -> dg.JobDefinition:
    job = dg.define_asset_job("empty_cycle", dg.AssetSelection.groups("empty"), executor_def=dg.in_process_executor)
    defs = dg.Definitions(
        assets=[billing_events, invoice_snapshot, reminders_due, send_batch, dunning_audit, analyst_history,
                retention_sweep],
        asset_checks=[circuit_breaker],
        jobs=[job],
        resources={"frames": dg.InMemoryIOManager()},
    )  # fmt: skip
    return defs.resolve_job_def("empty_cycle")


def run(home: Path, job: str = "empty_cycle") -> None:
    """Execute the empty job (or `one_step`) on HOME's instance, as the CLI executes the cycle (run in a process
    of its own)."""
    os.environ["DAGSTER_HOME"] = str(home / "dagster")
    from bench import empty_job  # by module path, not __main__: the run's origin must be importable

    instance = dg.DagsterInstance.get()
    result = dg.execute_job(
        dg.reconstructable(getattr(empty_job, job)),
        instance=instance,
        tags={"dagster/partition": DAY},
        raise_on_error=True,
    )
    assert result.success


def measure(yaml_from: Path, scratch: Path) -> dict:
    """The empty job's process, whole and decomposed from its events: on a home without an instance, then again.
    `yaml_from`: a home the CLI made, whose dagster.yaml the empty job's instance uses."""
    from bench.dagster_events import run_timings
    from bench.noop import PYTHON, timed
    from bench.trash import discard

    discard(scratch)
    (scratch / "dagster").mkdir(parents=True)
    shutil.copy(yaml_from / "dagster" / "dagster.yaml", scratch / "dagster" / "dagster.yaml")
    result = {}
    cases = {"first run (instance created)": "empty_cycle", "next run (instance exists)": "empty_cycle",
             "one-step job (instance exists)": "one_step"}  # fmt: skip
    for name, job in cases.items():
        started = time.time()
        measured = timed([PYTHON, "-m", "bench.empty_job", str(scratch), job])
        timings = run_timings(scratch, started, time.time())
        result[name] = {key: value for key, value in measured.items() if key != "stdout"} | timings
    result["import dagster"] = {k: v for k, v in timed([PYTHON, "-c", "import dagster"]).items() if k != "stdout"}
    discard(scratch)
    return result


if __name__ == "__main__":
    started = dt.datetime.now(dt.UTC)
    run(Path(sys.argv[1]), *sys.argv[2:3])
    print(f"empty job done in {(dt.datetime.now(dt.UTC) - started).total_seconds():.2f} s", flush=True)
    os._exit(0)  # as the CLI ends (`pipelines.cli.entry`): without the interpreter's teardown

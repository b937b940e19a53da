"""Where a `dunning` process's time went, from the Dagster events its run left in the home's instance.

Read after the process has ended, from HOME/dagster (the instance the CLI used): each step's STEP_START to its
STEP_SUCCESS (or failure, or skip), the gaps between steps (Dagster's own orchestration: loading inputs,
handling outputs, writing events), the time from the process's start to the first STEP_START (the interpreter,
the imports, the Dagster instance, the run's creation and its planned-materialization events) and from the last
step's end to the process's end (the run's end events, the run summary, closing). `started` and `ended` are
wall-clock times (`time.time()`) taken just before and after the process.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg

STEP_ENDS = (
    dg.DagsterEventType.STEP_SUCCESS,
    dg.DagsterEventType.STEP_FAILURE,
    dg.DagsterEventType.STEP_SKIPPED,
)


def instance_of(home: Path) -> dg.DagsterInstance:
    """The home's instance as the CLI configured it (HOME/dagster/dagster.yaml), without setting DAGSTER_HOME."""
    return dg.DagsterInstance.from_config(str(home / "dagster"))


def run_timings(home: Path, started: float, ended: float) -> dict:
    """The newest run of the home's instance, decomposed: seconds per step (in the order they started), before the
    first step, between steps, after the last one; the number of events the run wrote."""
    with instance_of(home) as instance:
        records = instance.get_run_records(limit=1)
        if not records:
            return {"steps": {}, "events": 0}
        run_id = records[0].dagster_run.run_id
        logs = instance.all_logs(run_id)
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}
    first_event = logs[0].timestamp if logs else started
    run_start = first_event
    for record in logs:
        event = record.dagster_event
        if event is None:
            continue
        if event.event_type == dg.DagsterEventType.RUN_START:
            run_start = record.timestamp
        elif event.event_type == dg.DagsterEventType.STEP_START and event.step_key:
            starts.setdefault(event.step_key, record.timestamp)
        elif event.event_type in STEP_ENDS and event.step_key:
            ends[event.step_key] = record.timestamp
    ordered = sorted(starts, key=starts.__getitem__)
    steps = {key: round(ends.get(key, starts[key]) - starts[key], 3) for key in ordered}
    if not ordered:
        return {"run_id": run_id, "steps": {}, "events": len(logs)}
    first, last_end = starts[ordered[0]], max(ends.get(key, starts[key]) for key in ordered)
    return {
        "run_id": run_id,
        "steps": steps,
        "events": len(logs),
        # the interpreter, the imports, the instance, the run's creation: up to its first event
        "before_first_event_s": round(first_event - started, 3),
        # the planned-materialization events, the run's start, the resources: up to the first step
        "first_event_to_first_step_s": round(first - first_event, 3),
        "to_run_start_s": round(run_start - started, 3),
        "before_first_step_s": round(first - started, 3),
        "between_steps_s": round(last_end - first - sum(steps.values()), 3),
        "after_last_step_s": round(ended - last_end, 3),
    }


def step_share(timings: dict) -> list[tuple[str, float]]:
    """The decomposition as (part, seconds) rows: before the first step, each step, between steps, after."""
    if not timings.get("steps"):
        return []
    return [
        ("before the first step", timings["before_first_step_s"]),
        *timings["steps"].items(),
        ("between steps (Dagster)", timings["between_steps_s"]),
        ("after the last step", timings["after_last_step_s"]),
    ]

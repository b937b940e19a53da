"""The newly-due step with the collections schedule on: 3 policies, a send window in the customer's time zone
with a country's holidays, and spacing, against the same step without them and the bare anti-join floor.

`python -m bench.schedule [--tier 1m] [--repeat 5] [--out bench/RESULTS.md]`

The tier's home (`bench.run.template_for`: the snapshot and a ledger with its history) gets two columns the
schedule reads: `segment` (a third `enterprise`, a third `smb`, a third none) and `customer_timezone` (eight
zones across the day, one in ten unknown or missing). The step timed is the assets' own (`cycle.cycle_snapshot`
then `steps.plan_step`, as `bench.steps` times it), in one process, each configuration alternately, medians kept.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

import polars as pl

from bench.run import AS_OF, ROOT, TIERS, finish, machine, template_for
from bench.steps import floor_query

ZONES = ["Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Sydney", "America/Los_Angeles",
         "Europe/London", "Asia/Kolkata", "America/Sao_Paulo", "Nowhere/Unknown", None]  # fmt: skip

SCHEDULE = {
    "timezone": "Europe/Berlin",
    "stages": [
        {"name": "day3", "days_overdue": 3},
        {"name": "day7", "days_overdue": 7},
        {"name": "day14", "days_overdue": 14, "min_remaining_ratio": 0.25},
    ],
    "min_hours_between_reminders": 48,
    "send_window": {
        "days": ["mon", "tue", "wed", "thu", "fri"],
        "start": "09:00",
        "end": "17:00",
        "timezone": "customer",
        "holidays": {"country": "DE", "subdivision": "BE", "dates": ["2026-12-24"]},
    },
    "policies": [
        {
            "name": "enterprise",
            "match": {"segment": ["enterprise"]},
            "stages": [{"name": "day7", "days_overdue": 7, "tone": "gentle"}, {"name": "day30", "days_overdue": 30}],
            "min_hours_between_reminders": 168,
        },
        {
            "name": "smb",
            "match": {"segment": ["smb"], "max_amount_minor": 500_000},
            "stages": [
                {"name": "before", "days_overdue": -3},
                {"name": "day3", "days_overdue": 3},
                {"name": "day14", "days_overdue": 14},
            ],  # fmt: skip
            "send_window": {
                "start": "08:00",
                "end": "20:00",
                "timezone": "customer",
                "holidays": {"country": "US"},
            },  # fmt: skip
        },
    ],
}


def scheduled_snapshot(template: Path) -> Path:
    path = template / "bench-snapshot-scheduled.parquet"
    if path.exists():
        return path
    frame = pl.read_parquet(template / "bench-snapshot.parquet")
    n = frame.height
    index = pl.int_range(0, n, eager=True)
    segments = pl.Series("segment", ["enterprise", "smb", None]).gather(index % 3)
    zones = pl.Series("customer_timezone", ZONES).gather((index * 7) % len(ZONES))
    frame.with_columns(segments, zones).write_parquet(path)
    return path


def plan_timings(template: Path, repeat: int) -> dict:
    from dunning.config import DunningConfig
    from dunning.ledger.backends.duckdb_ledger import open_ledger
    from dunning.plan.clock import CycleClock, RunMode
    from dunning.run import cycle, steps

    configs = {"default": DunningConfig(), "schedule": DunningConfig.model_validate(SCHEDULE)}
    snapshots = {"default": template / "bench-snapshot.parquet", "schedule": scheduled_snapshot(template)}
    loaded = {name: cycle.load_snapshot(snapshots[name], configs[name]).valid for name in configs}
    times: dict[str, list[float]] = {name: [] for name in configs}
    result: dict[str, dict] = {}
    with open_ledger(template / "dunning.duckdb") as ledger:
        for _ in range(repeat):
            for name, config in configs.items():
                clock = CycleClock(AS_OF, RunMode.LIVE, AS_OF.astimezone(config.zone).date())
                started = time.perf_counter()
                cycled = cycle.cycle_snapshot(ledger, loaded[name], config, AS_OF)
                plan = steps.plan_step(ledger, cycled, None, config, clock)
                times[name].append(time.perf_counter() - started)
                due = cycle.due_rows(plan)
                result[name] = {
                    "due": due.height,
                    "sendable": cycle.sendable_due(plan).height,
                    "waiting": cycle.waiting_by_reason(plan),
                    "policies": dict(sorted(plan.group_by("policy").len().iter_rows())) if "policy" in plan.columns
                    else {},
                }  # fmt: skip
    for name in configs:
        result[name] |= {
            "median_s": round(statistics.median(times[name]), 3),
            "runs_s": [round(t, 3) for t in times[name]],
        }
    return result


def markdown(report: dict) -> str:
    d, s, f = report["plan"]["default"], report["plan"]["schedule"], report["floor"]
    ratio = s["median_s"] / f["median_s"]
    waiting = ", ".join(f"{k} {v:,}" for k, v in s["waiting"].items())
    policies = ", ".join(f"{k} {v:,}" for k, v in s["policies"].items())
    return "\n".join([
        "", f"## {report['at']} — the newly-due step with the collections schedule", "",
        f"Machine: {report['machine']}.",
        f"Command: `python -m bench.schedule --tier {report['tier']} --repeat {report['repeat']}` "
        f"(total {report['total_s']:.0f} s). Config: `bench/schedule.py` `SCHEDULE` (3 policies, a customer-time-zone "
        "window with DE-BE and US holidays, spacing 48 h and 168 h); medians, the two configurations alternated.", "",
        "| tier | measurement | result | target |", "|---|---|---|---|",
        f"| {report['tier']} | keys due, without / with the schedule | {d['due']:,} / {s['due']:,} | |",
        f"| {report['tier']} | plan rows by policy (with) | {policies} | |",
        f"| {report['tier']} | keys waiting (with) | {waiting or 'none'} | |",
        f"| {report['tier']} | step `newly_due` without the schedule | {d['median_s']:.2f} s | |",
        f"| {report['tier']} | step `newly_due` with the schedule | {s['median_s']:.2f} s "
        f"({s['median_s'] / d['median_s']:.2f}x without) | |",
        f"| {report['tier']} | floor: bare DuckDB anti-join | {f['median_s']:.2f} s | |",
        f"| {report['tier']} | newly-due step with the schedule / floor | {ratio:.1f}x | "
        + ("met" if ratio <= 1.5 else "**missed** (≤ 1.5x)") + " |",
        "",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tier", default="1m", choices=sorted(TIERS))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    template, _ = template_for(args.tier, TIERS[args.tier], 1)
    report = {
        "at": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        "machine": machine(),
        "tier": args.tier,
        "repeat": args.repeat,
        "plan": plan_timings(template, args.repeat),
        "floor": floor_query(template, AS_OF, repeat=args.repeat),
    }
    finish(report, started, markdown, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The tier where every invoice shares one due date: a month billed on the 1st, first seen with no history.

`python -m bench.one_day [--invoices 1000000] [--repeat 3] [--full] [--out bench/RESULTS.md]`

Every invoice is open, unpaid, due the same day and unknown to the ledger, so every state column of the plan
is null (polars keeps such columns as scalar columns: the shape that crashed the plan at 20,000 invoices,
`tests/test_plan_shapes.py`). Measured: the `dunning run --dry-run` process (wall, CPU, peak RSS), the plan's
steps in-process (load and validate, newly due), and with `--full` the live run into the file outbox.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

import polars as pl

from bench.run import AS_OF, DATA, ROOT, timed_cli, warm_instance
from bench.trash import discard, empty

DUE = dt.date(2026, 11, 1)  # AS_OF is 29 days later: every invoice past day14


def snapshot(path: Path, invoices: int) -> Path:
    """`invoices` open invoices of as many customers, all due on `DUE`."""
    ids = pl.int_range(0, invoices, eager=True).cast(pl.String)
    frame = pl.DataFrame(
        {
            "invoice_id": "in_" + ids,
            "customer_id": "cus_" + ids,
            "customer_email": "c" + ids + "@example.com",
            "currency": ["USD"] * invoices,
            "amount_due": [12_500] * invoices,
            "amount_paid": [0] * invoices,
            "due_date": [DUE] * invoices,
            "status": ["open"] * invoices,
            "customer_name": "Customer " + ids,
        }
    )
    frame.write_parquet(path)
    return path


def in_process_plan(path: Path, repeat: int) -> dict:
    from dunning.config import DunningConfig
    from dunning.plan.policy import STATE_SCHEMA, assign_cycles
    from dunning.run import cycle

    config = DunningConfig()
    loads, plans, due = [], [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        loaded = cycle.load_snapshot(path, config)
        loads.append(time.perf_counter() - started)
        started = time.perf_counter()
        cycled = assign_cycles(loaded.valid, pl.DataFrame(schema=STATE_SCHEMA), AS_OF, config)
        due = cycle.sendable_due(cycle.plan_cycle(cycled, config)).height
        plans.append(time.perf_counter() - started)
    return {"load_validate_s": round(statistics.median(loads), 2), "newly_due_s": round(statistics.median(plans), 2),
            "due": due}  # fmt: skip


def cli_runs(path: Path, repeat: int, dry_run: bool) -> dict:
    walls, cpus, rss, out = [], [], [], ""
    for _ in range(repeat):
        home = DATA / "one-day-home"
        discard(home)
        home.mkdir(parents=True)
        warm_instance(home)
        args = ["--home", str(home), "run", "--snapshot", str(path), "--as-of", AS_OF.isoformat()]
        wall, peak, out, cpu = timed_cli(args + (["--dry-run"] if dry_run else []))
        walls.append(wall)
        cpus.append(cpu)
        rss.append(peak)
        discard(home)
    return {"median_s": statistics.median(walls), "runs_s": walls, "median_cpu_s": statistics.median(cpus),
            "peak_rss_mb": max(rss) // 1024, "summary": out.strip()}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--invoices", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--full", action="store_true", help="also the live run into the file outbox (slow)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args(argv)
    DATA.mkdir(parents=True, exist_ok=True)
    started = time.time()
    path = snapshot(DATA / "one-day.parquet", args.invoices)
    try:
        plan = in_process_plan(path, args.repeat)
        dry = cli_runs(path, args.repeat, dry_run=True)
        full = cli_runs(path, 1, dry_run=False) if args.full else None
    finally:
        empty(DATA, Path("/dev/shm"))
    n = f"{args.invoices:,}"
    rows = [
        f"| {n} due on one day | keys newly due | {plan['due']:,} | all of them (none crashes) |",
        f"| {n} due on one day | step load and validate (median) | {plan['load_validate_s']} s | |",
        f"| {n} due on one day | step newly due (median) | {plan['newly_due_s']} s | |",
        f"| {n} due on one day | `dunning run --dry-run` (median of {args.repeat}) | {dry['median_s']} s, CPU "
        f"{dry['median_cpu_s']} s, peak RSS {dry['peak_rss_mb']:,} MB | completes |",
    ]
    if full is not None:
        rows.append(f"| {n} due on one day | full `dunning run`, file outbox | {full['median_s']} s, CPU "
                    f"{full['median_cpu_s']} s, peak RSS {full['peak_rss_mb']:,} MB | completes |")  # fmt: skip
    text = "\n".join(
        [
            "",
            f"## {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')} — every invoice due on one day",
            "",
            f"Command: `python -m bench.one_day {' '.join(argv or sys.argv[1:])}` "
            f"(total {time.time() - started:.0f} s).",
            "",
            "| tier | measurement | result | target |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    )
    print(text)
    with open(args.out, "a", encoding="utf-8") as out:
        out.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The new deployment: a snapshot of 1M invoices for 200k customers, about half overdue, and a home with nothing.

`python -m bench.new_deployment [--invoices 1000000] [--repeat 3] [--live-repeat 1]` prints the measurements as
JSON (`make bench-check` runs the same functions and judges them against `bench/budgets.toml`).

The snapshot is the demo's (`dunning.demo.generate_snapshot`: customers with about five invoices each, skewed, a
mix of currencies, 1% without an email address), with each row's status and due date redrawn from a hash of its
index (seeded, so the same file every time; cached under bench/data/): half of the invoices are open and 1 to 40
days overdue at the bench's clock (a quarter of them part-paid), the other half keep the demo's status and any
open one among them falls due within the next 20 days. Every repetition runs on a home that does not exist yet
(no ledger, no Dagster instance: what a new user's first command meets): the first `dunning run --dry-run`, and
the first live run into the file outbox (HOME/outbox, on the disk that holds bench/data/), each timed whole by
`/usr/bin/time` and decomposed from its Dagster events (`bench.dagster_events`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import polars as pl

from bench.dagster_events import run_timings
from bench.run import AS_OF, DATA, timed_cli
from bench.trash import discard, empty

SEED = 36  # the number; any fixed seed gives a fixed file
OVERDUE_SHARE = 0.5
CUSTOMERS_PER_INVOICE = 0.2  # 1M invoices, 200k customers


def _uniform(stream: int) -> pl.Expr:
    bits = pl.int_range(pl.len(), dtype=pl.UInt64).hash(SEED * 1_000_003 + stream) % (1 << 53)
    return bits.cast(pl.Float64) * 2.0**-53


def new_deployment_frame(invoices: int) -> pl.DataFrame:
    """The demo snapshot with about OVERDUE_SHARE of its invoices open and overdue at the bench's clock."""
    from dunning.demo import generate_snapshot

    as_of = AS_OF.date()
    demo = generate_snapshot(invoices, as_of=as_of, seed=SEED, invoices_per_customer=1 / CUSTOMERS_PER_INVOICE)
    overdue = _uniform(1) < OVERDUE_SHARE
    days_late = (1 + (_uniform(2) * 40).floor()).cast(pl.Int64)  # 1 .. 40 days overdue
    days_ahead = (_uniform(2) * 21).floor().cast(pl.Int64)  # due today .. in 20 days
    part_paid = _uniform(3) < 0.25
    paid = (pl.col("amount_due") * (0.05 + 0.85 * _uniform(4))).floor().cast(pl.Int64).clip(1, pl.col("amount_due") - 1)
    return (
        demo.with_columns(
            status=pl.when(overdue).then(pl.lit("open")).otherwise(pl.col("status")),
            amount_paid=pl.when(overdue)
            .then(pl.when(part_paid).then(paid).otherwise(0))
            .otherwise(pl.col("amount_paid")),
            due_date=pl.when(overdue)
            .then(pl.lit(as_of) - pl.duration(days=days_late))
            .when(pl.col("status") == "open")
            .then(pl.lit(as_of) + pl.duration(days=days_ahead))
            .otherwise(pl.col("due_date")),
        )
        .with_columns(billing_period=pl.col("due_date").dt.month_start().dt.offset_by("-1mo").dt.strftime("%Y-%m"))
        .select(demo.columns)
    )


def snapshot(invoices: int) -> tuple[Path, dict]:
    """The cached snapshot file for `invoices` rows and what it holds (written once, then reused)."""
    path = DATA / f"new-deployment-{invoices}.parquet"
    marker = path.with_suffix(".json")
    if path.exists() and marker.exists():
        return path, json.loads(marker.read_text())
    frame = new_deployment_frame(invoices)
    frame.write_parquet(path)
    overdue = frame.filter((pl.col("status") == "open") & (pl.col("due_date") < AS_OF.date()))
    sizes = {
        "invoices": frame.height,
        "customers": frame.get_column("customer_id").n_unique(),
        "overdue": overdue.height,
        "customers_overdue": overdue.get_column("customer_id").n_unique(),
        "polars": pl.__version__,
    }
    marker.write_text(json.dumps(sizes))
    return path, sizes


def cli_run(home: Path, args: list[str]) -> dict:
    """One `dunning` process on `home`: wall, CPU, peak RSS, its summary, and its run's Dagster timings."""
    started = time.time()
    wall, rss, out, cpu = timed_cli(["--home", str(home), *args])
    ended = time.time()
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": rss // 1024, "summary": out.strip(),
            **run_timings(home, started, ended)}  # fmt: skip


def median_run(runs: list[dict]) -> dict:
    """The run of median wall time, with every run's wall and CPU beside it (its steps are that run's)."""
    ordered = sorted(runs, key=lambda r: r["wall_s"])
    middle = ordered[(len(ordered) - 1) // 2]
    return {**middle, "runs_s": [r["wall_s"] for r in runs], "cpus_s": [r["cpu_s"] for r in runs],
            "median_s": statistics.median(r["wall_s"] for r in runs)}  # fmt: skip


def first_runs(path: Path, repeat: int, dry_run: bool, keep: Path | None = None) -> dict:
    """`repeat` first runs, each on a home that does not exist yet; `keep`: the last home is moved there (the
    floors read its ledger) instead of being discarded."""
    runs = []
    for n in range(repeat):
        home = DATA / f"new-deployment-home-{'dry' if dry_run else 'live'}"
        discard(home)
        args = ["run", "--snapshot", str(path), "--as-of", AS_OF.isoformat()] + (["--dry-run"] if dry_run else [])
        runs.append(cli_run(home, args))
        if n == repeat - 1 and keep is not None:
            discard(keep)
            home.rename(keep)
        else:
            discard(home)  # deleted when the bench ends (bench/trash.py)
    result = median_run(runs)
    if not dry_run:
        result["outbox"] = "HOME/outbox under bench/data/ (the disk)"
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--invoices", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--live-repeat", type=int, default=1)
    args = parser.parse_args(argv)
    DATA.mkdir(parents=True, exist_ok=True)
    path, sizes = snapshot(args.invoices)
    try:
        report = {"snapshot": sizes, "dry_run": first_runs(path, args.repeat, dry_run=True)}
        report["live_run"] = first_runs(path, args.live_repeat, dry_run=False)
    finally:
        empty(DATA)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

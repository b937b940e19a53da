"""`make bench-check`: the 1M tiers against their budgets (bench/budgets.toml), each step in its own row.

`python -m bench.check [--repeat 3] [--tiers 1m[,10m]] [--record] [--no-fail] [--in-process] [--only PARTS]`

Runs, through the whole `dunning` process: the new deployment's first `--dry-run` and first live run
(bench/new_deployment.py), the warm 1M dry run and full cycle (bench/run.py's tier with 30 days of history), an
hour with nothing new at 10k and 1M (bench/noop.py), `dunning --version` and `--help` (bench/startup.py, with
`python -X importtime`), ingest + 4 shards against one unsharded run (bench/ingest.py), the floors of the
steps on the same data (bench/floors.py), and an empty Dagster job of the cycle's shape (bench/empty_job.py);
with `--tiers 1m,10m` also the warm 10M dry run. Prints one table (measurement, now, budget, last recorded,
verdict), appends it to bench/RESULTS.md with the machine and its load average, keeps the raw report in
bench/data/check-last.json, and exits 1 when a budget is missed (`--no-fail`: 0). `--record` writes this run's
figures to bench/recorded.json, the "last recorded" column of the next run. `--in-process` adds each step of
the new deployment's live cycle timed inside one process (bench/steps.py: the claim apart from the send).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import check_report
from bench.dagster_events import run_timings
from bench.run import AS_OF, DATA, ROOT, TIERS, TMPFS, calibration, interleaved_cycle_runs, machine, template_for
from bench.trash import discard, empty


def _load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip().split("load average:")[-1].strip()


def _median_details(measured: dict) -> dict:
    """A warm tier's result in the new deployment's shape: the median run's wall, CPU and Dagster timings."""
    from bench.new_deployment import median_run

    runs = [{"wall_s": w, "cpu_s": c, "peak_rss_mb": measured["peak_rss_mb"], **d}
            for w, c, d in zip(measured["runs_s"], measured["cpus_s"], measured["details"], strict=True)]  # fmt: skip
    return median_run(runs)


def send_floor(home: Path) -> dict:
    """The bare loop creating as many files of the same size as the run's outbox holds, beside it on the same disk."""
    from bench.steps import disk_floor

    outbox = home / "outbox"
    files = [entry.stat().st_size for entry in os.scandir(outbox)]
    rate = disk_floor(home.with_name(home.name + "-disk-floor"), len(files), sum(files) // max(len(files), 1))
    return {"s": round(len(files) / max(rate, 1), 2), "files": len(files), "files_per_s": rate}


def new_deployment(report: dict, repeat: int, in_process: bool, only: set[str]) -> None:
    from bench.floors import claim_record_floor, floors, publication_floor
    from bench.new_deployment import first_runs, snapshot

    path, report["snapshot_1m"] = snapshot(TIERS["1m"])
    dry_home, live_home = DATA / "check-new-dry", DATA / "check-new-live"
    report["new_1m_dry"] = first_runs(path, repeat, dry_run=True, keep=dry_home)
    live = "new_live" in only
    if live:
        report["new_1m_live"] = first_runs(path, max(1, repeat // 3), dry_run=False, keep=live_home)
    if "floors" in only:
        report["floors"]["new_1m"] = floors(dry_home, path, AS_OF, DATA / "check-floors")  # the ledger as found
        report["new_1m_dry"]["own_floors"] = {"publication": publication_floor(dry_home, DATA / "check-floors", 3)}
    if live and "floors" in only:
        report["new_1m_live"]["own_floors"] = {
            "publication": publication_floor(live_home, DATA / "check-floors", 3),
            "claim_record": claim_record_floor(dry_home, path, AS_OF, DATA / "check-floors"),  # the ledger it found
            "send": send_floor(live_home),
        }
    if "empty_job" in only:
        from bench.empty_job import measure

        report["empty_job"] = measure(dry_home, DATA / "check-empty-job")
    if in_process and live:
        from bench.steps import step_timings

        template = DATA / "check-new-template"  # what the in-process steps copy: the snapshot, an empty ledger
        discard(template)
        template.mkdir()
        shutil.copy(dry_home / "dunning.duckdb", template / "dunning.duckdb")
        (template / "bench-snapshot.parquet").symlink_to(path)
        report["new_1m_in_process"] = step_timings(template, AS_OF)
    discard(dry_home)
    discard(live_home)


def warm(report: dict, tier: str, repeat: int, full: bool, with_floors: bool = True, dry_run: bool = True) -> None:
    from bench.floors import floors

    template, sizes = template_for(tier, TIERS[tier], 1)
    if dry_run:
        dry = interleaved_cycle_runs([template], repeat, dry_run=True, inspect=run_timings)[0]
        report[f"warm_{tier}_dry"] = _median_details(dry) | {"keys": sizes}
    if full:
        measured = interleaved_cycle_runs([template], repeat, dry_run=False, inspect=run_timings)[0]
        report[f"warm_{tier}_full"] = _median_details(measured)
    if with_floors:
        report["floors"][f"warm_{tier}"] = floors(template, template / "bench-snapshot.parquet", AS_OF,
                                                  DATA / "check-floors")  # fmt: skip


def measure(args: argparse.Namespace) -> dict:
    from bench.ingest import measure as shards
    from bench.noop import noop_runs
    from bench.startup import commands, imports

    report: dict = {"when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "machine": machine(),
                    "load_before": _load(), "calibration": calibration(), "floors": {}}  # fmt: skip
    only = set(args.only.split(",")) if args.only else set(PARTS)
    if "startup" in only:
        report["startup"] = commands(max(5, args.repeat))
        report["imports"] = imports()
    if "new_dry" in only or "new_live" in only:
        new_deployment(report, args.repeat, args.in_process, only)
    if "warm_dry" in only or "warm_full" in only:
        warm(report, "1m", args.repeat, full="warm_full" in only, with_floors="floors" in only,
             dry_run="warm_dry" in only)  # fmt: skip
    if "idle" in only:
        report["idle_10k"] = noop_runs(template_for("10k", TIERS["10k"], 1)[0], AS_OF, args.repeat, run_timings)
        report["idle_1m"] = noop_runs(template_for("1m", TIERS["1m"], 1)[0], AS_OF, args.repeat, run_timings)
    if "shards" in only:  # one sample varied by 15% between runs: the median of `repeat`, every ratio kept
        samples = sorted((shards("1m", 4, 1) for _ in range(max(1, args.repeat))), key=lambda r: r["cpu_ratio"])
        report["shards"] = samples[(len(samples) - 1) // 2] | {"cpu_ratios": [r["cpu_ratio"] for r in samples]}
    if "10m" in args.tiers.split(","):
        warm(report, "10m", args.repeat, full=False)
    report["load_after"] = _load()
    return report


PARTS = ("startup", "new_dry", "new_live", "warm_dry", "warm_full", "idle", "shards", "floors", "empty_job")


def section(report: dict, rows: list[check_report.Row], budgets: dict, command: str) -> str:
    """The RESULTS.md entry: heading, machine, load, command, the table, then where `dunning --version`'s time goes."""
    imports = report.get("imports")
    snap = report.get("snapshot_1m", {"invoices": 0, "customers": 0, "overdue": 0, "customers_overdue": 0})
    lines = [
        "", f"## {report['when']} — bench-check: the 1M tiers against their budgets (issue 36)", "",
        f"Machine: {report['machine']}; one core of pure Python (`sum(range(10**8))`): "
        f"{report['calibration']['python_loop_s']:.2f} s CPU. Load average before: {report['load_before']}; after: "
        f"{report['load_after']} (the machine is shared).",
        f"Command: `{command}` (total {report['total_s']:.0f} s). New deployment: {snap['invoices']:,} invoices of "
        f"{snap['customers']:,} customers, {snap['overdue']:,} open and overdue ({snap['customers_overdue']:,} "
        "customers), on a home that does not exist yet; outbox HOME/outbox on the disk of bench/data/. Steps from "
        "each run's Dagster events (the run of median wall time); budgets from bench/budgets.toml.", "",
        *check_report.markdown(rows, budgets), "",
    ]  # fmt: skip
    if imports is None:
        return "\n".join(lines)
    lines += [
        f"`dunning --version` imports {imports['modules']:,} modules in {imports['total_s']:.2f} s "
        "(`python -X importtime`); own time per package: "
        + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in imports["self_by_package"])
        + "; cumulative: " + ", ".join(f"`{name}` {seconds:.2f} s" for name, seconds in imports["cumulative"].items())
        + ".", "",
    ]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (the new live run: repeat // 3)")
    parser.add_argument("--tiers", default="1m", help="1m always; 10m adds the warm 10M dry run (slow)")
    parser.add_argument("--record", action="store_true", help="write this run's figures to bench/recorded.json")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when a budget is missed")
    parser.add_argument("--in-process", action="store_true", help="also the new live cycle's steps in one process")
    parser.add_argument(
        "--only",
        default="",
        help="a comma-separated subset of the parts to run: "
        + ",".join(PARTS)
        + " (new_dry also runs when only new_live is named; floors and empty_job need new_dry)",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args(argv)
    budgets = check_report.load_budgets()
    recorded = json.loads(check_report.RECORDED.read_text()) if check_report.RECORDED.exists() else {}
    DATA.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        report = measure(args)
    finally:
        empty(DATA, TMPFS)
    report["total_s"] = round(time.perf_counter() - started, 1)
    (DATA / "check-last.json").write_text(json.dumps(report, indent=2, default=str))
    rows = check_report.judge(check_report.figures(report), budgets, recorded.get("figures", {}))
    command = "python -m bench.check " + " ".join(argv if argv is not None else sys.argv[1:])
    text = section(report, rows, budgets, command.strip())
    print(text)
    with open(args.out, "a", encoding="utf-8") as out:
        out.write(text)
    if args.record:  # with --only, the figures of the parts not run stay as recorded
        kept = recorded.get("figures", {}) if args.only else {}
        check_report.RECORDED.write_text(json.dumps(
            {"when": report["when"], "machine": report["machine"], "load": report["load_before"],
             "figures": kept | check_report.recorded_figures(rows)}, indent=1, sort_keys=True) + "\n")  # fmt: skip
    missed = check_report.failed(rows)
    if missed:
        print(f"bench-check: {len(missed)} budget(s) missed: " + ", ".join(row.key for row in missed), file=sys.stderr)
    return 1 if missed and not args.no_fail else 0


if __name__ == "__main__":
    sys.exit(main())

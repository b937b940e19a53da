"""Ingest once, shards read their part: one ingest plus N shard runs against one unsharded run, side by side.

`python -m bench.ingest [--tier 1m] [--shards 4] [--repeat 1] [--out bench/RESULTS.md]`

On copies of the tier's home (`bench.run.template_for`), in turn: the unsharded `dunning run` (full, into the file
outbox), then `dunning ingest` with `shards: N` and the N `dunning run --shard K/N` runs reading their parts, one
after another (wall, CPU and peak RSS of every process); each process's fixed start is measured apart (`dunning
status` on the same home: imports and the ledger, no work). Also: each shard's `rows_read`, the ingest's own
time in-process against the load-and-validate step it replaces, and the unsharded dry run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from bench.run import AS_OF, ROOT, TIERS, finish, machine, template_for, timed_cli
from bench.trash import discard


def _copy(template: Path, name: str) -> Path:
    home = template.with_name(f"{template.name}-{name}")
    discard(home)
    shutil.copytree(template, home, symlinks=True)
    return home


def _run(home: Path, *args: str) -> dict:
    wall, peak, out, cpu = timed_cli(["--home", str(home), *args])
    return {"wall_s": round(wall, 2), "cpu_s": cpu, "peak_rss_mb": peak // 1024, "out": out}


def in_process(template: Path, shards: int, repeat: int) -> dict:
    """The ingest's work in this process against load-and-validate of the same snapshot."""
    from dunning.config import DunningConfig
    from dunning.run import cycle, ingest

    config = DunningConfig(shards=shards)
    snapshot = template / "bench-snapshot.parquet"
    loads, splits = [], []
    for _ in range(repeat):
        started = time.perf_counter()
        whole = cycle.load_snapshot(snapshot, config)
        loads.append(time.perf_counter() - started)
        started = time.perf_counter()
        taken = cycle.snapshot_taken_at(whole.valid, AS_OF)
        for rows in ingest.split_by_shard(whole.valid, shards).values():
            from dunning.ingest.store import parquet_bytes

            parquet_bytes(ingest.part_frame(rows, taken))
        splits.append(time.perf_counter() - started)
    load, split = statistics.median(loads), statistics.median(splits)
    return {"load_validate_s": round(load, 3), "split_and_write_s": round(split, 3),
            "ingest_s": round(load + split, 3), "ratio": round((load + split) / load, 2)}  # fmt: skip


def measure(tier: str, shards: int, repeat: int) -> dict:
    """The unsharded runs, the ingest and the shard runs on copies of the tier's home, and the in-process ratio."""
    template, sizes = template_for(tier, TIERS[tier], 1)
    snapshot = str(template / "bench-snapshot.parquet")
    as_of = AS_OF.isoformat()

    home = _copy(template, "unsharded")
    fixed_single = _run(home, "status")
    dry = _run(home, "run", "--snapshot", snapshot, "--as-of", as_of, "--dry-run")
    single = _run(home, "run", "--snapshot", snapshot, "--as-of", as_of)
    discard(home)

    home = _copy(template, "sharded")
    (home / "config.yaml").write_text(f"shards: {shards}\n")
    fixed = _run(home, "status")
    ingest_run = _run(home, "ingest", "--snapshot", snapshot, "--as-of", as_of)
    shard_runs, rows_read = [], []
    for k in range(shards):
        shard_runs.append(_run(home, "run", "--shard", f"{k}/{shards}", "--as-of", as_of))
        status = json.loads(_run(home, "status", "--json")["out"])
        rows_read.append(status["last_run"]["rows_read"])
    discard(home)

    total = sizes.get("invoices") or TIERS[tier]
    sharded_cpu = ingest_run["cpu_s"] + sum(r["cpu_s"] for r in shard_runs)
    report = {
        "at": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(), "machine": machine(), "tier": tier,
        "shards": shards, "rows": total, "fixed_start": {"one process": fixed_single, "sharded home": fixed},
        "unsharded": single, "dry_run": dry, "ingest": ingest_run, "shard_runs": shard_runs, "rows_read": rows_read,
        "sharded_cpu_s": round(sharded_cpu, 2), "cpu_ratio": round(sharded_cpu / single["cpu_s"], 2),
        "in_process": in_process(template, shards, repeat),
    }  # fmt: skip
    for part in [report["unsharded"], report["dry_run"], report["ingest"], *report["shard_runs"]]:
        part["out"] = part["out"].strip().splitlines()[:2]
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tier", default="1m", choices=sorted(TIERS))
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    finish(measure(args.tier, args.shards, args.repeat), started, markdown, args.out)
    return 0


def markdown(r: dict) -> str:
    n, rows = r["shards"], r["rows"]
    worst = max(r["rows_read"]) / rows if rows else 0
    lines = [
        "",
        f"## {r['at']} — ingest once, shards read their part",
        "",
        f"Machine: {r['machine']}.",
        f"Command: `python -m bench.ingest --tier {r['tier']} --shards {n}` (total {r['total_s']:.0f} s); the runs one "
        "after another on copies of one home, each process timed whole (`/usr/bin/time`).",
        "",
        "| measurement | result | target |",
        "|---|---|---|",
        f"| fixed start of one `dunning` process (`status`: imports, the ledger, no work) | "
        f"{r['fixed_start']['one process']['wall_s']} s wall, {r['fixed_start']['one process']['cpu_s']} s CPU | |",
        f"| unsharded full `dunning run`, {rows:,} invoices | {r['unsharded']['wall_s']} s, CPU "
        f"{r['unsharded']['cpu_s']} s, peak RSS {r['unsharded']['peak_rss_mb']} MB | "
        + ("met" if r["unsharded"]["wall_s"] <= 25 else "**missed**")
        + " (≤ 25 s) |",
        f"| unsharded `--dry-run` | {r['dry_run']['wall_s']} s, CPU {r['dry_run']['cpu_s']} s | "
        + ("met" if r["dry_run"]["wall_s"] <= 6 else "**missed**")
        + " (≤ 6 s) |",
        f"| `dunning ingest`, {n} parts | {r['ingest']['wall_s']} s, CPU {r['ingest']['cpu_s']} s, peak RSS "
        f"{r['ingest']['peak_rss_mb']} MB | |",
    ]
    for k, run in enumerate(r["shard_runs"]):
        lines.append(f"| shard {k}/{n} run | {run['wall_s']} s, CPU {run['cpu_s']} s, peak RSS {run['peak_rss_mb']} MB,"
                     f" rows read {r['rows_read'][k]:,} | |")  # fmt: skip
    lines += [
        f"| ingest + {n} shards, CPU / one unsharded run | {r['sharded_cpu_s']} s / {r['unsharded']['cpu_s']} s = "
        f"{r['cpu_ratio']}x | " + ("met" if r["cpu_ratio"] <= 1.3 else "**missed**") + " (≤ 1.3x) |",
        f"| largest part / all rows | {worst:.3f} (1/N = {1 / n:.3f}) | "
        + ("met" if worst <= 1 / n + 0.05 else "**missed**")
        + " (≤ 1/N + 5%) |",
        f"| in-process: ingest (load, validate, split, write parts) / load and validate | "
        f"{r['in_process']['ingest_s']} s / {r['in_process']['load_validate_s']} s = {r['in_process']['ratio']}x | "
        + ("met" if r["in_process"]["ratio"] <= 1.2 else "**missed**")
        + " (≤ 1.2x) |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

"""The benchmark suite: `make bench` (or `python -m bench.run --tiers 100k,1m`), results appended to bench/RESULTS.md.

Per tier, on the same prepared data (a demo snapshot plus 30 earlier daily
cycles in the ledger): the whole `dunning run` through Dagster with the file
outbox and a `--dry-run`, each step in-process, the bare DuckDB anti-join
floor, the naive per-invoice poller (capped and extrapolated), and the cycle
with the ledger history doubled. Separately: a no-op cycle on 10k invoices and
the send rates to the file outbox and to a local aiosmtpd server.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.history import prepare_home
from bench.noop import floor, noop_runs
from bench.steps import floor_query, naive_poller, publication_with_daily_history, smtp_rate, step_timings
from bench.trash import discard, empty
from bench.yardstick import loop_seconds

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data"
AS_OF = dt.datetime(2026, 11, 30, 9, tzinfo=dt.UTC)
TIERS = {"10k": 10_000, "100k": 100_000, "1m": 1_000_000, "10m": 10_000_000}
DUNNING = Path(sys.executable).parent / "dunning"
TMPFS = Path("/dev/shm")


def timed_cli(args: list[str]) -> tuple[float, int, str, float]:
    """Wall seconds, peak RSS (KB), stdout and CPU seconds (user + system, of the process and the render workers
    it waited for) of one `dunning` process."""
    command = ["/usr/bin/time", "-f", "%e %M %U %S", str(DUNNING), *args]
    result = subprocess.run(command, capture_output=True, text=True)
    wall, rss, user, system = result.stderr.strip().splitlines()[-1].split()
    if result.returncode != 0:
        raise RuntimeError(f"dunning {' '.join(args)} failed: {result.stderr[-2000:]}")
    return float(wall), int(rss), result.stdout, round(float(user) + float(system), 2)


def cycle_runs(template: Path, repeat: int, dry_run: bool) -> dict:
    return interleaved_cycle_runs([template], repeat, dry_run)[0]


def interleaved_cycle_runs(
    templates: list[Path], repeat: int, dry_run: bool, inspect: Callable[[Path, float, float], dict] | None = None
) -> list[dict]:
    """`repeat` runs of each template, taken in turn (A, B, A, B, ...) so a slow spell of the disk hits both alike.
    `inspect(home, started, ended)` reads each run's home before it is discarded (wall-clock times around the
    process); what it returns is kept per run, in `details`."""
    details: list[list[dict]] = [[] for _ in templates]
    walls: list[list[float]] = [[] for _ in templates]
    cpus: list[list[float]] = [[] for _ in templates]
    rss: list[list[int]] = [[] for _ in templates]
    out = ["" for _ in templates]
    for _ in range(repeat):
        for i, template in enumerate(templates):
            home = template.with_name(template.name + "-run")
            discard(home)
            shutil.copytree(template, home, symlinks=True)  # the analysts' file's WAL guard is a dangling link
            args = [
                "--home",
                str(home),
                "run",
                "--snapshot",
                str(template / "bench-snapshot.parquet"),
                "--as-of",
                AS_OF.isoformat(),
            ] + (["--dry-run"] if dry_run else [])
            started = time.time()
            wall, peak, out[i], cpu = timed_cli(args)
            if inspect is not None:
                details[i].append(inspect(home, started, time.time()))
            walls[i].append(wall)
            cpus[i].append(cpu)
            rss[i].append(peak)
            discard(home)  # deleted when the bench ends: deleting it here slowed the next run's files (bench/trash.py)
    return [
        {
            "median_s": statistics.median(w),
            "runs_s": w,
            "median_cpu_s": statistics.median(c),
            "cpus_s": c,
            "peak_rss_mb": max(r) // 1024,
            "summary": o.strip(),
            **({"details": d} if inspect is not None else {}),
        }
        for w, c, r, o, d in zip(walls, cpus, rss, out, details, strict=True)
    ]


def template_for(name: str, n: int, factor: int) -> tuple[Path, dict]:
    template = DATA / f"{name}-h{factor}"
    marker = template / "prepared.json"
    if marker.exists():
        current_schema(template)
        return template, json.loads(marker.read_text())
    discard(template)
    sizes = prepare_home(template, n, AS_OF, history_factor=factor)
    current_schema(template)
    marker.write_text(json.dumps(sizes))
    return template, sizes


def current_schema(template: Path) -> None:
    """Bring a cached template to where a deployment stands between two runs: its ledger on this release's schema
    (a deployment migrates once, after an upgrade, not on every run), its history already published for
    analysts (publication rewrites only the days that changed since the last one, so a timed run pays for what
    it changes, as an hourly run does, not for publishing 30 days from scratch), and its Dagster instance
    created (`warm_instance`)."""
    from dunning.ledger.backends.duckdb_ledger import open_ledger

    with open_ledger(template / "dunning.duckdb") as ledger:
        if not (template / "analytics.duckdb").exists():
            ledger.publish(template)
    warm_instance(template)


def warm_instance(home: Path) -> None:
    """The home's Dagster instance, created and migrated as a deployment's first run leaves it (1.4 s on this
    machine, once per home, which the hourly runs a deployment makes never pay again), in a process of its own
    (the instance is found through DAGSTER_HOME, which it sets)."""
    if (home / "dagster" / "dagster.yaml").exists():
        return
    code = f"from pathlib import Path; from pipelines.instance import get_instance; get_instance(Path({str(home)!r}))"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, cwd=ROOT)


def bench_tier(name: str, repeat: int) -> dict:
    n = TIERS[name]
    template, sizes = template_for(name, n, 1)
    result = {"tier": name, **sizes}
    if n <= 1_000_000:
        doubled, doubled_sizes = template_for(name, n, 2)
        result["dry_run"], dry_doubled = interleaved_cycle_runs([template, doubled], repeat, dry_run=True)
        result["full_cycle"], full_doubled = interleaved_cycle_runs([template, doubled], repeat, dry_run=False)
        result["full_cycle_history_x2"] = {**full_doubled, "ledger_rows": doubled_sizes["ledger_rows"]}
        result["dry_run_history_x2"] = {**dry_doubled, "ledger_rows": doubled_sizes["ledger_rows"]}
    else:
        result["dry_run"] = cycle_runs(template, repeat, dry_run=True)
    if n <= 1_000_000:  # the hourly no-op: the same snapshot an hour later, skipped as unchanged
        result["noop"] = noop_runs(template, AS_OF, repeat)
    result["steps"] = step_timings(template, AS_OF, send=n <= 1_000_000)
    if TMPFS.is_dir() and n <= 1_000_000:  # the same send with the outbox in memory: the code's rate without the disk
        result["steps_tmpfs"] = step_timings(template, AS_OF, outbox_root=TMPFS)
    if n <= 100_000:
        result["publication"] = publication_with_daily_history(template, AS_OF)
    result["floor"] = floor_query(template, AS_OF)
    if n <= 1_000_000:  # compared with the full cycle, which the 10M tier does not run
        result["naive"] = naive_poller(template, AS_OF, cap_seconds=30)
    return result


def calibration(repeat: int = 3) -> dict:
    """CPU seconds of one fixed pure-Python loop on one core (median): how fast this machine runs Python, so
    sections of RESULTS.md taken on different machines can be compared (`import pipelines.cli` in the floor
    rows is a second such yardstick)."""
    runs = [loop_seconds() for _ in range(repeat)]
    return {"python_loop_s": round(statistics.median(runs), 2), "runs_s": [round(r, 2) for r in runs]}


def finish(report: dict, started: float, markdown: str | Callable[[dict], str], out: str | Path) -> None:
    """The end of a bench command: its total time in `report`, the report as JSON on stdout, and its markdown
    section appended to `out` (`bench/RESULTS.md`)."""
    report["total_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=2, default=str))
    with Path(out).open("a") as handle:
        handle.write(markdown if isinstance(markdown, str) else markdown(report))


def machine() -> str:
    import dagster
    import duckdb
    import pandera
    import polars

    cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    memory = subprocess.run(["free", "-g"], capture_output=True, text=True).stdout.splitlines()[1].split()[1]
    return (
        f"{platform.machine()}, {cores} cores, {memory} GiB; "
        f"Python {platform.python_version()}, dagster {dagster.__version__}, "
        f"duckdb {duckdb.__version__}, polars {polars.__version__}, pandera {pandera.__version__}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tiers", default="100k,1m", help="comma-separated: 10k, 100k, 1m, 10m")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args(argv)
    DATA.mkdir(parents=True, exist_ok=True)
    started = time.time()
    report = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "command": "python -m bench.run " + " ".join(argv or sys.argv[1:]),
        "tiers": [],
    }
    report["calibration"] = calibration()
    noop_template, _ = template_for("10k", TIERS["10k"], 1)
    report["noop_10k"] = noop_runs(noop_template, AS_OF, args.repeat)
    report["floor"] = floor(DATA / "floor", AS_OF, args.repeat)
    report["smtp"] = smtp_rate(DATA / "smtp", AS_OF, emails=3000)
    try:
        for tier in args.tiers.split(","):
            report["tiers"].append(bench_tier(tier.strip(), args.repeat))
            print(json.dumps(report["tiers"][-1], default=str)[:2000], flush=True)
    finally:
        empty(DATA, TMPFS)
    from bench.report import append_markdown, save

    save(report, Path(args.out), started, DATA / "last.json", append_markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

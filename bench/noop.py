"""The hourly no-op and its floor: a live run when nothing changed since the last one, against what any run costs.

`noop_runs` copies a tier's template, runs one live cycle on it (untimed: it makes the home's state current and
records what the next run compares with), then times `repeat` runs an hour apart with the same snapshot: each is
skipped as unchanged (`dunning.plan.unchanged`). `floor` measures what every `dunning run` pays before any work of its
own, step by step: the interpreter, the command's imports, the Dagster instance, and a whole skipped run on a
one-invoice home; and, for the same check without Dagster, a bare function call (the in-process composition of
`tests/in_process.py`'s kind: open the ledger, hash the snapshot, compare).
"""

from __future__ import annotations

import datetime as dt
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.trash import discard

PYTHON = sys.executable
DUNNING = Path(sys.executable).parent / "dunning"
ROOT = Path(__file__).resolve().parents[1]


def timed(command: list[str]) -> dict:
    """Wall and CPU (user + system) seconds and peak RSS (MB) of one process; CPU is what to compare on a busy
    machine."""
    result = subprocess.run(["/usr/bin/time", "-f", "%e %U %S %M", *command], capture_output=True, text=True, cwd=ROOT)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr[-2000:]}")
    wall, user, system, rss = result.stderr.strip().splitlines()[-1].split()
    return {
        "wall_s": float(wall),
        "cpu_s": round(float(user) + float(system), 2),
        "peak_rss_mb": int(rss) // 1024,
        "stdout": result.stdout,
    }


def _run(home: Path, snapshot: Path, as_of: dt.datetime) -> list[str]:
    return [str(DUNNING), "--home", str(home), "run", "--snapshot", str(snapshot), "--as-of", as_of.isoformat()]


def _summary(runs: list[dict]) -> dict:
    return {
        "median_s": statistics.median(r["wall_s"] for r in runs),
        "median_cpu_s": statistics.median(r["cpu_s"] for r in runs),
        "runs_s": [r["wall_s"] for r in runs],
        "cpus_s": [r["cpu_s"] for r in runs],
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
    }


def noop_runs(
    template: Path, as_of: dt.datetime, repeat: int, inspect: Callable[[Path, float, float], dict] | None = None
) -> dict:
    """`repeat` live runs, an hour apart, of a home whose last run had the same snapshot: each one skipped.
    `inspect(home, started, ended)` reads the home after each skipped run; the median run's is `median_details`."""
    home = template.with_name(template.name + "-noop")
    discard(home)
    shutil.copytree(template, home, symlinks=True)
    snapshot = template / "bench-snapshot.parquet"
    details = []
    try:
        first = timed(_run(home, snapshot, as_of))
        runs = []
        for h in range(repeat):
            started = time.time()
            runs.append(timed(_run(home, snapshot, as_of + dt.timedelta(hours=h + 1))))
            if inspect is not None:
                details.append(inspect(home, started, time.time()))
    finally:
        discard(home)
    skipped = sum("nothing changed since run" in r["stdout"] for r in runs)
    result = {
        **_summary(runs),
        "skipped": skipped,
        "first_cycle_s": first["wall_s"],
        "first_cycle_cpu_s": first["cpu_s"],
    }
    if details:
        result["median_details"] = details[
            sorted(range(len(runs)), key=lambda i: runs[i]["wall_s"])[(len(runs) - 1) // 2]
        ]
    return result


BARE_CHECK = """
import datetime as dt, sys
from pathlib import Path
from dunning.plan import unchanged
from dunning.plan.clock import cycle_clock
from dunning.config import DunningConfig
from dunning.ledger.backends.duckdb_ledger import open_ledger
from dunning.sharding import EVERYONE
home, snapshot, as_of = Path(sys.argv[1]), sys.argv[2], dt.datetime.fromisoformat(sys.argv[3])
config = DunningConfig()
clock = cycle_clock(as_of, None, config.zone, dry_run=False, as_of_given=True)
with open_ledger(home / "dunning.duckdb") as ledger:
    verdict = unchanged.judge(ledger, unchanged.RunInputs.of(snapshot, config, clock, EVERYONE), clock, config)
assert verdict.unchanged, verdict.reason
"""


def floor(directory: Path, as_of: dt.datetime, repeat: int) -> dict:
    """What a run costs before its own work, each part measured alone (median of `repeat`)."""
    from dunning.demo import generate_snapshot, write_snapshot

    discard(directory)
    home = directory / "home"
    home.mkdir(parents=True)
    snapshot = write_snapshot(generate_snapshot(1, as_of=as_of.date()), directory / "one.parquet")
    timed(_run(home, snapshot, as_of))  # the reference run the skipped ones compare with
    later = as_of + dt.timedelta(hours=1)
    parts = {
        "interpreter": [PYTHON, "-c", "pass"],
        "imports of the command": [PYTHON, "-c", "import pipelines.cli"],
        "imports and the Dagster instance": [
            PYTHON,
            "-c",
            f"from pathlib import Path; from pipelines.instance import get_instance; get_instance(Path({str(home)!r}))",
        ],  # fmt: skip
        "a skipped run, whole CLI (one invoice)": _run(home, snapshot, later),
        "the same check without Dagster (bare function call)": [
            PYTHON,
            "-c",
            BARE_CHECK,
            str(home),
            str(snapshot),
            later.isoformat(),
        ],  # fmt: skip
    }
    try:
        return {name: _summary([timed(command) for _ in range(repeat)]) for name, command in parts.items()}
    finally:
        discard(directory)

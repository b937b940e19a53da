"""What a `dunning` command costs before it does anything: `--version`, `--help`, and the imports behind them.

`commands` times each command `repeat` times as a whole process (a hyperfine-like median of wall times, with the
CPU); `imports` runs `python -X importtime` on `dunning --version` and sums the cumulative import time of each
top-level package, largest first: what a command that needs none of them still loads.
"""

from __future__ import annotations

import statistics
import subprocess
from collections import defaultdict

from bench.noop import DUNNING, PYTHON, ROOT, timed

COMMANDS = {"dunning --version": ["--version"], "dunning --help": ["--help"]}


def commands(repeat: int) -> dict:
    result = {}
    for name, args in COMMANDS.items():
        timed([str(DUNNING), *args])  # one untimed: the page cache holds the modules after it, as on a used machine
        runs = [timed([str(DUNNING), *args]) for _ in range(repeat)]
        result[name] = {
            "median_s": statistics.median(r["wall_s"] for r in runs),
            "median_cpu_s": statistics.median(r["cpu_s"] for r in runs),
            "runs_s": [r["wall_s"] for r in runs],
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        }
    return result


# modules whose cumulative import time (with what they import first) is worth naming
NAMED = ("dagster", "pandera.polars", "polars", "duckdb", "sqlalchemy", "pydantic", "jinja2", "urllib3", "babel",
         "dunning.config", "pipelines.definitions", "pipelines.cli")  # fmt: skip
ENTRY = "import sys; sys.argv = ['dunning', '--version']; from pipelines.cli import entry; entry()"


def imports(top: int = 12) -> dict:
    """`dunning --version`'s imports: the seconds spent in each top-level package's own modules (self time, largest
    `top` first; they sum to the whole), and the cumulative time of the NAMED modules (each with what it imported
    first: what importing it costs a command that has imported nothing else)."""
    done = subprocess.run([PYTHON, "-X", "importtime", "-c", ENTRY], capture_output=True, text=True, cwd=ROOT)
    own: dict[str, float] = defaultdict(float)
    first: dict[str, float] = {}
    modules = 0
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        self_us, cumulative_us, name = line.removeprefix("import time:").split("|")
        package = name.strip().split(".")[0]
        modules += 1
        own[package] += int(self_us) / 1e6
        if name.strip() in NAMED:
            first[name.strip()] = int(cumulative_us) / 1e6
    ranked = sorted(own.items(), key=lambda item: -item[1])[:top]
    return {
        "total_s": round(sum(own.values()), 2),
        "modules": modules,
        "self_by_package": [(name, round(seconds, 3)) for name, seconds in ranked],
        "cumulative": {name: round(seconds, 3) for name, seconds in first.items()},
    }

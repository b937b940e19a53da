"""Where the suite's CPU goes, from the lines `tests/timing.py` writes.

    rm -f /tmp/times.tsv; DUNNING_TEST_TIMES=/tmp/times.tsv make test
    python -m bench.suite_costs /tmp/times.tsv [--top 15]

prints the CPU of all tests, split into the `dunning` commands run in the tests' own processes (by command, and
the Dagster runs of the cycle among them), the child processes they started (`dunning` processes, the webserver,
the daemon, PostgreSQL's and dovecot's tools), and the rest (the tests' own work: in-process cycles, fixtures,
servers in threads); how many Dagster runs each test makes; the files and tests that cost most; and the tests
at 0.4 CPU-s or more that are not marked `slow`, against the suite's rule. Lines of the older four-column form
count only as the rest.
"""

from __future__ import annotations

import argparse
import collections
import sys
from dataclasses import dataclass, field
from pathlib import Path

SLOW_CPU_SECONDS = 0.4  # the suite's rule: a test that costs this much is marked `slow` (docs/development.md)


@dataclass
class TestCost:
    node: str
    wall: float
    cpu: float
    children: float = 0.0
    commands: dict[str, int] = field(default_factory=dict)
    commands_cpu: float = 0.0
    runs: int = 0
    runs_cpu: float = 0.0
    slow: bool | None = None  # None: a line that does not say

    @property
    def file(self) -> str:
        return self.node.split("::", 1)[0]

    @property
    def rest(self) -> float:
        return self.cpu - self.children - self.commands_cpu


def parse(line: str) -> TestCost:
    fields = line.rstrip("\n").split("\t")
    cost = TestCost(fields[0], float(fields[1]), float(fields[2]))
    if len(fields) >= 9:
        cost.children = float(fields[4])
        cost.commands = {
            name: int(count) for name, count in (pair.rsplit(":", 1) for pair in fields[5].split(",") if pair)
        }
        cost.commands_cpu, cost.runs, cost.runs_cpu = float(fields[6]), int(fields[7]), float(fields[8])
    if len(fields) >= 10:
        cost.slow = fields[9] == "slow"
    return cost


def read(path: Path) -> list[TestCost]:
    return [parse(line) for line in path.read_text().splitlines() if line.strip()]


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def summary(costs: list[TestCost], top: int = 15) -> str:
    cpu = sum(c.cpu for c in costs)
    children = sum(c.children for c in costs)
    commands_cpu = sum(c.commands_cpu for c in costs)
    runs = sum(c.runs for c in costs)
    runs_cpu = sum(c.runs_cpu for c in costs)
    rest = sum(c.rest for c in costs)
    count: collections.Counter[str] = collections.Counter()
    for c in costs:
        count.update(c.commands)
    lines = [
        f"{len(costs)} tests: {cpu:.1f} CPU-s (wall summed over the workers: {sum(c.wall for c in costs):.1f} s)",
        f"- `dunning` commands in the tests' processes: {sum(count.values())}, {commands_cpu:.1f} CPU-s "
        f"({_share(commands_cpu, cpu)})",
        f"  - of which Dagster runs of the cycle: {runs}, {runs_cpu:.1f} CPU-s"
        + (f", {runs_cpu / runs:.3f} CPU-s a run" if runs else ""),
        f"- child processes: {children:.1f} CPU-s ({_share(children, cpu)})",
        f"- the rest (the tests' own work): {rest:.1f} CPU-s ({_share(rest, cpu)})",
        "",
        "Dagster runs per test: "
        + ", ".join(f"{n}: {tests} tests" for n, tests in sorted(collections.Counter(c.runs for c in costs).items())),
        "",
        "| command | calls | CPU-s (with its runs) |",
        "|---|---|---|",
    ]
    by_command: collections.Counter[str] = collections.Counter()
    for c in costs:  # a test's commands' CPU, shared out by its calls (the file keeps no per-call figure)
        calls = sum(c.commands.values())
        for name, n in c.commands.items():
            by_command[name] += c.commands_cpu * n / calls
    lines += [f"| {name} | {count[name]} | {seconds:.1f} |" for name, seconds in by_command.most_common()]
    files: dict[str, list[TestCost]] = collections.defaultdict(list)
    for c in costs:
        files[c.file].append(c)
    lines += ["", f"The {top} files that cost most:", "", "| file | tests | CPU-s | commands | children | rest |"]
    lines.append("|---|---|---|---|---|---|")
    for name, group in sorted(files.items(), key=lambda kv: -sum(c.cpu for c in kv[1]))[:top]:
        lines.append(
            f"| {name} | {len(group)} | {sum(c.cpu for c in group):.1f} | {sum(c.commands_cpu for c in group):.1f} "
            f"| {sum(c.children for c in group):.1f} | {sum(c.rest for c in group):.1f} |"
        )
    lines += ["", f"The {top} tests whose own work costs most (CPU-s outside commands and children):", ""]
    for c in sorted(costs, key=lambda c: -c.rest)[:top]:
        lines.append(f"- {c.rest:.2f} of {c.cpu:.2f}: {c.node}")
    unmarked = [c for c in costs if c.slow is False and c.cpu >= SLOW_CPU_SECONDS]
    if unmarked:
        lines += ["", f"Not marked slow, at {SLOW_CPU_SECONDS} CPU-s or more (`make test-fast` runs them):", ""]
        lines += [f"- {c.cpu:.2f}: {c.node}" for c in sorted(unmarked, key=lambda c: -c.cpu)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.suite_costs", description=__doc__.split("\n\n")[0])
    parser.add_argument("times", type=Path, help="the file DUNNING_TEST_TIMES named")
    parser.add_argument("--top", type=int, default=15, help="files and tests listed (default 15)")
    args = parser.parse_args(argv)
    if not args.times.is_file():
        print(f"suite_costs: no file at {args.times}: run `DUNNING_TEST_TIMES={args.times} make test` first",
              file=sys.stderr)  # fmt: skip
        return 2
    print(summary(read(args.times), args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

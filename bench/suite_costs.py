"""Where the suite's CPU goes, from the lines `tests/timing.py` writes.

    make test                                   # writes .suite-times.tsv, then checks its budget
    python -m bench.suite_costs .suite-times.tsv [--top 15]
    python -m bench.suite_costs .suite-times.tsv --brief --budget bench/suite_budget.toml [--calibrate]

(`DUNNING_TEST_TIMES=FILE make test`, or `make test-fast`, or a plain `pytest`, writes FILE instead.)

prints the CPU of all tests, split into the `dunning` commands run in the tests' own processes (by command, and
the Dagster runs of the cycle among them), the child processes they started (`dunning` processes, the webserver,
the daemon, PostgreSQL's and dovecot's tools), and the rest (the tests' own work: in-process cycles, fixtures,
servers in threads); how many Dagster runs each test makes; the files and tests that cost most; and the tests
at 0.4 CPU-s or more that are not marked `slow`, against the suite's rule. Lines of the older four-column form
count only as the rest.

With `--budget`, it also holds the suite's work to the budget file: the Dagster runs of the cycle, the in-process
`dunning` commands and the processes the tests started through `subprocess`. Those are counts, which neither the
machine nor the number of xdist workers changes (`tests/timing.py` leaves out what wider fixtures do), so a
change that adds thirty Dagster runs to the suite fails `make test` in its own commit, whatever the machine's
hour (exit 1, naming the count). The CPU is printed beside them, and with `--calibrate` also divided by one
core's time for a fixed pure-Python loop here (`bench.run.calibration`), so suites run on different machines or
hours can be compared; it is never a failure: on a shared machine it moves by a fifth from one hour to the next.
A file or budget it cannot read is exit 2, naming the line or the key.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tomllib
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
    children_started: int = 0
    columns: int = 11  # how many the line had: fewer than 11 is an older form, without every count

    @property
    def file(self) -> str:
        return self.node.split("::", 1)[0]

    @property
    def rest(self) -> float:
        return self.cpu - self.children - self.commands_cpu


FORMS = (3, 4, 9, 10, 11)  # the columns of each form the plugin has written, oldest first


def parse(line: str) -> TestCost:
    fields = line.rstrip("\n").split("\t")
    if len(fields) not in FORMS:
        raise ValueError(f"{len(fields)} columns")
    cost = TestCost(fields[0], float(fields[1]), float(fields[2]), columns=len(fields))
    if len(fields) >= 9:
        cost.children = float(fields[4])
        cost.commands = {
            name: int(count) for name, count in (pair.rsplit(":", 1) for pair in fields[5].split(",") if pair)
        }
        cost.commands_cpu, cost.runs, cost.runs_cpu = float(fields[6]), int(fields[7]), float(fields[8])
    if len(fields) >= 10:
        cost.slow = fields[9] == "slow"
    if len(fields) >= 11:
        cost.children_started = int(fields[10])
    return cost


def read(path: Path) -> list[TestCost]:
    """Every line of the file; a line that is not one `tests/timing.py` writes is a ValueError naming it."""
    costs = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            costs.append(parse(line))
        except (IndexError, ValueError):
            raise ValueError(f"{path}, line {number}: not a line of tests/timing.py: {line[:80]!r}") from None
    return costs


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
        f"- child processes: {children:.1f} CPU-s ({_share(children, cpu)}); "
        f"{sum(c.children_started for c in costs)} started through `subprocess`",
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
    runners = sorted((c for c in costs if c.runs), key=lambda c: (-c.runs, -c.runs_cpu))
    lines += ["", f"The {top} tests that make most Dagster runs of the cycle (their CPU):", ""]
    lines += [f"- {c.runs}, {c.runs_cpu:.2f} CPU-s: {c.node}" for c in runners[:top]]
    starters = sorted((c for c in costs if c.children_started), key=lambda c: (-c.children_started, -c.children))
    lines += ["", f"The {top} tests that start most processes through `subprocess` (their CPU):", ""]
    lines += [f"- {c.children_started}, {c.children:.2f} CPU-s: {c.node}" for c in starters[:top]]
    lines += ["", f"The {top} tests whose own work costs most (CPU-s outside commands and children):", ""]
    for c in sorted(costs, key=lambda c: -c.rest)[:top]:
        lines.append(f"- {c.rest:.2f} of {c.cpu:.2f}: {c.node}")
    unmarked = [c for c in costs if c.slow is False and c.cpu >= SLOW_CPU_SECONDS]
    if unmarked:
        lines += ["", f"Not marked slow, at {SLOW_CPU_SECONDS} CPU-s or more (`make test-fast` runs them):", ""]
        lines += [f"- {c.cpu:.2f}: {c.node}" for c in sorted(unmarked, key=lambda c: -c.cpu)]
    return "\n".join(lines)


# the counts a budget may hold, in the order printed: the budget file's key, what it counts, and how
COUNTS = {
    "dagster_runs": ("Dagster runs of the cycle in the tests' processes", lambda c: c.runs),
    "in_process_commands": ("`dunning` commands in the tests' processes", lambda c: sum(c.commands.values())),
    "child_processes": ("processes the tests started through `subprocess`", lambda c: c.children_started),
}


@dataclass(frozen=True)
class Verdict:
    key: str
    what: str
    now: int
    budget: int

    @property
    def over(self) -> bool:
        return self.now > self.budget


def read_budget(path: Path) -> dict[str, int]:
    """The `[counts]` table of a budget file, with every count this module keeps and nothing else; anything else in
    the file is an error, not ignored."""
    try:
        document = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path} is not TOML: {error}") from None
    if set(document) != {"counts"} or not isinstance(document["counts"], dict):
        has = ", ".join(document) or "nothing"
        raise ValueError(f"{path}: the file holds one table, [counts], and nothing else (it has: {has})")
    table = document["counts"]
    unknown, missing = sorted(set(table) - set(COUNTS)), [key for key in COUNTS if key not in table]
    if unknown or missing:
        raise ValueError(
            f"{path}: [counts] holds exactly {', '.join(COUNTS)}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
            + (f"; missing: {', '.join(missing)}" if missing else "")
        )
    bad = [key for key, value in table.items() if isinstance(value, bool) or not isinstance(value, int) or value < 0]
    if bad:
        raise ValueError(f"{path}: {', '.join(bad)} must be whole numbers, 0 or more")
    return table


def verdicts(costs: list[TestCost], budget: dict[str, int]) -> list[Verdict]:
    """Each count against its budget (`read_budget` holds every count)."""
    return [Verdict(key, what, sum(count(c) for c in costs), budget[key]) for key, (what, count) in COUNTS.items()]


def budget_table(found: list[Verdict], source: str) -> str:
    lines = [f"The suite's work against {source}:", "", "| count | now | budget | verdict |", "|---|---|---|---|"]
    for v in found:
        if v.over:
            verdict = "**over budget**"
        else:
            verdict = "met" if v.now == v.budget else f"met, {v.budget - v.now:,} under: lower the budget"
        lines.append(f"| {v.what} | {v.now:,} | {v.budget:,} | {verdict} |")
    return "\n".join(lines)


def brief(costs: list[TestCost], calibration_s: float | None = None) -> str:
    """The suite's CPU in three lines: the tests', the Dagster runs' among it, and (given one core's time for the
    calibration loop) the same in units of this machine's core."""
    cpu = sum(c.cpu for c in costs)
    runs_cpu = sum(c.runs_cpu for c in costs)
    lines = [
        f"{len(costs)} tests: {cpu:.1f} CPU-s, of which the Dagster runs {runs_cpu:.1f}, child processes "
        f"{sum(c.children for c in costs):.1f} (the workers' start and pytest's own work are not in it)"
    ]
    if calibration_s:
        lines.append(
            f"one core's time for the calibration loop here: {calibration_s:.2f} s, so the tests took "
            f"{cpu / calibration_s:.0f} of those loops (docs/development.md: the figures to compare it with)"
        )
    return "\n".join(lines)


def calibrate() -> float | None:
    """`bench.run.calibration`'s loop, once (that one takes the median of three). None when it cannot be run: the
    figure is information, never a reason to fail."""
    from bench.yardstick import loop_seconds

    try:
        return loop_seconds()
    except (OSError, subprocess.CalledProcessError, ValueError) as error:
        print(f"suite_costs: the calibration loop did not run ({error}); the CPU is printed alone", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.suite_costs", description=__doc__.split("\n\n")[0])
    parser.add_argument("times", type=Path, help="the file DUNNING_TEST_TIMES named")
    parser.add_argument("--top", type=int, default=15, help="files and tests listed (default 15)")
    parser.add_argument("--brief", action="store_true", help="the totals only, not the tables")
    parser.add_argument("--budget", type=Path, help="hold the counts to this file (bench/suite_budget.toml)")
    parser.add_argument("--calibrate", action="store_true", help="also time one pure-Python loop on this machine")
    args = parser.parse_args(argv)
    if not args.times.is_file():
        print(f"suite_costs: no file at {args.times}: `make test` writes .suite-times.tsv, and "
              f"`DUNNING_TEST_TIMES={args.times} make test` (or make test-fast, or pytest) writes this one",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        costs = read(args.times)
        budget = read_budget(args.budget) if args.budget is not None else None
    except (OSError, ValueError) as error:
        print(f"suite_costs: {error}", file=sys.stderr)
        return 2
    print(brief(costs, calibrate() if args.calibrate else None) if args.brief else summary(costs, args.top))
    if budget is None:
        return 0
    older = sum(1 for c in costs if c.columns < FORMS[-1])
    if older or not costs:
        print(f"suite_costs: {args.times} does not count what a budget holds ({older} of {len(costs)} lines "
              "in an older form, without every count): run the suite again", file=sys.stderr)  # fmt: skip
        return 2
    found = verdicts(costs, budget)
    print()
    print(budget_table(found, str(args.budget)))
    over = [v for v in found if v.over]
    if over:
        print(
            "\nsuite_costs: over budget: "
            + "; ".join(f"{v.what}: {v.now:,} against {v.budget:,}" for v in over)
            + f'. Make the new tests cheaper (docs/development.md, "The suite\'s budget"), or raise the count in '
            f"{args.budget} in the same change, saying why. `python -m bench.suite_costs {args.times}` lists what "
            "each test does.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The fixed cost of one small cycle, in one process: what most tests of the suite pay, and every hourly run on top
of its data.

`python -m bench.small_cycle [--invoices 5] [--cycles 10] [--repeat 3]` runs, in this one process (imports paid
once, before timing), on homes under a temporary directory (/dev/shm when there is one):

- `warm`: `--cycles` live `dunning run`s through `pipelines.cli.main`, a day apart, on one home that has run once;
- `fresh`: one live `dunning run` on each of `--cycles` new homes (the instance and the ledger created, every table
  published once);
- `no_dagster`: the same cycles composed from `dunning.run.steps` without Dagster, on a home of their own (what
  the tests' `tests/in_process.py` does).

and prints CPU-seconds per cycle (user + system of this process), the median of `--repeat` rounds. CPU, not wall
time, is the figure on a shared machine. Each cycle's snapshot has `--invoices` overdue invoices, one customer
each: the size of a test's data, where the fixed cost is all there is.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import os
import resource
import shutil
import statistics
import tempfile
from pathlib import Path

ROW = {
    "customer_email": "ada@example.com",
    "currency": "USD",
    "amount_due": 10000,
    "amount_paid": 0,
    "due_date": "2026-11-01",
    "status": "open",
    "customer_name": "Ada",
}
FIRST_DAY = 5  # November 2026: the first cycle's day; the next ones follow a day apart


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _snapshot(directory: Path, invoices: int) -> Path:
    path = directory / "snapshot.csv"
    rows = [{"invoice_id": f"in_{i}", "customer_id": f"c{i}", **ROW} for i in range(invoices)]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _as_of(day: int) -> str:
    return f"2026-11-{FIRST_DAY + day:02d}T09:00:00Z"


def _cli_run(home: Path, snapshot: Path, day: int) -> None:
    from pipelines import cli

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        code = cli.main(["--home", str(home), "run", "--snapshot", str(snapshot), "--as-of", _as_of(day)])
    if code != 0:
        raise SystemExit(f"dunning run exited {code}: {err.getvalue()[-2000:]}")


def _no_dagster_run(home: Path, snapshot: Path, day: int) -> None:
    """The live cycle's steps in the assets' order, without Dagster (as `tests/in_process.py` composes them): load,
    plan, breaker, send, audit."""
    import datetime as dt

    from dunning.ledger.backends.duckdb_ledger import open_ledger
    from dunning.plan.clock import cycle_clock, parse_as_of
    from dunning.run import cycle, steps
    from dunning.run.settings import load_settings
    from dunning.send.providers.factory import build_provider

    config = load_settings(None)
    as_of = parse_as_of(_as_of(day))
    clock = cycle_clock(as_of, None, config.zone, dry_run=False, as_of_given=True)
    run_id = f"small-cycle-{day}"
    with open_ledger(home / "dunning.duckdb") as ledger:
        applied = steps.apply_snapshot(
            ledger, str(snapshot), config, clock, run_id=run_id, allow_stale=False, wall=as_of
        )
        plan = steps.plan_step(ledger, applied.cycled, None, config, clock, run_id=run_id)
        if not cycle.check_breaker(ledger, plan, clock.as_of, config).passed:
            raise SystemExit("the breaker tripped on the bench's own snapshot")
        result = steps.send_step(
            ledger, lambda: build_provider(config.provider, home), plan, config, clock,
            run_id=run_id, dead_runs=lambda owners: (), now=lambda: dt.datetime.now(dt.UTC),
        )  # fmt: skip
        cycle.audit_cycle(
            ledger, applied.cycled, plan, result.outcomes, run_id=run_id, as_of=clock.as_of, dry_run=False,
            snapshot_path=str(snapshot), config=config,
        )  # fmt: skip


def _per_cycle(run, cycles: int) -> float:
    started = _cpu()
    for day in range(cycles):
        run(day)
    return (_cpu() - started) / cycles


def measure(invoices: int, cycles: int, repeat: int) -> dict[str, float]:
    base = Path(tempfile.mkdtemp(prefix="small-cycle-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None))
    os.environ.setdefault("DUNNING_MESSAGE_SECRET", "the bench's Message-ID secret, 32 bytes or more")
    try:
        snapshot = _snapshot(base, invoices)
        _cli_run(base / "imports", snapshot, 0)  # every import of a run paid once, before any timing
        rounds: dict[str, list[float]] = {"warm": [], "fresh": [], "no_dagster": []}
        for round_ in range(repeat):
            warm = base / f"warm-{round_}"
            _cli_run(warm, snapshot, 0)
            rounds["warm"].append(_per_cycle(lambda day, home=warm: _cli_run(home, snapshot, day + 1), cycles))
            rounds["fresh"].append(
                _per_cycle(lambda day, r=round_: _cli_run(base / f"fresh-{r}-{day}", snapshot, 0), cycles)
            )
            plain = base / f"plain-{round_}"
            _no_dagster_run(plain, snapshot, 0)
            rounds["no_dagster"].append(
                _per_cycle(lambda day, home=plain: _no_dagster_run(home, snapshot, day + 1), cycles)
            )
        return {name: statistics.median(values) for name, values in rounds.items()}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--invoices", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    result = measure(args.invoices, args.cycles, args.repeat)
    print(f"small cycle ({args.invoices} invoices), CPU-s per cycle, median of {args.repeat} rounds of {args.cycles}:")
    for name, value in result.items():
        print(f"  {name:<11} {value:.3f}")


if __name__ == "__main__":
    main()

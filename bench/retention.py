"""A home's growth over hourly runs, before and after retention (`retention:`, `dunning prune`).

A month of hourly runs is 720 `dunning run`s; through Dagster each costs a few seconds, so the bench runs fewer
(`--hours`, default 48: two days, the snapshot changing once a day and every other hour a no-op, as in a
deployment) through the real command in this process, measures what each part of the home gains per run, and
extrapolates to a month and a year, saying so. Then it moves the prune's wall clock so the older half of the runs
is past `runs_days`, prunes, and measures what was freed; runs again (`--after`, default half as many), to see
whether the instance's SQLite files grow again or reuse the pages the deleted rows left; and times a VACUUM of them
on a copy, which is what shrinking the files would cost.

    python -m bench.retention [--hours 48] [--after 24]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import shutil
import sqlite3
import sys
import time
from pathlib import Path

import dagster as dg

from bench.run import ROOT, finish, machine
from bench.trash import discard, empty
from dunning.plan import clock
from dunning.run.retention import file_size, human_bytes
from pipelines import cli

DATA = ROOT / "bench" / "data" / "retention"
START = dt.datetime(2026, 12, 1, 0, tzinfo=dt.UTC)
PARTS = {
    "Dagster run shards (history/runs/*.db)": lambda h: [p for p in (h / "dagster/history/runs").glob("*-*-*-*-*.db*")],
    "Dagster index (history/runs/index.db)": lambda h: list((h / "dagster/history/runs").glob("index.db*")),
    "Dagster runs table (history/runs.db)": lambda h: list((h / "dagster/history").glob("runs.db*")),
    "Dagster compute logs (storage/)": lambda h: [h / "dagster/storage"],
    "ledger (dunning.duckdb)": lambda h: list(h.glob("dunning.duckdb*")),
    "analysts' copy (analytics*)": lambda h: list(h.glob("analytics*")),
}


KEPT = {"ledger (dunning.duckdb)", "analysts' copy (analytics*)", "whole home"}  # never pruned, or not only pruned


def sizes(home: Path) -> dict[str, int]:
    found = {part: sum(file_size(p) for p in paths(home)) for part, paths in PARTS.items()}
    found["whole home"] = file_size(home)
    return found


def snapshot(day: int) -> Path:
    """The example invoices with one payment more each day: a snapshot that changes once a day."""
    text = (ROOT / "examples" / "invoices.csv").read_text().splitlines()
    header, rows = text[0], text[1:]
    columns = header.split(",")
    paid = columns.index("amount_paid")
    if day:
        cells = rows[day % len(rows)].split(",")
        cells[paid] = str(int(cells[paid]) + 100)
        rows[day % len(rows)] = ",".join(cells)
    path = DATA / f"snapshot-day{day}.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def dunning(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(list(args))
    return code, out.getvalue()


def hourly_runs(home: Path, first: int, count: int) -> float:
    """`count` hourly live runs from hour `first`; their mean wall seconds."""
    started = time.perf_counter()
    for hour in range(first, first + count):
        as_of = START + dt.timedelta(hours=hour)
        code, _ = dunning(
            "--home", str(home), "run", "--snapshot", str(snapshot(hour // 24)), "--as-of", as_of.isoformat()
        )
        if code != 0:
            raise RuntimeError(f"run at {as_of} exited {code}")
    return (time.perf_counter() - started) / count


def prune_older_half(home: Path) -> tuple[str, float]:
    """`dunning prune` with its wall clock `runs_days` (30) after the middle run ended: the older half goes."""
    instance = dg.DagsterInstance.from_config(str(home / "dagster"))
    records = instance.get_run_records(ascending=True, order_by="update_timestamp")
    middle = records[len(records) // 2].update_timestamp.astimezone(dt.UTC)
    real = clock.utc_now  # the CLI's commands ask for the clock when they run
    clock.utc_now = lambda: middle + dt.timedelta(days=30)
    try:
        started = time.perf_counter()
        _, out = dunning("--home", str(home), "prune")
        return out, time.perf_counter() - started
    finally:
        clock.utc_now = real


def vacuum_copy(home: Path) -> dict:
    """What a VACUUM of the instance's SQLite tables would free and cost, on a copy."""
    copy = home.with_name(home.name + "-vacuum")
    discard(copy)
    shutil.copytree(home / "dagster", copy)
    found = {}
    for name in ("history/runs.db", "history/runs/index.db"):
        path = copy / name
        before = path.stat().st_size
        con = sqlite3.connect(path)
        free = con.execute("PRAGMA freelist_count").fetchone()[0] * con.execute("PRAGMA page_size").fetchone()[0]
        started = time.perf_counter()
        con.execute("VACUUM")
        con.close()
        found[name] = {"bytes": before, "free_pages_bytes": free, "after_vacuum": path.stat().st_size,
                       "vacuum_s": round(time.perf_counter() - started, 3)}  # fmt: skip
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=int, default=48, help="hourly runs before the prune (default 48)")
    parser.add_argument("--after", type=int, default=24, help="hourly runs after it (default 24)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    DATA.mkdir(parents=True, exist_ok=True)
    home = DATA / "home"
    discard(home)
    report: dict = {"when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "machine": machine(),
                    "command": "python -m bench.retention " + " ".join(argv or sys.argv[1:])}  # fmt: skip
    try:
        hourly_runs(home, 0, 1)
        one = sizes(home)
        report["run_s"] = round(hourly_runs(home, 1, args.hours - 1), 2)
        grown = sizes(home)
        report["per_run"] = {k: (grown[k] - one[k]) / (args.hours - 1) for k in grown}
        report["before_prune"] = grown
        report["prune_out"], report["prune_s"] = prune_older_half(home)
        report["after_prune"] = sizes(home)
        hourly_runs(home, args.hours, args.after)
        report["after_more_runs"] = sizes(home)
        report["vacuum"] = vacuum_copy(home)
    finally:
        discard(home)
        discard(home.with_name(home.name + "-vacuum"))
        empty(DATA)
    report["args"] = vars(args)
    finish(report, started, markdown, args.out)
    return 0


def markdown(r: dict) -> str:
    hours, after = r["args"]["hours"], r["args"]["after"]
    per = r["per_run"]
    lines = [
        f"\n## {r['when']} — a home's growth over hourly runs, before and after retention\n",
        f"Machine: {r['machine']}.",
        f"Command: `{r['command']}` (total {r['total_s']:.0f} s): {hours} hourly live runs of the example invoices "
        f"(the snapshot changing once a day, {r['run_s']} s a run in-process), then `dunning prune` with its wall "
        f"clock 30 days after the middle run, then {after} runs more. A month (720 runs) and a year (8,760) are "
        "extrapolated from the growth per run, not run.\n",
        f"| part | per run | {hours} runs | after the prune | {after} runs later | a year without retention | "
        "with retention (30 days) |",
        "|---|---|---|---|---|---|---|",
    ]
    year = {part: int(r["before_prune"][part] + per[part] * (8760 - hours)) for part in per}
    kept = {part: int(r["before_prune"][part] + per[part] * (720 - hours)) for part in per if part not in KEPT}
    kept["whole home"] = sum(kept.values()) + sum(year[p] for p in KEPT - {"whole home"})
    for part in per:
        with_retention = human_bytes(kept[part]) if part in kept else f"{human_bytes(year[part])} (never pruned)"
        lines.append(
            f"| {part} | {human_bytes(int(per[part]))} | {human_bytes(r['before_prune'][part])} | "
            f"{human_bytes(r['after_prune'][part])} | {human_bytes(r['after_more_runs'][part])} | "
            f"{human_bytes(year[part])} | {with_retention} |"
        )
    lines.append(f"\n`dunning prune` took {r['prune_s']:.2f} s and printed:\n")
    lines += [f"    {line}" for line in r["prune_out"].splitlines()]
    lines.append("\nVACUUM of the instance's SQLite tables, on a copy after the later runs:\n")
    for name, v in r["vacuum"].items():
        free = human_bytes(v["free_pages_bytes"])
        lines.append(f"- `{name}`: {human_bytes(v['bytes'])}, of which free pages {free}; "
                     f"after VACUUM {human_bytes(v['after_vacuum'])} in {v['vacuum_s']} s")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

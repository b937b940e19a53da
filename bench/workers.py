"""Several workers on one PostgreSQL ledger, next to the DuckDB single worker: `python -m bench.workers`.

Per tier, the data of `bench.run` (a demo snapshot plus 30 earlier daily
cycles, `bench.history`) is loaded once into a PostgreSQL template database on
a throwaway local cluster (Debian's binaries, as in the tests); every
measurement starts from a clone of it (`CREATE DATABASE ... TEMPLATE`), so each
run sees the same ledger. Measured, `repeat` times each, median kept:

- the full `dunning run` with the file outbox: the DuckDB single worker, and 1,
  2 and 4 PostgreSQL workers (`--shard K/N`, processes started together, one
  home and one outbox each, the home holding a created Dagster instance as a
  deployment's worker home does after its first run; wall time until the last
  one ends), and the CPU the whole machine used meanwhile (workers, render
  processes and the PostgreSQL server: divided by the cores, the least wall
  time the work could take here). Every configuration's outbox is in memory (`/dev/shm`, see
  OUTBOX_ROOT), so the workers do not compete for the one disk they share
  here;
- claims per second per worker: the claim step alone (`Ledger.claim` in chunks
  of `claim_chunk_size`), one process per shard at the same time;
- duplicates, checked, not assumed: every sent key once in the ledger and once
  across all the workers' outboxes;
- on the 10m tier, `--dry-run` only (DuckDB and one PostgreSQL worker).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from email.parser import BytesHeaderParser
from pathlib import Path

import duckdb
import polars as pl
import psycopg

from bench.run import AS_OF, DATA, DUNNING, ROOT, TIERS, machine, template_for, warm_instance
from bench.trash import discard, empty
from dunning.config import DunningConfig
from dunning.ledger.backends.duckdb_ledger import open_ledger
from dunning.ledger.backends.pg_ledger import open_postgres_ledger
from dunning.plan.clock import CycleClock, RunMode
from dunning.run import cycle, steps
from dunning.sharding import Shard
from tests.postgres_server import PostgresCluster, start_cluster

# issue 13's targets are for one render process per worker: N workers on these 2 cores are N processes, as on N
# machines of one core each; a worker's own pool (`render_processes: auto`) would count only its own home's runs
ONE_RENDERER = "render_processes: 1\n"
COPIED_TABLES = ("reminder_ledger", "invoice_cycles")
ENV = "DUNNING_POSTGRES_DSN"
# Every configuration writes its outboxes to memory when the machine has /dev/shm: here all the "machines" share
# one disk, whose file creation rate (about 1,000 to 2,500 files/s on this VM, with fsyncs) would otherwise be
# what four workers compete for; a real worker has its own disk or speaks SMTP/HTTP.
OUTBOX_ROOT = Path("/dev/shm/dunning-bench-outboxes") if Path("/dev/shm").is_dir() else DATA / "outboxes"
INSTANCE = DATA / "worker-instance"  # a home holding only a created Dagster instance, copied into each worker's


def outbox_setting(name: str) -> str:
    directory = OUTBOX_ROOT / name
    discard(directory)
    return f"provider: {{kind: file, outbox_dir: {directory}}}\n"


def load_template(cluster: PostgresCluster, template: Path, name: str) -> str:
    """A PostgreSQL database holding the DuckDB template's ledger rows; returns its name."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    source = duckdb.connect(str(template / "dunning.duckdb"), read_only=True)
    try:
        with open_postgres_ledger(cluster.dsn(name), "bench") as ledger:
            for table in COPIED_TABLES:
                frame = source.sql(f"SELECT * FROM {table}").pl()
                with ledger.transaction(), ledger.registered("copied", frame):
                    ledger.insert_by_name(table, "copied")
            ledger.con.execute("ANALYZE")
    finally:
        source.close()
    return name


def clone(cluster: PostgresCluster, template_db: str) -> str:
    name = f"run_{os.getpid()}_{time.monotonic_ns()}"
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    return name


def drop(cluster: PostgresCluster, name: str) -> None:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def machine_cpu_seconds() -> float | None:
    """CPU seconds every process of this machine has used so far (user, nice, system, interrupts; not idle or
    I/O wait), from /proc/stat: the workers, their render processes and the PostgreSQL server alike. None where
    there is no /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _used_since(cpu_before: float | None) -> float | None:
    after = machine_cpu_seconds()
    return None if cpu_before is None or after is None else round(after - cpu_before, 1)


def outbox_duplicates(outboxes: list[Path]) -> tuple[int, int]:
    """(emails, keys sent more than once) across the workers' outboxes, from each file's X-Dunning-Keys."""
    parser, keys, emails = BytesHeaderParser(), Counter(), 0
    for outbox in outboxes:
        for path in outbox.glob("*.eml") if outbox.exists() else []:
            with open(path, "rb") as f:
                header = parser.parse(f)["X-Dunning-Keys"] or ""
            keys.update(header.split(","))
            emails += 1
    return emails, sum(1 for n in keys.values() if n > 1)


def ledger_duplicates(dsn: str) -> tuple[int, int]:
    with psycopg.connect(dsn) as con:
        [(sent, distinct)] = con.execute(
            "SELECT count(*), count(DISTINCT idempotency_key) FROM reminder_ledger WHERE status = 'sent'"
        ).fetchall()
    return sent, sent - distinct


def workers_run(cluster: PostgresCluster, template_db: str, snapshot: Path, workers: int, dry_run: bool) -> dict:
    """`workers` shard processes on a fresh clone of the template: wall time until the last ends, duplicates."""
    database = clone(cluster, template_db)
    scratch = DATA / f"workers-{workers}"
    discard(scratch)
    homes = [scratch / f"w{k}" for k in range(workers)]
    configs, outboxes = [scratch / f"w{k}.yaml" for k in range(workers)], []
    scratch.mkdir(parents=True)
    for home in homes:  # each worker's home as its earlier runs left it: its Dagster instance exists
        shutil.copytree(INSTANCE / "dagster", home / "dagster")
    for k, config in enumerate(configs):  # one outbox per worker, like one machine each
        config.write_text(
            f"ledger: {{kind: postgres}}\nshards: {workers}\n{ONE_RENDERER}" + outbox_setting(f"pg{workers}-w{k}")
        )
        outboxes.append(OUTBOX_ROOT / f"pg{workers}-w{k}")
    env = {**os.environ, ENV: cluster.dsn(database)}
    cpu_before, started = machine_cpu_seconds(), time.perf_counter()
    processes = []
    for k, home in enumerate(homes):
        args = [str(DUNNING), "--home", str(home), "run", "--snapshot", str(snapshot), "--as-of", AS_OF.isoformat(),
                "--config", str(configs[k]), *(["--shard", f"{k}/{workers}"] if workers > 1 else []),
                *(["--dry-run"] if dry_run else [])]  # fmt: skip
        processes.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    errors = [p.communicate()[1] for p in processes]
    wall, cpu = time.perf_counter() - started, _used_since(cpu_before)
    if any(p.returncode != 0 for p in processes):
        raise RuntimeError(f"a worker failed: {[e[-1500:] for e in errors if e]}")
    sent, ledger_dupes = ledger_duplicates(cluster.dsn(database))
    emails, outbox_dupes = outbox_duplicates(outboxes)
    drop(cluster, database)
    discard(scratch)
    for outbox in outboxes:
        discard(outbox)
    return {"wall_s": round(wall, 2), "machine_cpu_s": cpu, "sent_keys": sent, "emails": emails,
            "duplicates": ledger_dupes + outbox_dupes}  # fmt: skip


def duckdb_run(template: Path, dry_run: bool) -> dict:
    home = DATA / "workers-duckdb"
    discard(home)
    shutil.copytree(template, home, symlinks=True)  # the analysts' file's WAL guard is a dangling link
    (home / "config.yaml").write_text(ONE_RENDERER + outbox_setting("duckdb"))
    args = [str(DUNNING), "--home", str(home), "run", "--snapshot", str(home / "bench-snapshot.parquet"),
            "--as-of", AS_OF.isoformat(), *(["--dry-run"] if dry_run else [])]  # fmt: skip
    cpu_before, started = machine_cpu_seconds(), time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - started, _used_since(cpu_before)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    con = duckdb.connect(str(home / "dunning.duckdb"), read_only=True)
    try:
        [(sent, distinct)] = con.execute(
            "SELECT count(*), count(DISTINCT idempotency_key) FROM reminder_ledger WHERE status = 'sent'"
        ).fetchall()
    finally:
        con.close()
    emails, outbox_dupes = outbox_duplicates([OUTBOX_ROOT / "duckdb"])
    discard(home)
    discard(OUTBOX_ROOT / "duckdb")
    return {"wall_s": round(wall, 2), "machine_cpu_s": cpu, "sent_keys": sent, "emails": emails,
            "duplicates": sent - distinct + outbox_dupes}  # fmt: skip


def due_keys(template: Path) -> pl.DataFrame:
    """The sendable due rows of the benchmark day, planned on the template's ledger (inside a rolled-back
    transaction, so the template is unchanged)."""
    config = DunningConfig()
    clock = CycleClock(AS_OF, RunMode.LIVE, AS_OF.astimezone(config.zone).date())
    loaded = cycle.load_snapshot(template / "bench-snapshot.parquet", config)
    with open_ledger(template / "dunning.duckdb") as ledger, ledger.simulation():
        cycled = cycle.cycle_snapshot(ledger, loaded.valid, config, AS_OF)
        plan = steps.plan_step(ledger, cycled, None, config, clock)
    return cycle.sendable_due(plan)


def _claim_worker(args: tuple[str, str, int, int, str]) -> dict:
    """One process: claim this shard's due keys in chunks, as the send step does, and time it."""
    kind, target, index, count, due_path = args
    config = DunningConfig()
    due = Shard(index, count).keep(pl.read_parquet(due_path))
    chunk, cap = config.claim_chunk(), cycle.claim_cap(AS_OF, config)
    opened = open_ledger(target) if kind == "duckdb" else open_postgres_ledger(target, "bench")
    won = 0
    with opened as ledger:
        started = time.perf_counter()
        for start in range(0, due.height, chunk):
            won += len(ledger.claim(due.slice(start, chunk), due.head(0), f"bench-{index}", AS_OF, cap).won)
        seconds = time.perf_counter() - started
    return {"keys": due.height, "won": won, "s": round(seconds, 2), "claims_per_s": round(won / max(seconds, 1e-9))}


def claim_rates(cluster: PostgresCluster, template_db: str, template: Path, due_path: Path) -> dict:
    home = DATA / "claims-duckdb"
    discard(home)
    shutil.copytree(template, home, symlinks=True)  # the analysts' file's WAL guard is a dangling link
    rates = {"duckdb_1": [_claim_worker(("duckdb", str(home / "dunning.duckdb"), 0, 1, str(due_path)))]}
    discard(home)
    for workers in (1, 2, 4):
        database = clone(cluster, template_db)
        jobs = [("postgres", cluster.dsn(database), k, workers, str(due_path)) for k in range(workers)]
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            rates[f"postgres_{workers}"] = pool.map(_claim_worker, jobs)
        drop(cluster, database)
    return rates


def bench_tier(cluster: PostgresCluster, name: str, repeat: int) -> dict:
    template, sizes = template_for(name, TIERS[name], 1)
    template_db = load_template(cluster, template, f"template_{name}")
    snapshot = template / "bench-snapshot.parquet"
    result: dict = {"tier": name, **sizes}
    dry_run = TIERS[name] > 1_000_000
    runs: dict[str, list[dict]] = {"duckdb_1": []}
    counts = (1,) if dry_run else (1, 2, 4)
    for n in counts:
        runs[f"postgres_{n}"] = []
    for _ in range(repeat):  # interleaved, so a slow spell of the machine hits every configuration alike
        runs["duckdb_1"].append(duckdb_run(template, dry_run))
        for n in counts:
            runs[f"postgres_{n}"].append(workers_run(cluster, template_db, snapshot, n, dry_run))
    result["dry_run" if dry_run else "full_cycle"] = {
        key: {"median_s": statistics.median(r["wall_s"] for r in values), "runs": values}
        for key, values in runs.items()
    }
    if not dry_run:
        due_path = DATA / f"due-{name}.parquet"
        due_keys(template).write_parquet(due_path)
        result["claims"] = claim_rates(cluster, template_db, template, due_path)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tiers", default="1m", help="comma-separated: 100k, 1m, 10m (10m: dry runs only)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args(argv)
    DATA.mkdir(parents=True, exist_ok=True)
    warm_instance(INSTANCE)
    cluster = start_cluster()
    if cluster is None:
        print("no PostgreSQL server binaries (initdb, pg_ctl): apt-get install postgresql", file=sys.stderr)
        return 2
    started = time.time()
    report = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "command": "python -m bench.workers " + " ".join(argv or sys.argv[1:]),
        "tiers": [],
    }
    try:
        for tier in args.tiers.split(","):
            report["tiers"].append(bench_tier(cluster, tier.strip(), args.repeat))
            print(json.dumps(report["tiers"][-1], default=str)[:3000], flush=True)
    finally:
        cluster.stop()
        empty(DATA, OUTBOX_ROOT)
    from bench.report import save
    from bench.workers_report import append_markdown

    save(report, Path(args.out), started, DATA / "workers-last.json", append_markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The `kind: sql` source's pull against the floor under it: `COPY (query) TO STDOUT` on the same server, same run.

`python -m bench.sql_source [--rows 1000000] [--repeat 3] [--dsn URL] [--out bench/RESULTS.md]`

On a throwaway PostgreSQL cluster (`tests/postgres_server.py`; or the database at `--dsn`), a table of `--rows`
invoices with an operator's own names and types (bigint ids, an enum status, char(3) currency, a date), filled by
`generate_series`. Then, interleaved (floor, pull, frame, floor, pull, frame, ...) so a slow spell of the shared
machine hits each alike, the median of `--repeat`:

- floor: the operator's query as `COPY (query) TO STDOUT` (text format), every chunk read by psycopg and dropped:
  what the server and the wire cost, with nothing done with the rows;
- pull: `billing_source.pull_invoices` (what `dunning run` does): describe, judge the columns, `COPY` of the
  snapshot columns as text in CSV into HOME/snapshots/<stamp>-sql.csv, renamed when complete;
- frame: `sources.sql.pull_frame` (the same pull into a polars frame of text columns, for a caller that keeps its
  own file);
- and, for scale, `cycle.load_snapshot` of the pulled file (read, normalize, validate: what the run does next, the
  same for a CSV given with `--snapshot`).

Also with the amounts in `numeric(14, 2)` major units (`total * 100`), which the pull turns into integers on the
server. Load average before and after, since the machine is shared.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from bench.run import ROOT, finish, machine

TABLE = """
DROP TABLE IF EXISTS ar_invoices; DROP TYPE IF EXISTS ar_state;
CREATE TYPE ar_state AS ENUM ('draft', 'open', 'paid', 'void');
CREATE TABLE ar_invoices (
    inv_no bigint PRIMARY KEY, account_no bigint, bill_to text, ccy char(3), total_cents bigint, settled_cents bigint,
    total numeric(14, 2), payable_by date, state ar_state, account_name text
);
INSERT INTO ar_invoices
SELECT n, n / 2, 'customer' || (n / 2) || '@example.com', (ARRAY['USD', 'EUR', 'GBP'])[1 + n % 3],
       10000 + n % 5000, CASE WHEN n % 10 = 0 THEN 10000 + n % 5000 ELSE n % 100 END, (10000 + n % 5000) / 100.0,
       DATE '2026-10-01' + (n % 60), (CASE WHEN n % 10 = 0 THEN 'paid' ELSE 'open' END)::ar_state,
       'Customer ' || (n / 2)
FROM generate_series(1, %s) AS n;
ANALYZE ar_invoices;
"""
QUERY = """SELECT inv_no AS invoice_id, account_no AS customer_id, bill_to AS customer_email, ccy AS currency,
       {amount} AS amount_due, settled_cents AS amount_paid, payable_by AS due_date, state AS status,
       account_name AS customer_name
FROM ar_invoices"""
AMOUNTS = {"bigint": "total_cents", "numeric": "total * 100"}
AS_OF = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
ENV = "BENCH_BILLING_DATABASE_URL"


def floor(dsn: str, query: str) -> tuple[float, int]:
    """`COPY (query) TO STDOUT`, every chunk read and dropped: (seconds, bytes)."""
    started = time.perf_counter()
    size = 0
    with psycopg.connect(dsn) as con, con.cursor().copy(f"COPY ({query}) TO STDOUT") as copy:
        for chunk in copy:
            size += len(chunk)
    return time.perf_counter() - started, size


def pull(home: Path, query: str) -> tuple[float, Path]:
    from dunning.config import Source
    from dunning.ingest.sources import pulls as billing_source

    settings = Source(kind="sql", dsn_env=ENV, query=query, timeout_seconds=600)
    started = time.perf_counter()
    path = billing_source.pull_invoices(settings, home, dt.datetime.now(dt.UTC))
    return time.perf_counter() - started, path


def frame(scratch: Path, query: str) -> tuple[float, int]:
    from dunning.config import Source
    from dunning.ingest.sources import sql

    settings = Source(kind="sql", dsn_env=ENV, query=query, timeout_seconds=600)
    started = time.perf_counter()
    rows = sql.pull_frame(settings, scratch=scratch).height
    return time.perf_counter() - started, rows


def load_validate(path: Path) -> tuple[float, int, int]:
    from dunning.config import DunningConfig
    from dunning.run import cycle

    started = time.perf_counter()
    loaded = cycle.load_snapshot(path, DunningConfig())
    return time.perf_counter() - started, loaded.valid.height, loaded.rejected.height


def measure(dsn: str, rows: int, repeat: int) -> dict:
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as con:
        con.execute(TABLE.replace("%s", str(int(rows))))
    fill_s = time.perf_counter() - started
    os.environ[ENV] = dsn
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-sql-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as t:
        home = Path(t)
        for name, amount in AMOUNTS.items():
            query = QUERY.format(amount=amount)
            floor(dsn, query)  # warm: the table in shared buffers, and every module imported, for each alike
            pull(home, query)[1].unlink()
            frame(home, query)
            floors, pulls, frames, loads, size, rows_in_frame, file_size = [], [], [], [], 0, 0, 0
            validated = (0, 0)
            for _ in range(repeat):
                seconds, size = floor(dsn, query)
                floors.append(seconds)
                seconds, path = pull(home, query)
                pulls.append(seconds)
                file_size = path.stat().st_size
                seconds, rows_in_frame = frame(home, query)
                frames.append(seconds)
                seconds, *counts = load_validate(path)
                loads.append(seconds)
                validated = (counts[0], counts[1])
                path.unlink()
            f, p, fr = statistics.median(floors), statistics.median(pulls), statistics.median(frames)
            results[name] = {
                "floor_s": round(f, 3), "floor_mb": round(size / 2**20, 1), "pull_s": round(p, 3),
                "file_mb": round(file_size / 2**20, 1), "frame_s": round(fr, 3), "frame_rows": rows_in_frame,
                "pull_ratio": round(p / f, 2), "frame_ratio": round(fr / f, 2),
                "load_validate_s": round(statistics.median(loads), 3), "accepted": validated[0],
                "rejected": validated[1], "all": {"floor": floors, "pull": pulls, "frame": frames},
            }  # fmt: skip
    return {"rows": rows, "fill_s": round(fill_s, 1), "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dsn", help="a database to use (default: a throwaway cluster started for the bench)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    load_before = os.getloadavg()
    cluster = None
    dsn = args.dsn
    if dsn is None:
        from tests.postgres_server import start_cluster

        cluster = start_cluster()
        if cluster is None:
            print("no PostgreSQL server binaries (initdb, pg_ctl): pass --dsn", file=sys.stderr)
            return 2
        dsn = cluster.fresh_database("bench")
    try:
        report = measure(dsn, args.rows, args.repeat)
    finally:
        if cluster is not None:
            cluster.stop()
    report.update(
        at=dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(), machine=machine(), repeat=args.repeat,
        load_before=[round(x, 2) for x in load_before], load_after=[round(x, 2) for x in os.getloadavg()],
        psycopg=psycopg.__version__,
    )  # fmt: skip
    finish(report, started, markdown, args.out)
    return 0


def markdown(r: dict) -> str:
    lines = [
        "",
        f"## {r['at']} — the `kind: sql` source: a {r['rows']:,}-row pull against `COPY (query) TO STDOUT`",
        "",
        f"Machine: {r['machine']}; psycopg {r['psycopg']}; load average (1, 5, 15 min) {r['load_before']} before, "
        f"{r['load_after']} after (the machine is shared).",
        f"Command: `python -m bench.sql_source --rows {r['rows']} --repeat {r['repeat']}` (total {r['total_s']:.0f} s; "
        f"filling the table {r['fill_s']} s); a throwaway cluster on /dev/shm, the contenders interleaved, medians.",
        "",
        "| amounts | measurement | result | target |",
        "|---|---|---|---|",
    ]
    for name, m in r["results"].items():
        lines += [
            f"| {name} | floor: `COPY (query) TO STDOUT`, read and dropped | {m['floor_s']} s ({m['floor_mb']} MB) | |",
            f"| {name} | pull (`dunning run`'s): describe, judge, COPY as CSV into HOME/snapshots | {m['pull_s']} s "
            f"({m['file_mb']} MB file) | |",
            f"| {name} | pull / floor | {m['pull_ratio']}x | "
            + ("met" if m["pull_ratio"] <= 1.5 else "**missed**")
            + " (≤ 1.5x) |",
            f"| {name} | `pull_frame` (the same into a polars frame, {m['frame_rows']:,} rows) / floor | "
            f"{m['frame_s']} s = {m['frame_ratio']}x | "
            + ("met" if m["frame_ratio"] <= 1.5 else "**missed**")
            + " (≤ 1.5x) |",
            f"| {name} | then: read, normalize, validate the pulled file (`cycle.load_snapshot`) | "
            f"{m['load_validate_s']} s, {m['accepted']:,} accepted, {m['rejected']:,} rejected | |",
        ]
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

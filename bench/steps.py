"""Measurements inside one process: each cycle step, the anti-join floor, the naive poller, SMTP throughput.

`step_timings` runs in a child process (`python -m bench.steps TEMPLATE AS_OF OUTBOX_ROOT|- send|no-send`)
so its peak RSS belongs to that tier alone.
"""

from __future__ import annotations

import datetime as dt
import json
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import polars as pl

from bench.disk_probe import create_files
from bench.trash import discard

# the snapshot's owed invoices, the highest stage each has reached, less what the ledger holds at that stage or
# later: `newly_due` (one row per invoice, its stage's days), for the floor's count and the audit floor's join
NEWLY_DUE_SQL = """
WITH s AS (SELECT invoice_id, due_date, amount_due, amount_paid, status FROM read_parquet(?)),
     st AS (SELECT * FROM (VALUES ('day3', 3, 0.0), ('day7', 7, 0.0), ('day14', 14, 0.25)) t(stage, days, ratio)),
     target AS (
        SELECT s.invoice_id, max(st.days) AS days FROM s JOIN st
          ON date_diff('day', s.due_date, ?::DATE) >= st.days
         AND (s.amount_due - s.amount_paid) >= st.ratio * s.amount_due
        WHERE s.status = 'open' AND s.amount_due > s.amount_paid GROUP BY s.invoice_id),
     newly_due AS (
        SELECT * FROM target t
        WHERE NOT EXISTS (SELECT 1 FROM reminder_ledger l JOIN st ON st.stage = l.stage
                          WHERE l.invoice_id = t.invoice_id AND st.days >= t.days))
"""
FLOOR_SQL = NEWLY_DUE_SQL + "SELECT count(*) FROM newly_due"


def _peak_mb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _scratch(template: Path, name: str) -> Path:
    home = template.with_name(f"{template.name}-{name}")
    discard(home)
    shutil.copytree(template, home, symlinks=True)  # the analysts' file's WAL guard is a dangling link
    return home


def disk_floor(directory: Path, files: int, size: int) -> float:
    """Files per second a bare Python loop creates here (temporary name, then rename): what any file outbox waits on."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        return round(create_files(directory, files, b"x" * size, prefix="floor-"))
    finally:
        discard(directory)


def _steps(template: Path, as_of: dt.datetime, outbox_root: Path | None = None, send: bool = True) -> dict:
    from dunning.config import DunningConfig
    from dunning.ledger.backends.duckdb_ledger import open_ledger
    from dunning.ledger.backends.publication import publish
    from dunning.plan.clock import CycleClock, RunMode
    from dunning.run import cycle, steps
    from dunning.send.providers.file_outbox import FileOutbox
    from dunning.send.render_pool import available_cores, pool_size
    from dunning.send.sending import held_outcomes
    from dunning.vocabulary import SendStatus

    home = _scratch(template, "steps")
    config = DunningConfig()
    timings: dict[str, dict] = {}

    def step(name, fn, repeat: int = 1):
        """Time `fn`; a step without side effects is taken `repeat` times and its median kept, like the floor's."""
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            value = fn()
            times.append(time.perf_counter() - started)
        timings[name] = {"s": round(statistics.median(times), 3), "peak_rss_mb": _peak_mb()}
        if repeat > 1:
            timings[name]["runs_s"] = [round(t, 3) for t in times]
        return value

    loaded = step("load_validate", lambda: cycle.load_snapshot(home / "bench-snapshot.parquet", config))
    with open_ledger(home / "dunning.duckdb") as ledger:
        clock = CycleClock(as_of, RunMode.LIVE, as_of.astimezone(config.zone).date())

        def newly_due():  # the assets' own plan step (dunning.run.steps), on the cycled snapshot
            cycled = cycle.cycle_snapshot(ledger, loaded.valid, config, as_of)
            return cycled, steps.plan_step(ledger, cycled, None, config, clock)

        cycled, plan = step("newly_due", newly_due, repeat=5)
        due = cycle.sendable_due(plan)
        step("breaker", lambda: cycle.check_breaker(ledger, plan, as_of, config))

        def claim_only():
            with ledger.simulation():
                for start in range(0, due.height, 20_000):
                    ledger.claim(
                        due.slice(start, 20_000),
                        cycle.skipped_rows(plan).head(0),
                        "bench-claim",
                        as_of,
                        cycle.claim_cap(as_of, config),
                    )

        step("claim", claim_only)
        outbox = (outbox_root or home) / "outbox"
        if send:
            sent = step(
                "claim_render_send_record",
                lambda: steps.send_step(
                    ledger,
                    lambda: FileOutbox(outbox),
                    plan,
                    config,
                    clock,
                    run_id="bench",
                    dead_runs=lambda owners: (),
                    now=lambda: dt.datetime.now(dt.UTC),
                    render_processes=pool_size(config.render_processes),
                ),  # fmt: skip
            )
            report, outcomes = sent.report, sent.outcomes
            assert report is not None, "the bench home is not paused"
            timings["claim_render_send_record"]["emails"] = report.emails
            timings["claim_render_send_record"]["emails_per_s"] = round(
                report.emails / max(timings["claim_render_send_record"]["s"], 1e-9)
            )
        else:
            outcomes = held_outcomes(due, SendStatus.DRY_RUN)
        step(
            "audit",
            lambda: cycle.audit_cycle(
                ledger, cycled, plan, outcomes, run_id="bench", as_of=as_of, dry_run=not send, snapshot_path=None
            ),
        )
        step("publication", lambda: publish(ledger.con, home))
    result = {
        "due_keys": cycle.due_rows(plan).height,
        "sendable_keys": due.height,
        "steps": timings,
        "render_processes": pool_size(config.render_processes),
        "cores": available_cores(),
    }
    if send:
        email_bytes = sum(p.stat().st_size for p in outbox.iterdir()) // max(report.emails, 1)
        floor_rate = disk_floor(
            outbox.with_name("disk-floor"), report.emails, email_bytes
        )  # right after, on the same disk
        discard(outbox)
        result |= {"outbox": str(outbox), "disk_files_per_s": floor_rate, "email_bytes": email_bytes}
    discard(home)
    return result


def step_timings(template: Path, as_of: dt.datetime, outbox_root: Path | None = None, send: bool = True) -> dict:
    """Each step in a child process; `outbox_root` puts the outbox elsewhere (a tmpfs, to take the disk out);
    `send=False` skips the send step (the 10M tier, where the targets are about the decision, not the emails)."""
    extra = [str(outbox_root or "-"), "send" if send else "no-send"]
    result = subprocess.run(
        [sys.executable, "-m", "bench.steps", str(template), as_of.isoformat(), *extra],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def floor_query(template: Path, as_of: dt.datetime, repeat: int = 3, snapshot: Path | None = None) -> dict:
    """The bare DuckDB anti-join of snapshot (TEMPLATE/bench-snapshot.parquet unless given) against the ledger of
    TEMPLATE/dunning.duckdb: no validation, no cycles, no rendering."""
    snapshot = snapshot or template / "bench-snapshot.parquet"
    con = duckdb.connect(str(template / "dunning.duckdb"), read_only=True)
    try:
        times, count = [], 0
        for _ in range(repeat):
            started = time.perf_counter()
            count = con.execute(FLOOR_SQL, [str(snapshot), as_of.date()]).fetchone()[0]
            times.append(time.perf_counter() - started)
    finally:
        con.close()
    return {"median_s": round(sorted(times)[len(times) // 2], 3), "newly_due": count}


def naive_poller(template: Path, as_of: dt.datetime, cap_seconds: float) -> dict:
    """The cron poller users write: per overdue invoice one lookup query; per email one insert and commit.

    It renders the same reminder with our renderer and writes it to the same
    file outbox (one email per invoice), so the two do the same sending work;
    the time spent looking up and committing is reported apart.
    """
    from dunning.email.render import reminder_email
    from dunning.send.providers.file_outbox import FileOutbox

    home = _scratch(template, "naive")
    snapshot = pl.read_parquet(home / "bench-snapshot.parquet").filter(
        (pl.col("status") == "open") & (pl.col("amount_due") > pl.col("amount_paid"))
    )
    days = (pl.lit(as_of.date()) - pl.col("due_date")).dt.total_days()
    overdue = snapshot.with_columns(days.alias("days_overdue")).filter(pl.col("days_overdue") >= 3)
    outbox = FileOutbox(home / "naive-outbox")
    con = duckdb.connect(str(home / "dunning.duckdb"))
    started, processed, sent, ledger_s = time.perf_counter(), 0, 0, 0.0
    try:
        for row in overdue.iter_rows(named=True):
            remaining = row["amount_due"] - row["amount_paid"]
            days_overdue = row["days_overdue"]
            stage = (
                "day14"
                if days_overdue >= 14 and remaining >= 0.25 * row["amount_due"]
                else "day7"
                if days_overdue >= 7
                else "day3"
            )
            key = f"dunning:{row['invoice_id']}:1:{stage}"
            asked = time.perf_counter()
            new = con.execute("SELECT 1 FROM reminder_ledger WHERE idempotency_key = ?", [key]).fetchone() is None
            if new:
                con.execute(
                    "INSERT INTO reminder_ledger (idempotency_key, kind, invoice_id, customer_id, status, claimed_at) "
                    "VALUES (?, 'reminder', ?, ?, 'sent', ?)",
                    [key, row["invoice_id"], row["customer_id"], as_of],
                )
            ledger_s += time.perf_counter() - asked
            if new and row["customer_email"]:
                record = {**row, "amount_minor": remaining, "idempotency_key": key, "tone": "gentle"}
                outbox.send(
                    reminder_email(
                        [record], sender="billing@example.com", message_id=f"<{key}@example.com>", as_of=as_of
                    )
                )
                sent += 1
            processed += 1
            if time.perf_counter() - started > cap_seconds:
                break
    finally:
        con.close()
    elapsed = time.perf_counter() - started
    discard(home)
    rate = processed / elapsed
    return {
        "processed": processed,
        "of": overdue.height,
        "seconds": round(elapsed, 1),
        "capped": processed < overdue.height,
        "extrapolated_s": round(overdue.height / rate, 1),
        "sent_in_sample": sent,
        "ledger_share": round(ledger_s / elapsed, 2),
    }


def publication_with_daily_history(template: Path, as_of: dt.datetime, days: int = 30) -> dict:
    """Publication when `invoice_history_daily` holds `days` days of the snapshot: first, after one more day, and
    what copying that table whole (as every publication did before it went per day) costs."""
    from dunning.ledger.backends.duckdb_ledger import open_ledger
    from dunning.ledger.backends.publication import publish

    home = _scratch(template, "publication")
    snapshot = str(home / "bench-snapshot.parquet")
    history_columns = (
        "business_date, run_id, as_of, invoice_id, customer_id, customer_email, currency, amount_due, "
        "amount_paid, amount_due - amount_paid, due_date, status, 0, 1"
    )

    def add_day(ledger, day: dt.date) -> None:
        ledger.con.execute(
            f"INSERT INTO invoice_history_daily SELECT {history_columns} FROM "
            f"(SELECT ?::DATE AS business_date, 'run-' || ? AS run_id, ?::TIMESTAMPTZ AS as_of, * "
            f"FROM read_parquet(?))",
            [day, str(day), as_of, snapshot],
        )

    first_day = as_of.date() - dt.timedelta(days=days)
    with open_ledger(home / "dunning.duckdb") as ledger:
        for n in range(days):
            add_day(ledger, first_day + dt.timedelta(days=n))
        rows = ledger.con.execute("SELECT count(*) FROM invoice_history_daily").fetchone()[0]
        started = time.perf_counter()
        publish(ledger.con, home)
        first = time.perf_counter() - started
        add_day(ledger, as_of.date())
        started = time.perf_counter()
        publish(ledger.con, home)
        next_run = time.perf_counter() - started
        started = time.perf_counter()
        ledger.con.execute(f"COPY invoice_history_daily TO '{home / 'whole.parquet'}' (FORMAT parquet)")
        whole_table = time.perf_counter() - started
    discard(home)
    return {
        "days": days + 1,
        "history_rows": rows,
        "first_s": round(first, 2),
        "next_run_s": round(next_run, 2),
        "whole_table_copy_s": round(whole_table, 2),
    }


def smtp_rate(directory: Path, as_of: dt.datetime, emails: int) -> dict:
    """Emails per second to a local aiosmtpd server through the SMTP provider, ledger updates included."""
    from aiosmtpd.controller import Controller

    from dunning.config import DunningConfig, Provider
    from dunning.demo import generate_snapshot
    from dunning.ledger.backends.duckdb_ledger import open_ledger
    from dunning.plan.policy import STATE_SCHEMA, assign_cycles
    from dunning.run import cycle
    from dunning.send.providers.smtp import SmtpProvider
    from dunning.send.sending import send_due

    class Count:
        received = 0

        async def handle_DATA(self, server, session, envelope):
            Count.received += 1
            return "250 OK"

    discard(directory)
    directory.mkdir(parents=True)
    snapshot = generate_snapshot(emails * 4, as_of=as_of.date(), invoices_per_customer=1.0)
    config = DunningConfig(group_by="invoice", breaker={"max_emails": 10})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(Count(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        provider = SmtpProvider(Provider(kind="smtp", host="127.0.0.1", port=port, timeout_seconds=10))
        valid = snapshot.with_columns(pl.int_range(1, pl.len() + 1).alias("source_row"))
        plan = cycle.plan_cycle(assign_cycles(valid, pl.DataFrame(schema=STATE_SCHEMA), as_of, config), config)
        due = cycle.sendable_due(plan).head(emails)
        with open_ledger(directory / "dunning.duckdb") as ledger, provider:
            started = time.perf_counter()
            report, _ = send_due(
                ledger,
                provider,
                due,
                cycle.skipped_rows(plan),
                config=config,
                run_id="smtp",
                as_of=as_of,
                now=lambda: dt.datetime.now(dt.UTC),
            )
            elapsed = time.perf_counter() - started
    finally:
        controller.stop()
    return {
        "emails": report.emails,
        "received": Count.received,
        "seconds": round(elapsed, 2),
        "emails_per_s": round(report.emails / elapsed),
    }


if __name__ == "__main__":
    print(
        json.dumps(
            _steps(
                Path(sys.argv[1]),
                dt.datetime.fromisoformat(sys.argv[2]),
                None if sys.argv[3] == "-" else Path(sys.argv[3]),
                send=sys.argv[4] == "send",
            )
        )
    )

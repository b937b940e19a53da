"""Delivery feedback's two targets: importing a 100,000-message bounce mbox (≤ 60 s on 2 cores), and what the
suppression check adds to the newly-due step at 1M invoices (≤ 5%); and what one hostile message costs to read.

`python -m bench.feedback [--messages 100000] [--tier 1m] [--suppressed 10000] [--repeat 5] [--bare-parse]
[--out bench/RESULTS.md]`

The mbox: `--messages` RFC 3464 DSNs as Postfix writes them (a tenth soft bounces, a twentieth ARF complaints, a
fiftieth not reports), each about one email on record in a ledger of as many sent reminders, so every report is
matched by its signed Message-ID (verified) and recorded; the whole `dunning feedback --mbox` process is timed
(wall, CPU, peak RSS), then the same file again (everything already recorded). The check: the tier's home
(`bench.run.template_for`), the assets' plan step (`cycle.cycle_snapshot` then `steps.plan_step`) with no
suppression and with `--suppressed` addresses in force (half of them the snapshot's), alternated, medians kept; the
suppressions are removed after. The hostile messages: each read once by `read_message` (`--bare-parse`: the 350 KB
bomb given to the standard parser alone too, what importing it cost before the raw-bytes bounds).
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

import duckdb

from bench.run import AS_OF, DATA, ROOT, TIERS, finish, machine, template_for, timed_cli
from bench.trash import discard
from tests.delivery_messages import arf, dsn, plain_reply


def mbox_home(messages: int) -> tuple[Path, Path]:
    """A home whose ledger holds `messages` sent reminders (with signed Message-IDs, under the ledger's own secret),
    and an mbox with one report about each."""
    import polars as pl

    from dunning.keys import MessageIds
    from dunning.ledger.backends.duckdb_ledger import open_ledger

    home = DATA / f"feedback-signed-{messages}"
    box = home / "bounces.mbox"
    if box.exists():
        return home, box
    discard(home)
    home.mkdir(parents=True)
    with open_ledger(home / "dunning.duckdb") as ledger:
        secret = ledger.message_secret(create_at=AS_OF)
        assert secret is not None
        ids = MessageIds("bench.example", (bytes.fromhex(secret),))
        message_ids = [ids.message_id([f"dunning:in_{i}:1:day3"]) for i in range(messages)]
        with ledger.registered("bench_ids", pl.DataFrame({"i": range(messages), "message_id": message_ids})):
            ledger.con.execute(
                """
                INSERT INTO reminder_ledger (idempotency_key, kind, invoice_id, customer_id, customer_email, cycle,
                                             stage, status, amount_minor, currency, email_id, message_id, run_id,
                                             claimed_at, sent_at, attempts, policy)
                SELECT 'dunning:in_' || i || ':1:day3', 'reminder', 'in_' || i, 'cus_' || i, 'c' || i || '@example.com',
                       1, 'day3', 'sent', 10000, 'USD', 'e' || i, message_id, 'bench',
                       TIMESTAMPTZ '2026-11-04 09:00:00+00', TIMESTAMPTZ '2026-11-04 09:00:01+00', 1, 'default'
                FROM bench_ids
                """
            )
    with box.open("wb") as out:
        for i, message_id in enumerate(message_ids):
            address = f"c{i}@example.com"
            if i % 50 == 0:
                raw = plain_reply()
            elif i % 20 == 0:
                raw = arf(address, message_id)
            elif i % 10 == 0:
                raw = dsn(address, message_id, status="4.2.2", diagnostic="smtp; 452 4.2.2 mailbox full")
            else:
                raw = dsn(address, message_id)
            out.write(b"From MAILER-DAEMON Thu Nov  5 10:00:00 2026\n")
            out.write(raw.replace(b"\r\n", b"\n").replace(b"\nFrom ", b"\n>From "))
            out.write(b"\n")
    return home, box


def hostile_messages(bare_parse: bool) -> list[dict]:
    """How long one hostile message takes to read (`delivery_reports.read_message`), and, with `bare_parse`, what
    the standard parser alone took on the smallest (the cost this round removes: lines times depth)."""
    import email.parser
    import email.policy

    from dunning.ingest.delivery_reports import read_message
    from tests.delivery_messages import nested_raw

    def flat(depth: int, size: int, line: bytes) -> bytes:
        raw = nested_raw(depth)
        at = raw.rfind(b"\r\n\r\nx\r\n") + 4
        return raw[:at] + line * ((size - len(raw)) // len(line)) + raw[at:]

    cases = [
        ("900 nested levels, 350 KB", nested_raw(900, 350_000)),
        ("900 nested levels, 4 MB", nested_raw(900, 4_000_000)),
        ("7 levels, 5 MB of 3-byte lines (within the limits)", flat(7, 5_000_000, b"x\r\n")),
        ("2 levels, 5 MB of base64 lines (an attachment)", flat(2, 5_000_000, b"QUJD" * 19 + b"\r\n")),
    ]
    rows = []
    for label, raw in cases:
        started = time.perf_counter()
        reading = read_message(raw, "mbox")
        took = time.perf_counter() - started
        why = reading.unreadable[0].why if reading.unreadable else "read"
        row = {"message": label, "bytes": len(raw), "read_s": round(took, 3), "outcome": why}
        if bare_parse and label.startswith("900 nested levels, 350"):
            started = time.perf_counter()
            email.parser.BytesParser(policy=email.policy.compat32).parsebytes(raw)
            row["bare_parse_s"] = round(time.perf_counter() - started, 2)
        rows.append(row)
    return rows


def mbox_import(messages: int) -> dict:
    home, box = mbox_home(messages)
    work = DATA / f"feedback-{messages}-run"
    discard(work)
    work.mkdir(parents=True)
    (work / "dunning.duckdb").write_bytes((home / "dunning.duckdb").read_bytes())
    runs = []
    for label in ("first import", "same file again"):
        wall, peak, out, cpu = timed_cli(["--home", str(work), "feedback", "--mbox", str(box)])
        runs.append({"label": label, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "peak_rss_mb": peak // 1024,
                     "summary": out.strip().splitlines()[:3]})  # fmt: skip
    con = duckdb.connect(str(work / "dunning.duckdb"), read_only=True)
    try:
        events, suppressed = con.execute(
            "SELECT (SELECT count(*) FROM delivery_events), (SELECT count(*) FROM suppressions)"
        ).fetchone()
    finally:
        con.close()
    discard(work)
    return {"messages": messages, "mbox_mb": round(box.stat().st_size / 1e6, 1), "runs": runs,
            "delivery_events": events, "suppressions": suppressed}  # fmt: skip


def suppression_check(tier: str, suppressed: int, repeat: int) -> dict:
    import polars as pl

    from dunning.config import DunningConfig
    from dunning.ledger.backends.duckdb_ledger import open_ledger
    from dunning.plan.clock import CycleClock, RunMode
    from dunning.run import cycle, steps

    template, _ = template_for(tier, TIERS[tier], 1)
    config = DunningConfig()
    clock = CycleClock(AS_OF, RunMode.LIVE, AS_OF.astimezone(config.zone).date())
    valid = cycle.load_snapshot(template / "bench-snapshot.parquet", config).valid
    emails = valid.get_column("customer_email").drop_nulls().unique().sort().head(suppressed // 2).to_list()
    emails += [f"nobody{i}@elsewhere.example" for i in range(suppressed - len(emails))]
    times: dict[str, list[float]] = {"without": [], "with": []}
    held = {}
    with open_ledger(template / "dunning.duckdb") as ledger:
        ledger.con.execute("DELETE FROM suppressions WHERE source = 'bench'")
        try:
            for _ in range(repeat):
                for label in ("without", "with"):
                    if label == "with":
                        rows = pl.DataFrame({"email": [e.lower() for e in emails]})
                        with ledger.registered("bench_suppressed", rows):
                            ledger.con.execute(
                                "INSERT INTO suppressions (suppression_id, email, active_email, reason, source, "
                                "created_at) SELECT 'b' || row_number() OVER (), email, email, 'hard_bounce', 'bench', "
                                "now() FROM bench_suppressed"
                            )
                    started = time.perf_counter()
                    cycled = cycle.cycle_snapshot(ledger, valid, config, AS_OF)
                    plan = steps.plan_step(ledger, cycled, None, config, clock)
                    times[label].append(time.perf_counter() - started)
                    held[label] = int(cycle.due_rows(plan).get_column("hold").eq("suppressed").sum())
                    ledger.con.execute("DELETE FROM suppressions WHERE source = 'bench'")
        finally:
            ledger.con.execute("DELETE FROM suppressions WHERE source = 'bench'")
    medians = {k: round(statistics.median(v), 3) for k, v in times.items()}
    return {"tier": tier, "suppressed": suppressed, "medians_s": medians, "runs_s": times, "held": held,
            "overhead": round(medians["with"] / medians["without"] - 1, 4)}  # fmt: skip


def markdown(report: dict) -> str:
    m, s, hostile = report["mbox"], report["check"], report["hostile"]
    first, again = m["runs"]
    ok = "met" if first["wall_s"] <= 60 else "**missed**"
    overhead_ok = "met" if s["overhead"] <= 0.05 else "**missed**"
    return "\n".join([
        "", f"## {report['at']} — delivery feedback", "", f"Machine: {report['machine']}.",
        f"Command: `python -m bench.feedback --messages {m['messages']} --tier {s['tier']} --suppressed "
        f"{s['suppressed']} --repeat {report['repeat']}` (total {report['total_s']:.0f} s).", "",
        "| tier | measurement | result | target |", "|---|---|---|---|",
        f"| {m['messages']:,} messages ({m['mbox_mb']} MB mbox) | `dunning feedback --mbox`, whole process | "
        f"{first['wall_s']} s, CPU {first['cpu_s']} s, peak RSS {first['peak_rss_mb']} MB | {ok} (≤ 60 s) |",
        f"| {m['messages']:,} messages | the same file again (all recorded before) | {again['wall_s']} s | |",
        f"| {m['messages']:,} messages | delivery_events / suppressions after | {m['delivery_events']:,} / "
        f"{m['suppressions']:,} | |",
        f"| {s['tier']} | newly-due step without / with {s['suppressed']:,} suppressed addresses | "
        f"{s['medians_s']['without']:.3f} s / {s['medians_s']['with']:.3f} s ({s['held']['with']:,} keys held) | |",
        f"| {s['tier']} | the suppression check's cost | {s['overhead'] * 100:+.1f}% | {overhead_ok} (≤ 5%) |", "",
        "One hostile message, read (`read_message`: raw-bytes bounds, then the parser under its time budget):", "",
        "| message | read | outcome |", "|---|---|---|",
        *(f"| {h['message']} | {h['read_s']} s" + (f" (the parser alone: {h['bare_parse_s']} s)"
                                                   if "bare_parse_s" in h else "") + f" | {h['outcome']} |"
          for h in hostile), "",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--tier", default="1m", choices=sorted(TIERS))
    parser.add_argument("--suppressed", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    parser.add_argument("--bare-parse", action="store_true", help="also time the standard parser alone on the bomb")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    report = {"at": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(), "machine": machine(),
              "repeat": args.repeat, "hostile": hostile_messages(args.bare_parse), "mbox": mbox_import(args.messages),
              "check": suppression_check(args.tier, args.suppressed, args.repeat)}  # fmt: skip
    finish(report, started, markdown, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

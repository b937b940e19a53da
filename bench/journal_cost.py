"""What the hand-over journal costs: emails per second with and without it, file outbox and SMTP, interleaved.

`python -m bench.journal_cost [--emails N] [--repeat R] [--out bench/RESULTS.md]`

The same due batch is sent by `sending.send_due` into a fresh ledger each time, once with `journal_dir` (one
`write` of the Message-ID per email, before its hand-over: `dunning.send.handover`) and once without, taken in
turn (A, B, A, B, ...) so a slow spell of the machine hits both alike. The file outbox is measured on a tmpfs
(the code's rate, without the disk) and on the disk; SMTP against a local aiosmtpd server. The goal: at most 5%
fewer emails per second with the journal.
"""

from __future__ import annotations

import argparse
import datetime as dt
import socket
import statistics
import sys
import time
from pathlib import Path

import polars as pl

from bench.trash import discard

ROOT = Path(__file__).resolve().parents[1]
AS_OF = dt.datetime(2026, 11, 30, 9, tzinfo=dt.UTC)


def _due(emails: int):
    from dunning.config import DunningConfig
    from dunning.demo import generate_snapshot
    from dunning.plan.policy import STATE_SCHEMA, assign_cycles
    from dunning.run import cycle

    config = DunningConfig(group_by="invoice", breaker={"max_emails": 10})
    snapshot = generate_snapshot(emails * 4, as_of=AS_OF.date(), invoices_per_customer=1.0)
    valid = snapshot.with_columns(pl.int_range(1, pl.len() + 1).alias("source_row"))
    plan = cycle.plan_cycle(assign_cycles(valid, pl.DataFrame(schema=STATE_SCHEMA), AS_OF, config), config)
    return config, cycle.sendable_due(plan).head(emails), cycle.skipped_rows(plan)


def _send_once(root: Path, provider_factory, journal: bool, due, skipped, config) -> float:
    from dunning.ledger.backends.duckdb_ledger import open_ledger
    from dunning.send.sending import send_due

    discard(root)
    root.mkdir(parents=True)
    with open_ledger(root / "dunning.duckdb") as ledger, provider_factory(root) as provider:
        started = time.perf_counter()
        report, _ = send_due(
            ledger, provider, due, skipped, config=config, run_id="journal-bench", as_of=AS_OF,
            now=lambda: dt.datetime.now(dt.UTC), journal_dir=str(root / "journal") if journal else None,
        )  # fmt: skip
        elapsed = time.perf_counter() - started
    discard(root)
    return report.emails / elapsed


def _pair(name: str, root: Path, provider_factory, repeat: int, due, skipped, config) -> dict:
    rates: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeat):
        for journal in (False, True):
            rates[journal].append(_send_once(root / name, provider_factory, journal, due, skipped, config))
    without, with_journal = statistics.median(rates[False]), statistics.median(rates[True])
    return {
        "provider": name,
        "without_per_s": round(without),
        "with_per_s": round(with_journal),
        "change_pct": round(100 * (with_journal - without) / without, 1),
        "runs_without": [round(r) for r in rates[False]],
        "runs_with": [round(r) for r in rates[True]],
    }


def measure(emails: int, repeat: int, scratch: Path) -> list[dict]:
    from aiosmtpd.controller import Controller

    from dunning.config import Provider
    from dunning.send.providers.file_outbox import FileOutbox
    from dunning.send.providers.smtp import SmtpProvider

    config, due, skipped = _due(emails)
    results = []
    places = (("file outbox (tmpfs)", Path("/dev/shm/dunning-journal-bench")), ("file outbox (disk)", scratch))
    for label, base in places:
        if base.parent.is_dir():
            results.append(_pair(label, base, lambda root: FileOutbox(root / "outbox"), repeat, due, skipped, config))

    class Accept:
        async def handle_DATA(self, server, session, envelope):
            return "250 OK"

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(Accept(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        settings = Provider(kind="smtp", host="127.0.0.1", port=port, timeout_seconds=10)
        smtp_due = due.head(min(emails, 3000))
        results.append(
            _pair(
                "smtp (local aiosmtpd)", scratch, lambda root: SmtpProvider(settings), repeat, smtp_due, skipped, config
            )  # fmt: skip
        )
    finally:
        controller.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--emails", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args(argv)
    scratch = ROOT / "bench" / "data" / "journal"
    scratch.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results = measure(args.emails, args.repeat, scratch)
    lines = [
        "",
        f"## {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')} — the hand-over journal's cost",
        "",
        f"Command: `python -m bench.journal_cost {' '.join(argv or sys.argv[1:])}` "
        f"(total {time.time() - started:.0f} s); "
        f"{args.emails:,} emails per run (SMTP: up to 3,000), medians of {args.repeat}, interleaved.",
        "",
        "| provider | without journal | with journal | change | target |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        verdict = "met" if r["change_pct"] >= -5 else "**missed**"
        lines.append(
            f"| {r['provider']} | {r['without_per_s']:,} emails/s | {r['with_per_s']:,} emails/s | "
            f"{r['change_pct']:+.1f}% | {verdict} (≥ -5%) |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "a", encoding="utf-8") as out:
        out.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

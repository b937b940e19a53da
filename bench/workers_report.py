"""The workers benchmark as a Markdown section of bench/RESULTS.md, each number next to its target."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from bench.report import header_lines

SPEEDUP_TARGET = 0.6  # 4 PostgreSQL workers finish the full cycle in at most 0.6x the time of one
CLAIM_RATE_TARGET = 1.5  # claims per second per PostgreSQL worker within 1.5x of the DuckDB worker's


def _ok(passed: bool) -> str:
    return "met" if passed else "**missed**"


def _cpu(runs: list[dict]) -> float | None:
    used = [r["machine_cpu_s"] for r in runs if r.get("machine_cpu_s") is not None]
    return statistics.median(used) if used else None


def _cpu_bound(runs: dict, cores: int) -> str:
    """What the machine's CPU allows: 4 workers cannot finish before their CPU seconds / cores."""
    one, four = _cpu(runs["postgres_1"]["runs"]), _cpu(runs["postgres_4"]["runs"])
    if one is None or four is None:
        return ""
    floor = four / cores
    return (
        f"; the machine's CPU during 4 workers, {four:,.0f} s on {cores} cores, allows no less than "
        f"{floor:.1f} s = {floor / runs['postgres_1']['median_s']:.2f}x (1 worker used {one:,.0f} CPU-s)"
    )


def _rows(tier: dict, cores: int) -> list[str]:
    name = tier["tier"]
    rows = [f"| {name} | invoices / ledger rows | {tier['invoices']:,} / {tier['ledger_rows']:,} | |"]
    kind = "full_cycle" if "full_cycle" in tier else "dry_run"
    runs = tier[kind]
    duplicates = 0
    for key, value in runs.items():
        walls = ", ".join(f"{r['wall_s']:.1f}" for r in value["runs"])
        sent = value["runs"][0]["sent_keys"]
        emails = value["runs"][0]["emails"]
        duplicates += sum(r["duplicates"] for r in value["runs"])
        label = key.replace("_", " ").replace("postgres", "PostgreSQL,").replace("duckdb", "DuckDB,") + " worker(s)"
        cpu = _cpu(value["runs"])
        used = f" (machine CPU {cpu:,.0f} s)" if cpu is not None else ""
        rows.append(f"| {name} | {kind.replace('_', ' ')}, {label} (runs: {walls} s) | "
                    f"{value['median_s']:.1f} s{used}, {sent:,} keys sent, {emails:,} emails | |")  # fmt: skip
    if kind == "full_cycle":
        ratio = runs["postgres_4"]["median_s"] / runs["postgres_1"]["median_s"]
        rows.append(f"| {name} | 4 PostgreSQL workers / 1{_cpu_bound(runs, cores)} | {ratio:.2f}x | "
                    f"≤ {SPEEDUP_TARGET}x: {_ok(ratio <= SPEEDUP_TARGET)} |")  # fmt: skip
    rows.append(f"| {name} | duplicates in every run (ledger and outboxes, checked) | {duplicates} | 0: "
                f"{_ok(duplicates == 0)} |")  # fmt: skip
    claims = tier.get("claims")
    if claims:
        duck = claims["duckdb_1"][0]["claims_per_s"]
        for key, workers in claims.items():
            per_worker = statistics.median(w["claims_per_s"] for w in workers)
            won = sum(w["won"] for w in workers)
            verdict = (
                ""
                if key == "duckdb_1"
                else f"within {CLAIM_RATE_TARGET}x of DuckDB: " + _ok(per_worker * CLAIM_RATE_TARGET >= duck)
            )
            rows.append(f"| {name} | claims per second per worker, {key.replace('_', ' ')} worker(s) "
                        f"({won:,} keys won in all) | {per_worker:,.0f} | {verdict} |")  # fmt: skip
    return rows


def append_markdown(path: Path, report: dict) -> None:
    lines = ["", *header_lines(report, " — several workers on one PostgreSQL ledger")]
    cores = os.cpu_count() or 1
    for tier in report["tiers"]:
        lines += _rows(tier, cores)
    with open(path, "a") as f:
        f.write("\n".join(lines) + "\n")

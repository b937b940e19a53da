"""Appends one benchmark run to bench/RESULTS.md as a dated section, keeping earlier ones."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

TARGETS = {  # issue 15 (performance, round 2); earlier sections of RESULTS.md were judged by earlier targets
    "full_1m": 25.0,
    "dry_1m": 4.0,
    "dry_10m": 15.0,
    "dry_10m_rss_mb": 4096,
    "newly_due_ratio": 2.0,
    "file_rate_tmpfs": 4000,
    "smtp_rate": 300,
    "naive_ratio": 15.0,
    "history_growth": 0.20,
    "noop_over_10k_s": 1.0,
}


def _ok(passed: bool) -> str:
    return "met" if passed else "**missed**"


def _cpu(measured: dict) -> str:
    return f" (CPU {measured['median_cpu_s']:.1f} s)" if "median_cpu_s" in measured else ""


def _tier_rows(tier: dict, context: dict | None = None) -> list[str]:
    context = context or {}
    rows = []
    full, dry = tier.get("full_cycle"), tier["dry_run"]
    steps = tier["steps"]["steps"]
    ratio = steps["newly_due"]["s"] / max(tier["floor"]["median_s"], 1e-9)
    rows.append(f"| {tier['tier']} | ledger rows | {tier['ledger_rows']:,} | |")
    rows.append(
        f"| {tier['tier']} | keys newly due (ours / floor query) | "
        f"{tier['steps']['due_keys']:,} / {tier['floor']['newly_due']:,} | |"
    )
    if full:
        target = _ok(full["median_s"] <= TARGETS["full_1m"]) if tier["tier"] == "1m" else ""
        rows.append(
            f"| {tier['tier']} | full `dunning run`, file outbox (median of {len(full['runs_s'])}) | "
            f"{full['median_s']:.1f} s{_cpu(full)}, peak RSS {full['peak_rss_mb']:,} MB | {target} |"
        )
    if tier["tier"] == "10m":
        target = _ok(dry["median_s"] <= TARGETS["dry_10m"] and dry["peak_rss_mb"] <= TARGETS["dry_10m_rss_mb"])
    else:
        target = _ok(dry["median_s"] <= TARGETS["dry_1m"]) if tier["tier"] == "1m" else ""
    rows.append(
        f"| {tier['tier']} | `dunning run --dry-run`, whole CLI (median) | "
        f"{dry['median_s']:.1f} s{_cpu(dry)}, peak RSS {dry['peak_rss_mb']:,} MB | {target} |"
    )
    if "noop" in tier and "noop_10k" in context:
        noop, base = tier["noop"], context["noop_10k"]
        over = noop["median_s"] - base["median_s"]
        rows.append(
            f"| {tier['tier']} | no-op: the same snapshot an hour after a cycle, whole CLI (median of "
            f"{len(noop['runs_s'])}, {noop['skipped']} skipped as unchanged) | {noop['median_s']:.1f} s{_cpu(noop)}: "
            f"{over:+.1f} s over the 10k no-op ({base['median_s']:.1f} s) | "
            f"{_ok(over <= TARGETS['noop_over_10k_s']) if tier['tier'] == '1m' else ''} |"
        )
    for name, value in steps.items():
        extra = f", {value['emails']:,} emails, {value['emails_per_s']:,} emails/s" if "emails" in value else ""
        runs = f", median of {len(value['runs_s'])}" if "runs_s" in value else ""
        rows.append(
            f"| {tier['tier']} | step `{name}` | "
            f"{value['s']:.2f} s{runs} (process peak {value['peak_rss_mb']:,} MB){extra} | |"
        )
    if "publication" in tier:
        pub = tier["publication"]
        rows.append(
            f"| {tier['tier']} | publication with {pub['days']} days of daily history ({pub['history_rows']:,} rows) | "
            f"first {pub['first_s']:.2f} s, next run {pub['next_run_s']:.2f} s (copying the table whole: "
            f"{pub['whole_table_copy_s']:.2f} s) | |"
        )
    rows.append(f"| {tier['tier']} | floor: bare DuckDB anti-join | {tier['floor']['median_s']:.2f} s | |")
    rows.append(
        f"| {tier['tier']} | newly-due step / floor | {ratio:.1f}x | {_ok(ratio <= TARGETS['newly_due_ratio'])} |"
    )
    naive = tier.get("naive")
    if full and naive:
        naive_ratio = naive["extrapolated_s"] / full["median_s"]
        capped = (
            f"capped at {naive['seconds']} s after {naive['processed']:,} of {naive['of']:,} invoices, extrapolated"
            if naive["capped"]
            else "complete"
        )
        share = (
            f"; {naive['ledger_share']:.0%} of its time in per-invoice queries and commits"
            if "ledger_share" in naive
            else ""
        )
        rows.append(
            f"| {tier['tier']} | naive poller, same emails rendered ({capped}{share}) | "
            f"{naive['extrapolated_s']:,.0f} s = {naive_ratio:.0f}x our cycle | "
            f"{_ok(naive_ratio >= TARGETS['naive_ratio']) if tier['tier'] == '1m' else ''} |"
        )
        for key, label, base in (
            ("full_cycle_history_x2", "full cycle", full),
            ("dry_run_history_x2", "`--dry-run`", dry),
        ):
            if key not in tier:
                continue
            doubled = tier[key]
            growth = doubled["median_s"] / base["median_s"] - 1
            rows.append(
                f"| {tier['tier']} | {label} with history doubled ({doubled['ledger_rows']:,} ledger rows; runs "
                f"interleaved with the ones above: {', '.join(f'{w:.1f}' for w in doubled['runs_s'])} vs "
                f"{', '.join(f'{w:.1f}' for w in base['runs_s'])} s) | {doubled['median_s']:.1f} s ({growth:+.0%}) | "
                f"{_ok(growth <= TARGETS['history_growth'])} |"
            )
    return rows


def _outbox_rows(tier: dict) -> list[str]:
    """The send rate on the disk next to what the disk itself allows, and on a tmpfs (the code without the disk)."""
    rows = []
    for key, where in (("steps", "on disk"), ("steps_tmpfs", "on tmpfs (/dev/shm)")):
        if key not in tier:
            continue
        measured = tier[key]
        rate = measured["steps"]["claim_render_send_record"]["emails_per_s"]
        pool = (
            f"; {measured['render_processes']} render process(es) on {measured['cores']} core(s)"
            if "render_processes" in measured
            else ""
        )
        target = _ok(rate >= TARGETS["file_rate_tmpfs"]) if key == "steps_tmpfs" and tier["tier"] == "1m" else ""
        rows.append(
            f"| {tier['tier']} | file outbox send rate, ledger included, {where} | {rate:,} emails/s "
            f"(bare loop creating the same files there: {measured['disk_files_per_s']:,}/s{pool}) | {target} |"
        )
    return rows


def _noop_rows(report: dict) -> list[str]:
    """The machine's speed, the 10k no-op, and the floor under every run, part by part."""
    rows = []
    if "calibration" in report:
        rows.append(
            f"| machine | one core of pure Python: `sum(range(10**8))`, CPU (median of "
            f"{len(report['calibration']['runs_s'])}) | {report['calibration']['python_loop_s']:.2f} s | |"
        )
    noop = report.get("noop_10k")
    if isinstance(noop, dict):
        rows.append(
            f"| 10k | no-op: the same snapshot an hour after a cycle, whole CLI (median of {len(noop['runs_s'])}, "
            f"{noop['skipped']} skipped as unchanged) | {noop['median_s']:.1f} s{_cpu(noop)} | |"
        )
    for part, measured in (report.get("floor") or {}).items():
        rows.append(f"| floor | {part} (median) | {measured['median_s']:.2f} s{_cpu(measured)} | |")
    return rows


def header_lines(report: dict, title: str = "") -> list[str]:
    """The heading of one benchmark's section: when, on what machine, by which command, and the table's head."""
    return [
        f"## {report['when']}{title}",
        "",
        f"Machine: {report['machine']}.",
        f"Command: `{report['command']}` (total {report['total_s']} s).",
        "",
        "| tier | measurement | result | target |",
        "|---|---|---|---|",
    ]


def append_markdown(path: Path, report: dict) -> None:
    smtp = report["smtp"]
    lines = [
        *header_lines(report),
        *_noop_rows(report),
        f"| - | SMTP to local aiosmtpd, ledger included | "
        f"{smtp['emails_per_s']:,} emails/s ({smtp['emails']:,} in {smtp['seconds']} s) | "
        f"{_ok(smtp['emails_per_s'] >= TARGETS['smtp_rate'])} |",
    ]
    for tier in report["tiers"]:
        lines += _tier_rows(tier, report)
        if tier["tier"] in ("100k", "1m"):
            lines += _outbox_rows(tier)
    header = (
        ""
        if path.exists()
        else "# Benchmark results\n\n"
        'Newest last; earlier runs are kept so progress is visible. See README "Benchmarks".\n\n'
    )
    with path.open("a") as handle:
        handle.write(header + "\n".join(lines) + "\n\n")


def save(report: dict, out: Path, started: float, json_path: Path, append: Callable[[Path, dict], None]) -> None:
    """Stamp the total time, append the Markdown section to `out`, keep the raw numbers in `json_path`."""
    report["total_s"] = round(time.time() - started, 1)
    append(out, report)
    json_path.write_text(json.dumps(report, indent=2, default=str))
    print(f"results appended to {out}")

"""`make bench-check`'s judgement: the measured figures against bench/budgets.toml and the last recorded ones.

Pure functions over dicts (bench/test_check.py tests them): `figures` flattens a bench-check report into rows
(section, part, value, unit), `judge` gives each its budget, last recorded figure and verdict, `markdown` the
table. Recorded figures live in bench/recorded.json (`--record` rewrites it), keyed `section/part`.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from bench.dagster_events import step_share

BUDGETS = Path(__file__).with_name("budgets.toml")
RECORDED = Path(__file__).with_name("recorded.json")
RUNS = ("new_1m_dry", "new_1m_live", "warm_1m_dry", "warm_1m_full", "warm_10m_dry")
# step -> the floors (bench/floors.py) that do its work; a live run's snapshot step also writes the history day
FLOOR_OF = {
    "invoice_snapshot": ("read_validate",),
    "reminders_due": ("newly_due",),
    "dunning_audit": ("audit",),
    "analyst_history": ("publication",),
}
LIVE_FLOOR_OF = FLOOR_OF | {
    "invoice_snapshot": ("read_validate", "history_write"),
    "send_batch": ("claim_record", "send"),
}
INFO_RATIOS = {"send_batch"}  # its floors render nothing: the ratio is shown, not judged
OVER, SLOWER, MET = "**over budget**", "slower than last", "met"


@dataclass(frozen=True)
class Row:
    section: str
    part: str
    now: float | None
    unit: str = "s"
    budget: float | None = None
    last: float | None = None
    verdict: str = ""

    @property
    def key(self) -> str:
        return f"{self.section}/{self.part}"


def load_budgets(path: Path = BUDGETS) -> dict:
    """The budgets file, checked: a run's step budgets may not sum to more than its whole budget."""
    budgets = tomllib.loads(path.read_text())
    for name in RUNS:
        section = budgets.get(name, {})
        total = round(sum(section.get("steps", {}).values()), 6)
        if "whole" in section and total > section["whole"] + 1e-6:
            raise ValueError(f"{path}: [{name}.steps] sum to {total} s, more than its whole {section['whole']} s")
    return budgets


def _run_rows(section: str, run: dict, floors: dict | None, live: bool) -> list[Row]:
    rows = [Row(section, "whole", run["wall_s"])]
    rows += [Row(section, part, seconds) for part, seconds in step_share(run)]
    rows += [
        Row(section, "CPU (user + system)", run["cpu_s"], "s, info"),
        Row(section, "peak_rss_mb", run["peak_rss_mb"], "MB"),
        Row(section, "Dagster events", run["events"], ""),
    ]
    floors = {**(floors or {}), **run.get("own_floors", {})}  # a floor read from this run's own home
    for step, parts in (LIVE_FLOOR_OF if live else FLOOR_OF).items():
        if step in run["steps"] and all(p in floors for p in parts):
            floor = sum(floors[p]["s"] for p in parts)
            info = " (renders nothing: info)" if step in INFO_RATIOS else ""
            rows.append(Row(section, f"{step} / floor ({' + '.join(parts)}){info}",
                            round(run["steps"][step] / max(floor, 1e-3), 2), "x, info" if info else "x"))  # fmt: skip
    return rows


def figures(report: dict) -> list[Row]:
    """Every figure of a bench-check report, in the order of the table."""
    rows: list[Row] = []
    for name in RUNS:
        if name in report:
            floors = report.get("floors", {}).get(name.rsplit("_", 1)[0])
            rows += _run_rows(name, report[name], floors, live=name.endswith(("live", "full")))
    for name in ("idle_10k", "idle_1m"):
        if name in report:
            idle = report[name]
            rows.append(Row(name, "whole", idle["median_s"]))
            rows += [
                Row(name, part, seconds, "s, info") for part, seconds in step_share(idle.get("median_details", {}))
            ]
    for name, command in (("version", "dunning --version"), ("help", "dunning --help")):
        if command in report.get("startup", {}):
            rows.append(Row(name, "whole", report["startup"][command]["median_s"]))
    if "shards" in report:
        rows.append(Row("shards", "cpu_ratio", report["shards"]["cpu_ratio"], "x"))
    for tier, floors in report.get("floors", {}).items():
        rows += [Row(f"floor_{tier}", part, value["s"], "s, info") for part, value in floors.items()]
        for name in RUNS:  # the floors read from one run's own home (its publication, its outbox)
            if name.startswith(tier) and name in report:
                own = report[name].get("own_floors", {})
                rows += [Row(f"floor_{tier}", f"{part} ({name.rsplit('_', 1)[1]} run's home)", value["s"], "s, info")
                         for part, value in own.items()]  # fmt: skip
    for case, run in report.get("empty_job", {}).items():
        if "steps" in run:
            rows += [Row("empty_job", f"{case}: whole", run["wall_s"], "s, info"),
                     Row("empty_job", f"{case}: before the first step", run["before_first_step_s"], "s, info"),
                     Row("empty_job", f"{case}: its {len(run['steps'])} steps and between them",
                         round(sum(run["steps"].values()) + run["between_steps_s"], 3), "s, info")]  # fmt: skip
        elif "wall_s" in run:
            rows.append(Row("empty_job", case, run["wall_s"], "s, info"))
    return rows


def _budget(row: Row, budgets: dict) -> float | None:
    section = budgets.get(row.section, {})
    if row.unit == "x" and " / floor" in row.part:
        return budgets.get("ratio_max")
    if row.part in ("whole", "cpu_ratio", "peak_rss_mb"):
        return section.get(row.part)
    return section.get("steps", {}).get(row.part)


def _slower(row: Row, last: float | None, share: float, slack_s: float) -> bool:
    """More than `share` above the last recorded figure (and, in seconds, more than `slack_s` above it)."""
    if row.now is None or not last or row.now <= last * (1 + share):
        return False
    return not row.unit.startswith("s") or row.now - last > slack_s


def judge(rows: list[Row], budgets: dict, recorded: dict) -> list[Row]:
    """Each row with its budget, its last recorded figure and a verdict; budgeted parts nobody measured are added as
    "not measured" (a step renamed or merged)."""
    slower, slack = budgets.get("slower_than_last", 0.10), budgets.get("slower_min_s", 0.05)
    judged = []
    for row in rows:
        budget, last = _budget(row, budgets), recorded.get(row.key)
        if row.now is not None and budget is not None and row.now > budget:
            verdict = OVER
        elif _slower(row, last, slower, slack):
            verdict = f"{SLOWER} (+{row.now / last - 1:.0%})"
        elif budget is not None:
            verdict = MET
        else:
            verdict = "" if row.unit.endswith("info") or row.unit in ("", "MB") else "no budget"
        judged.append(Row(row.section, row.part, row.now, row.unit, budget, last, verdict))
    measured = {(row.section, row.part) for row in rows}
    for name in RUNS:
        if not any(section == name for section, _ in measured):
            continue
        for part, budget in budgets.get(name, {}).get("steps", {}).items():
            if (name, part) not in measured:
                judged.append(Row(name, part, None, "s", budget, recorded.get(f"{name}/{part}"), "not measured"))
    return judged


def failed(rows: list[Row]) -> list[Row]:
    return [row for row in rows if row.verdict == OVER]


def _value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    unit = unit.split(",")[0]
    return f"{value:,.0f} {unit}".strip() if unit in ("MB", "") else f"{value:.2f} {unit}".replace(" x", "x")


def markdown(rows: list[Row], budgets: dict) -> list[str]:
    lines = ["| measurement | now | budget | last recorded | verdict |", "|---|---|---|---|---|"]
    section = None
    for row in rows:
        if row.section != section:
            section = row.section
            title = budgets.get(section, {}).get("title", section.replace("_", " "))
            lines.append(f"| **{title}** | | | | |")
        lines.append(f"| {row.part} | {_value(row.now, row.unit)} | {_value(row.budget, row.unit)} | "
                     f"{_value(row.last, row.unit)} | {row.verdict} |")  # fmt: skip
    return lines


def recorded_figures(rows: list[Row]) -> dict[str, float]:
    return {row.key: row.now for row in rows if row.now is not None}

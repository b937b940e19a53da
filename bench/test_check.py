"""Tests of bench-check's judgement (not in the suite's testpaths: `python -m pytest -q bench/test_check.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.check_report import MET, OVER, Row, figures, judge, load_budgets

BUDGETS = {
    "ratio_max": 3.0,
    "slower_than_last": 0.10,
    "slower_min_s": 0.05,
    "new_1m_dry": {"whole": 5.0, "steps": {"before the first step": 1.0, "invoice_snapshot": 1.0, "gone_step": 0.5}},
    "version": {"whole": 0.3},
}


def _run(**steps: float) -> dict:
    return {"wall_s": 6.0, "cpu_s": 7.0, "peak_rss_mb": 900, "events": 80, "steps": steps,
            "before_first_step_s": 2.0, "between_steps_s": 0.2, "after_last_step_s": 0.1}  # fmt: skip


def test_the_budgets_file_parses_and_each_run_s_steps_fit_its_whole():
    budgets = load_budgets()
    for name in ("new_1m_dry", "new_1m_live", "warm_1m_dry", "warm_1m_full"):
        assert sum(budgets[name]["steps"].values()) <= budgets[name]["whole"] + 1e-9


def test_steps_summing_above_the_whole_are_refused(tmp_path: Path):
    path = tmp_path / "budgets.toml"
    path.write_text("[new_1m_dry]\nwhole = 1.0\n[new_1m_dry.steps]\na = 0.6\nb = 0.6\n")
    with pytest.raises(ValueError, match="new_1m_dry"):
        load_budgets(path)


def test_each_step_is_judged_against_its_budget_and_a_missing_one_is_named():
    report = {"new_1m_dry": _run(invoice_snapshot=0.8, reminders_due=0.4), "floors": {"new_1m": {
        "read_validate": {"s": 0.2}, "newly_due": {"s": 0.2}}}}  # fmt: skip
    rows = {row.part: row for row in judge(figures(report), BUDGETS, {})}
    assert rows["whole"].verdict == OVER  # 6.0 > 5.0
    assert rows["before the first step"].verdict == OVER  # 2.0 > 1.0
    assert rows["invoice_snapshot"].verdict == MET
    assert rows["reminders_due"].verdict == "no budget"
    assert rows["gone_step"].verdict == "not measured"
    assert rows["invoice_snapshot / floor (read_validate)"].now == 4.0
    assert rows["invoice_snapshot / floor (read_validate)"].verdict == OVER  # 4x > 3x
    assert rows["reminders_due / floor (newly_due)"].verdict == MET


def test_slower_than_last_is_flagged_only_beyond_ten_percent_and_the_noise():
    def verdict(now: float, last: float) -> str:
        row = Row("new_1m_dry", "invoice_snapshot", now)
        return judge([row], BUDGETS, {"new_1m_dry/invoice_snapshot": last})[0].verdict

    assert verdict(0.90, 0.70).startswith("slower than last")  # +29%, +0.2 s
    assert verdict(0.75, 0.70) == MET  # +7%
    assert verdict(0.08, 0.05) == MET  # +60%, but 0.03 s: noise
    assert verdict(1.2, 0.70) == OVER  # a missed budget wins


def test_a_figure_without_a_budget_is_reported_not_judged():
    row = judge([Row("empty_job", "first run: whole", 2.9, "s, info")], BUDGETS, {})[0]
    assert row.budget is None and row.verdict == ""

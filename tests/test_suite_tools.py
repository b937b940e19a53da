"""The suite's own tools: what each test costs (`tests/timing.py`). (Dagster's migration scripts are parsed once per
process by the product itself, `pipelines/instance/storage.py`: `tests/test_instance.py`.)"""

from __future__ import annotations

import pytest


def test_the_timing_plugin_writes_one_line_per_test_only_when_asked(pytester, monkeypatch, tmp_path):
    pytester.makepyfile(test_two="def test_a():\n    pass\n\ndef test_b():\n    sum(range(10**6))\n")
    monkeypatch.delenv("DUNNING_TEST_TIMES", raising=False)
    pytester.runpytest_inprocess("-p", "tests.timing", "-p", "no:cacheprovider").assert_outcomes(passed=2)
    times = tmp_path / "times.tsv"
    assert not times.exists()
    monkeypatch.setenv("DUNNING_TEST_TIMES", str(times))
    pytester.runpytest_inprocess("-p", "tests.timing", "-p", "no:cacheprovider").assert_outcomes(passed=2)
    lines = [line.split("\t") for line in times.read_text().splitlines()]
    assert [line[0] for line in lines] == ["test_two.py::test_a", "test_two.py::test_b"]
    assert all(len(line) == 10 and float(line[1]) >= 0 and float(line[2]) >= 0 for line in lines)


INNER_TESTS = """
import pytest

from pipelines import cli
from pipelines.cli import cycle


def test_two_commands(tmp_path):
    home = str(tmp_path / "home")
    assert cli.main(["--home", home, "status"]) == 0
    assert cli.main(["--home", home, "status"]) == 0


def test_a_run(tmp_path):
    with pytest.raises(Exception):  # no instance: it fails at once, and is counted all the same
        cycle._execute_cycle(None, {}, {})


def test_nothing():
    pass


@pytest.mark.slow
def test_marked_slow():
    pass
"""


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_the_timing_plugin_counts_each_tests_commands_and_dagster_runs_and_puts_them_back(
    pytester, monkeypatch, tmp_path
):
    from bench.suite_costs import read, summary
    from pipelines import cli
    from pipelines.cli import cycle

    before = (cli.run_command, cycle._execute_cycle)
    pytester.makepyfile(test_inner=INNER_TESTS)
    times = tmp_path / "times.tsv"
    monkeypatch.setenv("DUNNING_TEST_TIMES", str(times))
    pytester.runpytest_inprocess("-p", "tests.timing", "-p", "no:cacheprovider").assert_outcomes(passed=4)
    assert (cli.run_command, cycle._execute_cycle) == before  # the session's wrappers are gone with it
    lines = {line.split("\t")[0]: line.split("\t") for line in times.read_text().splitlines()}
    commands = lines["test_inner.py::test_two_commands"]
    assert len(commands) == 10 and commands[5] == "status:2" and commands[7] == "0"
    assert 0 < float(commands[6]) <= float(commands[2])
    assert lines["test_inner.py::test_a_run"][5:8:2] == ["", "1"]
    assert lines["test_inner.py::test_nothing"][5:] == ["", "0.000", "0", "0.000", ""]
    assert lines["test_inner.py::test_marked_slow"][9] == "slow"
    costs = read(times)
    assert [c.commands for c in costs if c.commands] == [{"status": 2}]
    text = summary(costs)
    assert "`dunning` commands in the tests' processes: 2," in text and "Dagster runs of the cycle: 1," in text
    assert "| status | 2 |" in text


def test_the_summary_names_the_tests_over_the_slow_rule_that_are_not_marked_slow():
    from bench.suite_costs import TestCost, summary

    costs = [
        TestCost("t.py::unmarked_and_costly", 1.0, 0.5, slow=False),
        TestCost("t.py::unmarked_and_cheap", 1.0, 0.39, slow=False),
        TestCost("t.py::marked", 1.0, 0.9, slow=True),
        TestCost("t.py::from_an_older_file", 1.0, 0.9),
    ]
    listed = summary(costs).split("Not marked slow", 1)[1]
    assert "t.py::unmarked_and_costly" in listed
    assert not any(name in listed for name in ("unmarked_and_cheap", "t.py::marked", "from_an_older_file"))
    assert "Not marked slow" not in summary(costs[1:])

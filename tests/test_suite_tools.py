"""The suite's own tools: what each test costs (`tests/timing.py`). (Dagster's migration scripts are parsed once per
process by the product itself, `pipelines/instance/storage.py`: `tests/test_instance.py`.)"""

from __future__ import annotations

import subprocess

import pytest


def test_the_timing_plugin_writes_one_line_per_test_only_when_asked(pytester, monkeypatch, tmp_path):
    pytester.makepyfile(
        test_two="import subprocess, sys\n\ndef test_a():\n    pass\n\n"
        "def test_b():\n    subprocess.run([sys.executable, '-c', 'sum(range(10**6))'], check=True)\n"
    )
    monkeypatch.delenv("DUNNING_TEST_TIMES", raising=False)
    pytester.runpytest_inprocess("-p", "tests.timing", "-p", "no:cacheprovider").assert_outcomes(passed=2)
    times = tmp_path / "times.tsv"
    assert not times.exists()
    monkeypatch.setenv("DUNNING_TEST_TIMES", str(times))
    pytester.runpytest_inprocess("-p", "tests.timing", "-p", "no:cacheprovider").assert_outcomes(passed=2)
    lines = [line.split("\t") for line in times.read_text().splitlines()]
    assert [line[0] for line in lines] == ["test_two.py::test_a", "test_two.py::test_b"]
    assert all(len(line) == 11 and float(line[1]) >= 0 and float(line[2]) >= 0 for line in lines)
    assert [line[10] for line in lines] == ["0", "1"], "test_b started one child process, test_a none"
    assert float(lines[1][4]) > 0, "and its CPU is counted as the children's"


INNER_TESTS = """
import subprocess
import sys

import pytest

from pipelines import cli
from pipelines.cli import cycle


@pytest.fixture(scope="session")
def per_worker():  # as the PostgreSQL cluster: once per worker, so not counted, in its setup or its teardown
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    yield
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory):  # as a module's shared home: once per worker that runs the module
    assert cli.main(["--home", str(tmp_path_factory.mktemp("module-home") / "home"), "status"]) == 0


@pytest.fixture
def own_child():  # a function's fixture is the test's own work: counted
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_wider_fixtures_are_not_counted(per_worker, shared_home, own_child):
    with pytest.raises(FileNotFoundError):  # a process that could not start is not one started
        subprocess.run(["/nonexistent/dunning-timing-probe"])


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


@pytest.fixture(scope="module")  # before `pytester`, which is a function's; and not counted by the plugin
def imported_first(tmp_path_factory):
    """What the inner tests import, imported before `pytester` starts: it drops every module imported while it
    lives, and numpy refuses a second import in one process ("cannot load module more than once per process"),
    which failed the next test of this worker that ran a command (`tests/test_docs.py`'s previews)."""
    from pipelines import cli
    from pipelines.cli import cycle

    assert cli.main(["--home", str(tmp_path_factory.mktemp("imports") / "home"), "status"]) == 0
    assert cycle.dunning_cycle().name == "dunning_cycle"  # the definitions a run loads, without a run


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_the_timing_plugin_counts_each_tests_commands_and_dagster_runs_and_puts_them_back(
    imported_first, pytester, monkeypatch, tmp_path
):
    from bench.suite_costs import read, summary
    from pipelines import cli
    from pipelines.cli import cycle

    pytester.makepyfile(test_inner=INNER_TESTS)
    times = tmp_path / "times.tsv"
    monkeypatch.setenv("DUNNING_TEST_TIMES", str(times))
    for owner, name in ((cli, "run_command"), (cycle, "_execute_cycle"), (subprocess.Popen, "_execute_child")):
        function = getattr(owner, name)  # under `make test` the outer session counts already: this one must wrap
        if getattr(function, "counted_by_timing", False):
            monkeypatch.setattr(owner, name, function.__wrapped__)
    before = (cli.run_command, cycle._execute_cycle, subprocess.Popen._execute_child)
    pytester.runpytest_inprocess("-p", "tests.timing", "-p", "no:cacheprovider").assert_outcomes(passed=5)
    after = (cli.run_command, cycle._execute_cycle, subprocess.Popen._execute_child)
    assert after == before  # the session's wrappers are gone with it
    lines = {line.split("\t")[0]: line.split("\t") for line in times.read_text().splitlines()}
    commands = lines["test_inner.py::test_two_commands"]
    assert len(commands) == 11 and commands[5] == "status:2" and commands[7] == "0"
    assert 0 < float(commands[6]) <= float(commands[2])
    assert lines["test_inner.py::test_a_run"][5:8:2] == ["", "1"]
    assert lines["test_inner.py::test_nothing"][5:] == ["", "0.000", "0", "0.000", "", "0"]
    assert lines["test_inner.py::test_marked_slow"][9] == "slow"
    wider = lines["test_inner.py::test_wider_fixtures_are_not_counted"]
    assert (wider[5], wider[10]) == ("", "1"), "only the function fixture's process; no status, no failed start"
    # the session's and the module's teardowns fall in the last test, the module's setup in the first: not counted
    assert [lines[f"test_inner.py::{name}"][10] for name in ("test_two_commands", "test_marked_slow")] == ["0", "0"]
    costs = read(times)
    assert [c.commands for c in costs if c.commands] == [{"status": 2}]
    text = summary(costs)
    assert "`dunning` commands in the tests' processes: 2," in text and "Dagster runs of the cycle: 1," in text
    assert "| status | 2 |" in text
    runs = text.split("make most Dagster runs", 1)[1].split("\n\n", 2)[1].splitlines()
    assert len(runs) == 1 and runs[0].startswith("- 1, ") and runs[0].endswith(": test_inner.py::test_a_run")
    starters = text.split("start most processes", 1)[1].split("\n\n", 2)[1].splitlines()
    assert [line.rsplit(": ", 1)[1] for line in starters] == ["test_inner.py::test_wider_fixtures_are_not_counted"]


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


def _times_file(path, *lines: tuple[str, str, int, int]) -> str:
    """A file as `tests/timing.py` writes it: per test its node id, its commands, Dagster runs and children."""
    rows = [
        "\t".join([node, "1.000", "0.500", "gw0", "0.100", commands, "0.300", str(runs), "0.200", "", str(children)])
        for node, commands, runs, children in lines
    ]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_the_budget_fails_only_on_a_count_over_it_and_says_which(tmp_path, capsys):
    from bench.suite_costs import main

    times = _times_file(
        tmp_path / "times.tsv",
        ("t.py::a", "run:2,status:1", 2, 0),
        ("t.py::b", "run:1", 1, 3),
        ("t.py::c", "", 0, 0),
    )
    budget = tmp_path / "budget.toml"
    budget.write_text("[counts]\ndagster_runs = 3\nin_process_commands = 4\nchild_processes = 5\n")
    assert main([times, "--brief", "--budget", str(budget)]) == 0  # at or under every budget: met
    out = capsys.readouterr().out
    assert "| Dagster runs of the cycle in the tests' processes | 3 | 3 | met |" in out
    assert "| processes the tests started through `subprocess` | 3 | 5 | met, 2 under: lower the budget |" in out
    assert "3 tests: 1.5 CPU-s" in out

    budget.write_text("[counts]\ndagster_runs = 2\nin_process_commands = 4\nchild_processes = 3\n")
    assert main([times, "--brief", "--budget", str(budget)]) == 1  # one run too many
    captured = capsys.readouterr()
    assert "| Dagster runs of the cycle in the tests' processes | 3 | 2 | **over budget** |" in captured.out
    assert "over budget: Dagster runs of the cycle in the tests' processes: 3 against 2." in captured.err
    assert "commands" not in captured.err and "subprocess" not in captured.err


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[counts]\ndagster_run = 3\n", "unknown: dagster_run; missing: dagster_runs"),
        ("[counts]\ndagster_runs = 3\nin_process_commands = 4\n", "missing: child_processes"),
        ("[counts]\ndagster_runs = 2.5\nin_process_commands = 4\nchild_processes = 3\n", "dagster_runs must be"),
        ("[counts]\ndagster_runs = true\nin_process_commands = 4\nchild_processes = 3\n", "dagster_runs must be"),
        ("[counts]\ndagster_runs = -1\nin_process_commands = 4\nchild_processes = 3\n", "dagster_runs must be"),
        ("[count]\ndagster_runs = 3\n", "one table, [counts], and nothing else (it has: count)"),
        ("dagster_runs = 3\n[counts]\n", "(it has: dagster_runs, counts)"),
        ("counts = 3\n", "one table, [counts]"),
        ("", "(it has: nothing)"),
        ("[counts]\ndagster_runs = \n", "is not TOML"),
    ],
)
def test_a_budget_file_that_is_wrong_is_exit_2_naming_what(tmp_path, capsys, text, named):
    from bench.suite_costs import main

    times = _times_file(tmp_path / "times.tsv", ("t.py::a", "run:1", 1, 0))
    budget = tmp_path / "budget.toml"
    budget.write_text(text)
    assert main([times, "--budget", str(budget)]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err


def test_a_times_file_that_cannot_be_held_to_a_budget_is_exit_2(tmp_path, capsys):
    from bench.suite_costs import main

    budget = tmp_path / "budget.toml"
    budget.write_text("[counts]\ndagster_runs = 3\nin_process_commands = 4\nchild_processes = 3\n")
    assert main([str(tmp_path / "missing.tsv"), "--budget", str(budget)]) == 2
    assert "no file at" in capsys.readouterr().err
    assert main([_times_file(tmp_path / "t.tsv", ("t.py::a", "", 0, 0)), "--budget", str(tmp_path / "no.toml")]) == 2
    assert "no.toml" in capsys.readouterr().err

    cut = tmp_path / "cut.tsv"
    cut.write_text("t.py::a\t1.000\t0.500\tgw0\t0.1\n")  # five columns: no form the plugin writes
    assert main([str(cut), "--budget", str(budget)]) == 2
    assert "cut.tsv, line 1: not a line of tests/timing.py" in capsys.readouterr().err

    older = tmp_path / "older.tsv"  # the ten-column form, before the processes were counted
    older.write_text("t.py::a\t1.000\t0.500\tgw0\t0.100\trun:1\t0.300\t1\t0.200\t\n")
    assert main([str(older)]) == 0  # summed up as ever
    capsys.readouterr()
    assert main([str(older), "--budget", str(budget)]) == 2  # but not held to a budget it cannot count
    assert "1 of 1 lines in an older form" in capsys.readouterr().err


def test_the_suites_own_budget_file_holds_every_count():
    from pathlib import Path

    from bench.suite_costs import COUNTS, read_budget

    budget = read_budget(Path(__file__).parent.parent / "bench" / "suite_budget.toml")
    assert set(budget) == set(COUNTS) and all(value > 0 for value in budget.values())

"""The suite's own tools: what each test costs (`tests/timing.py`). (Dagster's migration scripts are parsed once per
process by the product itself, `pipelines/instance/storage.py`: `tests/test_instance.py`.)"""

from __future__ import annotations


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
    assert all(len(line) == 4 and float(line[1]) >= 0 and float(line[2]) >= 0 for line in lines)

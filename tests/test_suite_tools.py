"""The suite's own tools: what each test costs (`tests/timing.py`) and Dagster's migration scripts parsed once per
test process (`tests/alembic_cache.py`)."""

from __future__ import annotations

import dagster._core.storage.event_log.sqlite.sqlite_event_log as event_log
import dagster._core.storage.runs.sqlite.sqlite_run_storage as run_storage
from alembic.config import Config
from alembic.script import ScriptDirectory
from dagster._core.storage.sql import get_alembic_config

from tests import alembic_cache


def test_one_script_directory_per_config_with_the_same_head_as_a_fresh_parse():
    events, runs = get_alembic_config(event_log.__file__), get_alembic_config(run_storage.__file__)
    assert ScriptDirectory.from_config(events) is ScriptDirectory.from_config(events)
    assert ScriptDirectory.from_config(runs) is not ScriptDirectory.from_config(events)
    fresh = alembic_cache._original(ScriptDirectory, events)  # what alembic builds without the cache
    assert fresh is not ScriptDirectory.from_config(events)
    assert ScriptDirectory.from_config(events).as_revision_number("head") == fresh.as_revision_number("head")
    other = Config()  # a config of its own gets its own directory, also at the same location
    other.set_main_option("script_location", events.get_main_option("script_location"))
    assert ScriptDirectory.from_config(other) is not ScriptDirectory.from_config(events)


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

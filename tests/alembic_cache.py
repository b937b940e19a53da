"""Dagster's own SQLite migrations read once per test process, not once per storage opened.

Every Dagster instance a test creates (a new home, each run's own event-log
database) asks alembic where Dagster's schema stands: alembic builds a new
`ScriptDirectory` each time and loads its ninety migration scripts again to
find the head revision, about a fifth of a whole CLI run's CPU. Those scripts
are files of the installed `dagster` package that never change while the
suite runs, so this plugin keeps one `ScriptDirectory` per alembic `Config`
(Dagster keeps one config per storage kind). What is read, stamped and checked
is unchanged: only the parsing of the scripts is shared. It applies to the
test processes, not to the `dunning` subprocesses some tests start.
"""

from __future__ import annotations

import functools

from alembic.config import Config
from alembic.script import ScriptDirectory

_original = ScriptDirectory.from_config.__func__  # type: ignore[attr-defined]
_directories: dict[int, tuple[Config, ScriptDirectory]] = {}


@functools.wraps(_original)
def _from_config(cls: type[ScriptDirectory], config: Config) -> ScriptDirectory:
    held = _directories.get(id(config))
    if held is None or held[0] is not config or cls is not ScriptDirectory:
        held = (config, _original(cls, config))
        if cls is ScriptDirectory:
            _directories[id(config)] = held  # the config held too, so its id is never reused
    return held[1]


def pytest_configure(config) -> None:
    ScriptDirectory.from_config = classmethod(_from_config)  # type: ignore[method-assign]

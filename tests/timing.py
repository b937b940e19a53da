"""What each test costs, for finding the suite's time: `DUNNING_TEST_TIMES=FILE make test` appends one line per test
to FILE, tab-separated:

1. the node id;
2. wall seconds;
3. CPU seconds of this process plus its finished children (`dunning` processes, servers the test started);
4. the xdist worker;
5. of column 3, the CPU seconds of finished children alone;
6. `dunning` commands the test ran in this process (`pipelines.cli.main`), as `name:count` pairs joined by commas;
7. of column 3, their CPU seconds;
8. Dagster runs of the cycle those commands executed (`dunning run`, `dunning backfill`);
9. of column 7, their CPU seconds;
10. `slow` when the test is marked slow (`make test-fast` leaves it out), else empty;
11. processes the test started through `subprocess` (a `dunning` process, a server, `initdb`, `pg_ctl`); not those
    `multiprocessing` forks or spawns (a render pool's workers).

Columns 6, 8 and 11 count what the test itself did, its function-scoped fixtures included. A fixture of a wider
scope (the session's PostgreSQL cluster, a module's shared home) is set up once per xdist worker that needs it, so
its commands, runs and processes would make the counts depend on how many workers there are and how the tests
were shared out among them: they are left out of the counts (not out of the CPU columns).

CPU time is the figure to rank by on a shared machine, where wall time mostly says how busy it was; columns 6, 8
and 11 are counts, which neither the machine nor the number of workers changes. `python -m bench.suite_costs FILE`
sums the file up, and with `--budget` holds the counts to `bench/suite_budget.toml`. `make test` does both, into
`.suite-times.tsv` unless the variable names another file. Without the variable this plugin does nothing and
imports nothing of the product."""

from __future__ import annotations

import collections
import functools
import os
import resource
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

_ENV = "DUNNING_TEST_TIMES"


def _cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _own_and_children() -> tuple[float, float]:
    return _cpu_seconds(resource.RUSAGE_SELF), _cpu_seconds(resource.RUSAGE_CHILDREN)


class _Spent:
    """What the running test spent in `dunning` commands and Dagster runs of this process."""

    def __init__(self) -> None:
        self.commands: collections.Counter[str] = collections.Counter()
        self.commands_cpu = 0.0
        self.runs = 0
        self.runs_cpu = 0.0
        self.children_started = 0


_spent = _Spent()
_paused = 0  # > 0 while a fixture wider than a function sets up or tears down: its work is not counted
_WRAPPED = pytest.StashKey[list[tuple[Any, str, Any]]]()  # (module, name, original): put back when a session ends


def _counted(
    function: Callable[..., Any], add: Callable[[Any, float], None], failures_too: bool = True
) -> Callable[..., Any]:
    """`function`, calling `add` after each call (not while a wider fixture is paused); with `failures_too` false,
    only after the calls that return."""

    @functools.wraps(function)
    def measured(*args: Any, **kwargs: Any) -> Any:
        started, returned = _cpu_seconds(resource.RUSAGE_SELF), False
        try:
            result = function(*args, **kwargs)
            returned = True
            return result
        finally:
            if _paused <= 0 and (returned or failures_too):  # below 0 is a bug: count rather than miss
                add(args, _cpu_seconds(resource.RUSAGE_SELF) - started)

    measured.counted_by_timing = True  # type: ignore[attr-defined]
    return measured


def _add_command(args: tuple, cpu: float) -> None:
    _spent.commands[str(getattr(args[-1] if args else None, "command", None) or "?")] += 1  # run_command(handler, args)
    _spent.commands_cpu += cpu


def _add_run(_args: tuple, cpu: float) -> None:
    _spent.runs += 1
    _spent.runs_cpu += cpu


def _add_child(_args: tuple, _cpu: float) -> None:
    _spent.children_started += 1


def pytest_configure(config: pytest.Config) -> None:
    """With the variable set, count what every in-process `dunning` command and every Dagster run of the cycle
    costs (a command or run that fails counts too: it ran), and every child process started (one that could not
    start does not): the functions every such command, run and child passes through
    (`subprocess.Popen._execute_child` starts each child of `subprocess.run`, `Popen` and asyncio's
    subprocesses), wrapped for the session."""
    if not os.environ.get(_ENV):
        return
    from pipelines import cli
    from pipelines.cli import cycle

    wrapped = config.stash[_WRAPPED] = []
    counted = (
        (cli, "run_command", _add_command, True),
        (cycle, "_execute_cycle", _add_run, True),
        (subprocess.Popen, "_execute_child", _add_child, False),
    )
    for module, name, add, failures_too in counted:
        original = getattr(module, name)
        if getattr(original, "counted_by_timing", False):  # a session inside a counted one (pytester): counted once
            continue
        wrapped.append((module, name, original))
        setattr(module, name, _counted(original, add, failures_too))


def pytest_unconfigure(config: pytest.Config) -> None:
    wrapped: list[tuple[Any, str, Any]] = config.stash.get(_WRAPPED, [])
    for module, name, original in reversed(wrapped):
        setattr(module, name, original)


def _pause() -> None:
    global _paused
    _paused += 1


def _resume() -> None:
    global _paused
    _paused -= 1


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """A fixture wider than a function is not counted, in its setup or its teardown: `_resume` is its first
    finalizer and `_pause` its last, and a fixture's finalizers run last first."""
    if not os.environ.get(_ENV) or fixturedef.scope == "function":
        yield
        return
    fixturedef.addfinalizer(_resume)
    _pause()
    try:
        yield
    finally:
        _resume()
        fixturedef.addfinalizer(_pause)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    times = os.environ.get(_ENV)
    if not times:
        yield
        return
    global _spent
    _spent = _Spent()
    wall, (own, children) = time.perf_counter(), _own_and_children()
    yield
    own_after, children_after = _own_and_children()
    commands = ",".join(f"{name}:{count}" for name, count in sorted(_spent.commands.items()))
    fields = [
        item.nodeid,
        f"{time.perf_counter() - wall:.3f}",
        f"{own_after - own + children_after - children:.3f}",
        os.environ.get("PYTEST_XDIST_WORKER", "main"),
        f"{children_after - children:.3f}",
        commands,
        f"{_spent.commands_cpu:.3f}",
        str(_spent.runs),
        f"{_spent.runs_cpu:.3f}",
        "slow" if item.get_closest_marker("slow") is not None else "",
        str(_spent.children_started),
    ]
    line = ("\t".join(fields) + "\n").encode()
    fd = os.open(times, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if os.write(fd, line) != len(line):  # one write, so that the workers' lines never interleave
            raise OSError(f"{times}: a line of the test times was written only in part (is the disk full?)")
    finally:
        os.close(fd)

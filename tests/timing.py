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
11. child processes the test started through `subprocess` (a `dunning` process, a server, `initdb`, `pg_ctl`).

CPU time is the figure to rank by on a shared machine, where wall time mostly says how busy it was; columns 6, 8 and
11 are counts, which no machine changes. `python -m bench.suite_costs FILE` sums the file up, and with `--budget`
holds the counts to `bench/suite_budget.toml` (`make test` does both). Without the variable this plugin does
nothing and imports nothing of the product."""

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
_WRAPPED = pytest.StashKey[list[tuple[Any, str, Any]]]()  # (module, name, original): put back when a session ends


def _counted(function: Callable[..., Any], add: Callable[[Any, float], None]) -> Callable[..., Any]:
    @functools.wraps(function)
    def measured(*args: Any, **kwargs: Any) -> Any:
        started = _cpu_seconds(resource.RUSAGE_SELF)
        try:
            return function(*args, **kwargs)
        finally:
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
    costs, and every child process started: the functions every such command, run and child passes through
    (`subprocess.Popen._execute_child` starts each child of `subprocess.run`, `Popen` and asyncio's
    subprocesses), wrapped for the session."""
    if not os.environ.get(_ENV):
        return
    from pipelines import cli
    from pipelines.cli import cycle

    wrapped = config.stash[_WRAPPED] = []
    counted = (
        (cli, "run_command", _add_command),
        (cycle, "_execute_cycle", _add_run),
        (subprocess.Popen, "_execute_child", _add_child),
    )
    for module, name, add in counted:
        original = getattr(module, name)
        if getattr(original, "counted_by_timing", False):  # a session inside a counted one (pytester): counted once
            continue
        wrapped.append((module, name, original))
        setattr(module, name, _counted(original, add))


def pytest_unconfigure(config: pytest.Config) -> None:
    wrapped: list[tuple[Any, str, Any]] = config.stash.get(_WRAPPED, [])
    for module, name, original in reversed(wrapped):
        setattr(module, name, original)


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
    fd = os.open(times, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, ("\t".join(fields) + "\n").encode())
    finally:
        os.close(fd)

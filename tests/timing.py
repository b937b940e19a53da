"""What each test costs, for finding the suite's time: `DUNNING_TEST_TIMES=FILE make test` appends one line per test
to FILE (tab-separated: node id, wall seconds, CPU seconds of this process plus its finished children, the xdist
worker). CPU time is the figure to rank by on a shared machine, where wall time mostly says how busy it was.
Without the variable this plugin does nothing."""

from __future__ import annotations

import os
import resource
import time

import pytest


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    times = os.environ.get("DUNNING_TEST_TIMES")
    if not times:
        yield
        return
    wall, cpu = time.perf_counter(), _cpu_seconds()
    yield
    line = f"{item.nodeid}\t{time.perf_counter() - wall:.3f}\t{_cpu_seconds() - cpu:.3f}\t"
    line += os.environ.get("PYTEST_XDIST_WORKER", "main") + "\n"
    fd = os.open(times, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)

"""One core's time for a fixed pure-Python loop: how fast this machine runs Python at this hour, so figures taken on
different machines or hours can be compared (`bench.run.calibration`, `bench.suite_costs --calibrate`)."""

import subprocess
import sys

CALIBRATION = "import time; t = time.process_time(); sum(range(10**8)); print(time.process_time() - t)"


def loop_seconds() -> float:
    """The loop's CPU seconds, once, in a fresh interpreter (about 1.2-1.4 s of one core)."""
    done = subprocess.run([sys.executable, "-c", CALIBRATION], capture_output=True, text=True, check=True)
    return float(done.stdout)

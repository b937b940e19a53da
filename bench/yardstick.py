"""One core's time for a fixed pure-Python loop: how fast this machine runs Python at this hour, so figures taken on
different machines or hours can be compared (`bench.run.calibration`, `bench.suite_costs --calibrate`)."""

CALIBRATION = "import time; t = time.process_time(); sum(range(10**8)); print(time.process_time() - t)"

"""Makes time.sleep(0) a no-op in every Python process of a benchmark.

Beam's synthetic load-test source calls time.sleep(sleep_per_input_record_sec)
for every record, with 0 by default; on these machines a sleep(0) costs tens
of microseconds (a syscall and a GIL round trip), which would swamp what the
benchmark means to measure. integration/bench/run.sh puts this directory
first on PYTHONPATH for the client (which hosts the LOOPBACK SDK workers)
and for every job server, so each runner is measured the same way.
Non-zero sleeps are untouched.
"""

import time as _time

_real_sleep = _time.sleep


def _sleep(seconds):
  if seconds == 0:
    return None
  return _real_sleep(seconds)


_time.sleep = _sleep

#!/usr/bin/env python3
"""Benchmark: does the runner's memory stay flat when the sink is slower
than the source? (issue 5; not a test: it reports, it does not assert.)

A streaming pipeline — an unbounded splittable source emitting 1 KiB
records as fast as it can (self-checkpointing every step), a Reshuffle (so
records wait in the runner between stages), and a sink that sleeps per
record, ~10x slower than the source — runs on `refract serve` with a given
`--memory_budget`, with PROCESS workers. The runner's resident set size is
sampled every second; the report gives it at the start, the middle and the
end, its peak, and how many records the sink took.

    integration/bench/slow_sink_memory.py --bin target/release/refract \
        [--seconds 600] [--memory_budget 64m]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, 'integration', 'python'))
BOOT = os.path.join(REPO, 'integration', 'python_boot.sh')

from refract_testlib import budget_server, committed_counter, rss_bytes  # noqa: E402  # pylint: disable=wrong-import-position

# The source's classes are pasted into the script, so that PROCESS workers
# unpickle them by value (they do not have integration/python on their path).
with open(os.path.join(REPO, 'integration', 'python', 'splittable_sources.py')) as _f:
  SPLITTABLE_SOURCES = _f.read()

PIPELINE = (
  SPLITTABLE_SOURCES
  + r'''
import json, sys, time
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

class SlowSink(beam.DoFn):
  TAKEN = Metrics.counter('bench', 'sink_records')
  def process(self, record):
    time.sleep(0.001)
    self.TAKEN.inc()

endpoint, boot = sys.argv[1], sys.argv[2]
options = PipelineOptions([
    '--runner=PortableRunner', '--job_endpoint=' + endpoint, '--streaming',
    '--environment_type=PROCESS',
    '--environment_config=' + json.dumps({'command': boot}),
])
p = beam.Pipeline(options=options)
_ = (p | beam.Impulse() | beam.ParDo(Records(500)) | beam.Reshuffle()
     | beam.ParDo(SlowSink()))
print(p.run()._job_id, flush=True)
'''
)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--bin', required=True, help='refract binary')
  ap.add_argument('--seconds', type=int, default=600)
  ap.add_argument('--memory_budget', default='64m')
  args = ap.parse_args()
  work = tempfile.mkdtemp(prefix='refract-slow-sink.')
  # The one job gets the whole budget.
  server = budget_server(args.bin, os.path.join(work, 'refract.log'), args.memory_budget)
  try:
    script = os.path.join(work, 'pipeline.py')
    with open(script, 'w') as f:
      f.write(PIPELINE)
    job = (
      subprocess.run(
        [sys.executable, script, server.endpoint, BOOT],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
      )
      .stdout.strip()
      .splitlines()[-1]
    )
    samples = []
    start = time.monotonic()
    while time.monotonic() - start < args.seconds:
      time.sleep(1)
      samples.append((time.monotonic() - start, rss_bytes(server.proc.pid)))
    taken = committed_counter(server.endpoint, job, 'sink_records')
  finally:
    server.stop()

  def mib(b):
    return b / (1 << 20)

  third = max(1, len(samples) // 3)
  first, middle, last = samples[third - 1], samples[len(samples) // 2], samples[-1]
  print(
    'slow sink, %ds, --memory_budget %s: runner RSS %.0f MiB at %ds, '
    '%.0f MiB at %ds, %.0f MiB at %ds; peak %.0f MiB; sink took %d records '
    '(log in %s)'
    % (
      args.seconds,
      args.memory_budget,
      mib(first[1]),
      first[0],
      mib(middle[1]),
      middle[0],
      mib(last[1]),
      last[0],
      mib(max(s[1] for s in samples)),
      taken,
      work,
    )
  )


if __name__ == '__main__':
  main()

"""Checkpoint overhead: the same stateful streaming pipeline on Refract
with state in memory and with `--state_dir` checkpointing every second,
in one run; prints events per second of each and their ratio.

    integration/bench/checkpoint_overhead.py --bin target/release/refract
        [--events 20000] [--repeats 2] [--interval 1s]

The pipeline is integration/python/recovery_pipeline.py (an unbounded,
self-checkpointing source of numbered events, fixed windows, a stateful
per-key dedup-and-count DoFn with event-time timers, a file per window and
key), with large source steps and no pause, on PROCESS workers. Time is
measured from submission to DONE as seen through the Job API.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(os.path.dirname(HERE), 'python')
sys.path.insert(0, PYTHON_DIR)

from refract_testlib import RefractServer, free_port  # noqa: E402  # pylint: disable=wrong-import-position
from test_recovery import BOOT, PIPELINE, wait_for_end  # noqa: E402  # pylint: disable=wrong-import-position


def one_run(binary, events, extra_args):
  with tempfile.TemporaryDirectory(prefix='refract-ckpt-bench-') as work:
    output = os.path.join(work, 'out')
    os.mkdir(output)
    args = ['--serve_http=false'] + [a.replace('{work}', work) for a in extra_args]
    server = RefractServer(
      binary, os.path.join(work, 'refract.log'), port=free_port(), extra_args=args
    ).wait_ready()
    try:
      started = time.monotonic()
      done = subprocess.run(
        [
          sys.executable,
          PIPELINE,
          '--job_endpoint',
          server.endpoint,
          '--output',
          output,
          '--events',
          str(events),
          '--boot',
          BOOT,
          '--per_step',
          '500',
          '--pause',
          '0',
        ],
        capture_output=True,
        text=True,
        check=True,
      )
      job = done.stdout.strip().splitlines()[-1]
      state = wait_for_end(server, job, timeout_s=1800)
      elapsed = time.monotonic() - started
      if state != 'DONE':
        raise RuntimeError('job ended %s:\n%s' % (state, server.log_tail()))
    finally:
      server.stop()
  return elapsed


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--bin', required=True)
  parser.add_argument('--events', type=int, default=20000)
  parser.add_argument('--repeats', type=int, default=2)
  parser.add_argument('--interval', default='1s')
  args = parser.parse_args()
  modes = [
    ('in memory', []),
    (
      'checkpoint every %s' % args.interval,
      ['--state_dir', '{work}/state', '--checkpoint_interval', args.interval],
    ),
  ]
  results = {}
  for _ in range(args.repeats):
    for name, extra in modes:
      elapsed = one_run(args.bin, args.events, extra)
      results.setdefault(name, []).append(elapsed)
  print('%-24s %10s %12s' % ('mode', 'median s', 'events/s'))
  medians = {}
  for name, _ in modes:
    medians[name] = statistics.median(results[name])
    print('%-24s %10.2f %12.0f' % (name, medians[name], args.events / medians[name]))
  memory, durable = (medians[name] for name, _ in modes)
  print('throughput with checkpoints / in memory: %.2f' % (memory / durable))


if __name__ == '__main__':
  main()

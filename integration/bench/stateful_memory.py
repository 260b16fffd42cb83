#!/usr/bin/env python3
"""Benchmark: a stateful DoFn whose user state outgrows the memory budget
(issue 5; it reports, it does not assert).

Runs integration/python/stateful_bag_pipeline.py — generated values
appended to their key's bag state until an end-of-window timer reads and
clears it, totals checked in the pipeline — on `refract serve
--memory_budget B` (LOOPBACK workers, in the client), and samples the
runner's resident set size every half second. The report: the job's wall
time and final state, and the runner's peak RSS against the state's size.
`--mode streaming` submits the same pipeline with --streaming;
`--checkpointed` gives the server a `--state_dir` (see docs/architecture.md,
"Spilling bag state", for where bags spill), and the report then says how
many checkpoints were written and their size (from the checkpoint writer's
debug log lines, which it turns on with REFRACT_LOG).

    integration/bench/stateful_memory.py --bin target/release/refract \\
        [--total_mb 256] [--value_kb 1] [--keys 100000] [--memory_budget 128m] \\
        [--mode batch|streaming] [--checkpointed]
"""

import argparse
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PY = os.path.join(REPO, 'integration', 'python')
sys.path.insert(0, PY)

from refract_testlib import budget_server, final_state, run_sampling_rss  # noqa: E402  # pylint: disable=wrong-import-position


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--bin', required=True, help='refract binary')
  ap.add_argument('--total_mb', type=int, default=256)
  ap.add_argument('--value_kb', type=int, default=1)
  ap.add_argument('--keys', type=int, default=100000)
  ap.add_argument('--memory_budget', default='128m')
  ap.add_argument('--mode', choices=('batch', 'streaming'), default='batch')
  ap.add_argument(
    '--checkpointed', action='store_true', help='serve with --state_dir (periodic checkpoints)'
  )
  args = ap.parse_args()
  work = tempfile.mkdtemp(prefix='refract-stateful-memory.')
  extra = []
  if args.checkpointed:
    extra += ['--state_dir', os.path.join(work, 'state')]
    os.environ.setdefault('REFRACT_LOG', 'info,refract::durability=debug')
  # The one job gets the whole budget.
  server = budget_server(args.bin, os.path.join(work, 'refract.log'), args.memory_budget, extra)
  try:
    run, elapsed, samples = run_sampling_rss(
      server.proc.pid,
      [
        sys.executable,
        os.path.join(PY, 'stateful_bag_pipeline.py'),
        server.endpoint,
        str(args.total_mb),
        str(args.value_kb),
        str(args.keys),
        args.mode,
      ],
    )
  finally:
    server.stop()
  if os.environ.get('REFRACT_BENCH_RSS_SERIES'):
    print('RSS MiB every 0.5 s:', ' '.join('%.0f' % (s / (1 << 20)) for s in samples))
  state = final_state(run)
  if args.checkpointed:
    with open(os.path.join(work, 'refract.log'), errors='replace') as f:
      written = [line for line in f if 'checkpoint written' in line]
    sizes = [
      int(m.group(1)) for m in (re.search(r'\bbytes_written=(\d+)', line) for line in written) if m
    ]
    print(
      'checkpoints written: %d, %.1f MiB in all, largest %.1f MiB'
      % (len(written), sum(sizes) / (1 << 20), max(sizes or [0]) / (1 << 20))
    )
  print(
    'Bag state of %d MiB (%d KiB values, %d keys, %s%s), --memory_budget '
    '%s: %s in %.1f s; runner peak RSS %.0f MiB (log in %s)'
    % (
      args.total_mb,
      args.value_kb,
      args.keys,
      args.mode,
      ', checkpointed' if args.checkpointed else '',
      args.memory_budget,
      state,
      elapsed,
      max(samples or [0]) / (1 << 20),
      work,
    )
  )
  return 0 if state == 'DONE' else 1


if __name__ == '__main__':
  sys.exit(main())

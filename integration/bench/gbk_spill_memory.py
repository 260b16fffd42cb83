#!/usr/bin/env python3
"""Benchmark: a batch GroupByKey larger than the memory budget (issue 5;
it reports, it does not assert).

Runs integration/python/gbk_spill_pipeline.py — a splittable source of
incompressible values, a GroupByKey, totals checked in the pipeline — on
`refract serve --memory_budget B` (LOOPBACK workers, in the client), and
samples the runner's resident set size every half second. The report: the
job's wall time and final state, the runner's peak RSS, and how much the
GroupByKey spilled (from the runner's log).

With `--fan_out_inputs N` the values come from N reshuffled elements, each
emitting its share from a plain DoFn instead: bundles whose output dwarfs
their input, which the runner bounds by splitting them at an element, and
by writing to disk what one element emits past its bundle's share.

With `--reshuffle` they are reshuffled again (and passed through a Map)
before the GroupByKey: they then wait in the Map stage's queue.

With `--session_len L` they are grouped in session windows of L values
each (per key) instead of the global window; adding `--allowed_lateness_s
S`, in fixed windows of L values each that allow S seconds of lateness and
fire late panes (windows that stay open after their on-time pane); with
`--lateness_windows sessions` too, in the same sessions allowing that
lateness.

    integration/bench/gbk_spill_memory.py --bin target/release/refract \\
        [--total_mb 5120] [--value_kb 100] [--keys 5000] [--memory_budget 1g] \\
        [--fan_out_inputs 0] [--session_len 0] [--allowed_lateness_s 0] \\
        [--lateness_windows fixed] [--reshuffle]
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
  ap.add_argument('--total_mb', type=int, default=5120)
  ap.add_argument('--value_kb', type=int, default=100)
  ap.add_argument('--keys', type=int, default=5000)
  ap.add_argument('--memory_budget', default='1g')
  ap.add_argument('--fan_out_inputs', type=int, default=0)
  ap.add_argument('--session_len', type=int, default=0)
  ap.add_argument('--reshuffle', action='store_true')
  ap.add_argument(
    '--allowed_lateness_s',
    type=int,
    default=0,
    help='with --session_len: fixed windows allowing this lateness instead of sessions',
  )
  ap.add_argument(
    '--lateness_windows',
    choices=['fixed', 'sessions'],
    default='fixed',
    help='with --allowed_lateness_s: which windows allow it',
  )
  args = ap.parse_args()
  work = tempfile.mkdtemp(prefix='refract-gbk-spill.')
  log = os.path.join(work, 'refract.log')
  # The one job gets the whole budget, as the figures in
  # docs/benchmarks.md were measured.
  server = budget_server(
    args.bin, log, args.memory_budget, ['--spill_dir', os.path.join(work, 'spill')]
  )
  try:
    run, elapsed, samples = run_sampling_rss(
      server.proc.pid,
      [
        sys.executable,
        os.path.join(PY, 'gbk_spill_pipeline.py'),
        server.endpoint,
        str(args.total_mb),
        str(args.value_kb),
        str(args.keys),
        str(args.fan_out_inputs),
        str(args.session_len),
        '1' if args.reshuffle else '0',
        str(args.allowed_lateness_s),
        args.lateness_windows,
      ],
    )
  finally:
    server.stop()
  state = final_state(run)
  with open(log, encoding='utf-8', errors='replace') as f:
    finished = [line for line in f if 'engine finished' in line]

  def logged(what):
    found = re.search(r'\b%s=(\d+)' % what, finished[-1]) if finished else None
    return int(found.group(1)) if found else 0

  spilled = logged('spilled_bytes')
  # Bundle output and queues that waited on disk (not logged before
  # they could).
  output_spilled = logged('output_spilled_bytes') + logged('queue_spilled_bytes')

  def mib(b):
    return b / (1 << 20)

  if os.environ.get('REFRACT_BENCH_RSS_SERIES'):
    print('RSS MiB every 0.5 s:', ' '.join('%.0f' % mib(s) for s in samples))
  source = (
    '%d elements fanned out' % args.fan_out_inputs if args.fan_out_inputs else 'a splittable source'
  )
  if args.reshuffle:
    source += ', reshuffled'
  if args.session_len and args.allowed_lateness_s:
    kind = 'fixed windows' if args.lateness_windows == 'fixed' else 'sessions'
    windows = '%s of %d values, %d s allowed lateness' % (
      kind,
      args.session_len,
      args.allowed_lateness_s,
    )
  elif args.session_len:
    windows = 'sessions of %d values' % args.session_len
  else:
    windows = 'the global window'
  print(
    'GroupByKey of %d MiB (%d KiB values, %d keys, from %s, in %s), '
    '--memory_budget %s: %s in %.1f s; runner peak RSS %.0f MiB; '
    'GroupByKey spilled %.0f MiB, outputs and queues %.0f MiB (log in %s)'
    % (
      args.total_mb,
      args.value_kb,
      args.keys,
      source,
      windows,
      args.memory_budget,
      state,
      elapsed,
      mib(max(samples or [0])),
      mib(spilled),
      mib(output_spilled),
      work,
    )
  )
  return 0 if state == 'DONE' else 1


if __name__ == '__main__':
  sys.exit(main())

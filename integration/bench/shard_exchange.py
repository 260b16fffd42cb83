#!/usr/bin/env python3
"""What the exchange between engine shards costs: one shuffle-heavy Python
pipeline on one engine, on three shards joined in memory (the board), and
on three shards exchanging over gRPC on the loopback interface, in one run
of one server; prints each one's wall time and runner CPU per million
elements, and their ratios to one engine.

    integration/bench/shard_exchange.py --bin BIN [--elements 900000] [--repeats 3]

The pipeline is remote_pools.py's `gbk` workload: N numbers into 10 007
keys, a GroupByKey, a sum per key, one sum in all. With three shards about
two thirds of its elements cross from the shard that made them to the
shard that owns their key, through the exchange. Workers are LOOPBACK (in
the client), so the server's own CPU time (utime + stime from /proc, in
10 ms ticks) is the runner's work: the engine, the Fn API streams and the
exchange.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'python'))
sys.path.insert(0, HERE)

from refract_testlib import RefractServer, free_port  # noqa: E402  # pylint: disable=wrong-import-position
from remote_pools import PIPELINE  # noqa: E402  # pylint: disable=wrong-import-position

TICKS = os.sysconf('SC_CLK_TCK')
CONFIGS = [
  ('one engine', []),
  ('3 shards, board', ['--experiments=refract_shards=3']),
  (
    '3 shards, gRPC',
    ['--experiments=refract_shards=3', '--experiments=refract_shard_exchange=grpc'],
  ),
]


def own_cpu_seconds(pid):
  """User + system CPU of `pid` itself."""
  with open('/proc/%d/stat' % pid) as f:
    fields = f.read().rsplit(')', 1)[1].split()
  return sum(int(x) for x in fields[11:13]) / TICKS


def one_job(server, work, elements, experiments):
  """Runs the pipeline once; (wall s from run() to DONE, runner CPU s)."""
  out = os.path.join(work, 'out-%d' % len(os.listdir(work)))
  before = own_cpu_seconds(server.proc.pid)
  done = subprocess.run(
    [sys.executable, '-c', PIPELINE, 'gbk', str(elements), out]
    + server.portable_args('--experiments=disable_logging_submission_environment', *experiments),
    capture_output=True,
    text=True,
    timeout=1800,
    check=False,
  )
  after = own_cpu_seconds(server.proc.pid)
  line = [x for x in done.stdout.splitlines() if x.startswith('BENCH_JOB_SECONDS')]
  if done.returncode != 0 or not line or not line[0].endswith('DONE'):
    sys.exit('the job failed:\n%s\n%s' % (done.stdout[-2000:], done.stderr[-4000:]))
  want = sum(range(elements))
  with open(out) as f:
    got = int(f.read().strip())
  if got != want:
    sys.exit('wrong sum: %d, not %d' % (got, want))
  return float(line[0].split()[1]), after - before


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--bin', required=True)
  parser.add_argument('--elements', type=int, default=900_000)
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory(prefix='refract-exchange-bench-') as work:
    server = RefractServer(
      args.bin,
      os.path.join(work, 'refract.log'),
      port=free_port(),
      extra_args=['--serve_http=false'],
    ).wait_ready()
    try:
      one_job(server, work, 10_000, [])  # warm the client and server
      samples = {name: [] for name, _ in CONFIGS}
      # Interleaved, so that drift on the machine falls on every config.
      for _ in range(args.repeats):
        for name, experiments in CONFIGS:
          samples[name].append(one_job(server, work, args.elements, experiments))
    finally:
      server.stop()
  print(
    '%s, %d elements, medians of %d, %s'
    % (datetime.now().strftime('%Y-%m-%d'), args.elements, args.repeats, os.uname().nodename)
  )
  print(
    '| config | wall s | runner CPU s | runner CPU s per 1M | wall / one engine '
    '| CPU / one engine |'
  )
  print('|---|---|---|---|---|---|')
  base_wall = statistics.median(s[0] for s in samples['one engine'])
  base_cpu = statistics.median(s[1] for s in samples['one engine'])
  for name, _ in CONFIGS:
    wall = statistics.median(s[0] for s in samples[name])
    cpu = statistics.median(s[1] for s in samples[name])
    print(
      '| %s | %.2f | %.2f | %.2f | %.2f | %.2f |'
      % (name, wall, cpu, cpu / args.elements * 1e6, wall / base_wall, cpu / max(base_cpu, 0.01))
    )


if __name__ == '__main__':
  main()

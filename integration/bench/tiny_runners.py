#!/usr/bin/env python3
"""Tiny jobs on the runners a Python process starts for itself.

    integration/bench/tiny_runners.py --refract BIN [--jobs N]

Runs N x Create([1, 2, 3]) | Map | GroupBy | Count.Globally back to back in
one fresh interpreter per runner, and prints the p50 and p95 of each job's
Pipeline.run() until wait_until_finish() returns (the first two jobs, which
start the server, left out) and the ratio to Beam's in-process FnApiRunner,
what `DirectRunner` runs batch pipelines on:

  FnApiRunner            --runner=DirectRunner (in process: the reference)
  PrismRunner path       --runner=PrismRunner --prism_location=BIN (Beam's
                         SDK starts refract as it would Prism; LOOPBACK)
  RefractRunner LOOPBACK refract_beam (integration/wheel) with LOOPBACK
                         workers, as `pytest --refract` runs TestPipelines
  RefractRunner          refract_beam's defaults: worker processes, one per
                         core, forked for every job from a process that
                         imported Beam once

Test suites run many such jobs: this is their per-test cost.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, '..', 'wheel', 'python')

CLIENT = r'''
import json, sys, time
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
n = int(sys.argv[1])
seconds = []
for _ in range(n):
  p = beam.Pipeline(options=PipelineOptions(sys.argv[2:]))
  _ = (p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 2)
       | beam.GroupBy(lambda x: x % 2) | beam.combiners.Count.Globally())
  start = time.perf_counter()
  state = p.run().wait_until_finish()
  seconds.append(time.perf_counter() - start)
  assert 'DONE' in str(state), state
print('TINY ' + json.dumps(seconds))
'''


def runners(binary):
  refract = ['--runner=refract_beam.RefractRunner', '--refract_location=' + binary]
  return [
    ('FnApiRunner', ['--runner=DirectRunner']),
    ('PrismRunner path', ['--runner=PrismRunner', '--prism_location=' + binary]),
    ('RefractRunner LOOPBACK', refract + ['--environment_type=LOOPBACK']),
    ('RefractRunner', refract),
  ]


def measure(flags, jobs):
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(p for p in (PACKAGE, env.get('PYTHONPATH')) if p)
  done = subprocess.run(
    [sys.executable, '-c', CLIENT, str(jobs + 2), *flags],
    capture_output=True,
    text=True,
    env=env,
    timeout=1800,
  )
  lines = [line for line in done.stdout.splitlines() if line.startswith('TINY ')]
  if done.returncode != 0 or not lines:
    raise SystemExit('%s failed:\n%s' % (' '.join(flags), done.stderr[-3000:]))
  seconds = sorted(json.loads(lines[-1][5:])[2:])
  p95 = seconds[max(0, int(round(0.95 * len(seconds))) - 1)]
  return statistics.median(seconds) * 1000, p95 * 1000


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--refract', required=True, help='refract binary')
  ap.add_argument('--jobs', type=int, default=20)
  args = ap.parse_args()
  binary = os.path.abspath(args.refract)
  results = []
  for name, flags in runners(binary):
    p50, p95 = measure(flags, args.jobs)
    results.append((name, p50, p95))
    print('tiny: %-22s p50 %6.0f ms  p95 %6.0f ms' % (name, p50, p95), file=sys.stderr)
  reference = results[0][1]
  print('| runner | p50 ms | p95 ms | p50 / FnApiRunner |')
  print('|---|---|---|---|')
  for name, p50, p95 in results:
    print('| %s | %.0f | %.0f | %.2fx |' % (name, p50, p95, p50 / reference))


if __name__ == '__main__':
  main()

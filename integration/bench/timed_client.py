"""Runs a Beam client (a module with -m, or a script) and reports how long
its pipeline(s) took from Pipeline.run() until wait_until_finish() returned,
i.e. submission + execution on the runner, without the Python interpreter's
start-up, imports and pipeline construction, which are the same for every
runner and would only dilute the comparison.

  python timed_client.py -m apache_beam.testing.load_tests.pardo_test ARGS...
  python timed_client.py path/to/script.py ARGS...
  refract run timed_client.py path/to/script.py ARGS...
  [refract run] python timed_client.py --load_test=pardo_test ARGS...

The last form runs the load test `apache_beam.testing.load_tests.pardo_test`
with every other argument, wherever it stands, handed to it in the one
--test-pipeline-options string the load tests read: so `refract run`, which
adds its options before the script's, can run them too.

Prints "BENCH_JOB_SECONDS <float>" (summed over the pipelines run),
"BENCH_JOB_CPU_SECONDS <float>" (this process's CPU time over the same
spans: with LOOPBACK thread workers, the SDK's work) and
"BENCH_CLIENT_CPU_SECONDS <float>" (this process's CPU time from its start,
imports included) at exit, on stdout.
"""

import atexit
import runpy
import shlex
import sys
import time

from apache_beam import pipeline as _pipeline
from apache_beam.runners.portability import portable_runner as _portable

_started = []
_total = [0.0]
_cpu_total = [0.0]

_orig_run = _pipeline.Pipeline.run
_orig_wait = _portable.PipelineResult.wait_until_finish


def _run(self, *args, **kwargs):
  # Pipeline.run re-enters itself (run -> run with the proto round trip);
  # only the outermost call starts the clock.
  if not _started:
    _started.append((time.perf_counter(), time.process_time()))
  return _orig_run(self, *args, **kwargs)


def _wait(self, *args, **kwargs):
  try:
    return _orig_wait(self, *args, **kwargs)
  finally:
    if _started:
      wall, cpu = _started.pop()
      _total[0] += time.perf_counter() - wall
      _cpu_total[0] += time.process_time() - cpu


_pipeline.Pipeline.run = _run
_portable.PipelineResult.wait_until_finish = _wait


@atexit.register
def _report():
  sys.stdout.write('BENCH_JOB_SECONDS %.6f\n' % _total[0])
  sys.stdout.write('BENCH_JOB_CPU_SECONDS %.6f\n' % _cpu_total[0])
  sys.stdout.write('BENCH_CLIENT_CPU_SECONDS %.6f\n' % time.process_time())
  sys.stdout.flush()


LOAD_TEST_FLAG = '--load_test='


def main():
  args = sys.argv[1:]
  load_tests = [a[len(LOAD_TEST_FLAG) :] for a in args if a.startswith(LOAD_TEST_FLAG)]
  if load_tests:
    module = 'apache_beam.testing.load_tests.' + load_tests[-1]
    options = [a for a in args if not a.startswith(LOAD_TEST_FLAG)]
    sys.argv = [module, '--test-pipeline-options=' + shlex.join(options)]
    runpy.run_module(module, run_name='__main__', alter_sys=True)
  elif args and args[0] == '-m':
    module = args[1]
    sys.argv = [module] + args[2:]
    runpy.run_module(module, run_name='__main__', alter_sys=True)
  else:
    # `refract run timed_client.py SCRIPT ...` puts its own options before
    # the script: they go after it.
    script = next((i for i, a in enumerate(args) if not a.startswith('--')), None)
    if script is None:
      sys.exit('timed_client.py: no script to run in %s' % args)
    sys.argv = [args[script]] + args[:script] + args[script + 1 :]
    runpy.run_path(args[script], run_name='__main__')


if __name__ == '__main__':
  main()

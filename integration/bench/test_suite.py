#!/usr/bin/env python3
"""A user's suite of small TestPipelines under pytest, on every runner a
Beam Python user could pick for it, in one run.

    integration/bench/test_suite.py --refract BIN [--prism BIN] [--tests N]
                                    [--only RUNNER ...]

Writes a pytest module of N small TestPipeline tests (Create, Map,
GroupByKey, CombinePerKey, side inputs, Flatten, tagged outputs, windowed
sums; each with assert_that, as users write them) and runs it with
pytest once per runner:

  DirectRunner           --test-pipeline-options=--runner=DirectRunner
  Prism                  Beam's PrismRunner starting Beam's own Prism (--prism)
  Python job server      PortableRunner, LOOPBACK, against Beam's
                         local_job_service_main started before the suite
  refract serve          PortableRunner, LOOPBACK, against `refract serve`
                         started before the suite (a warm server)
  PrismRunner path       --runner=PrismRunner --prism_location=BIN
  pytest --refract       the refract_beam plugin (integration/wheel), in its
                         default strict mode
  pytest --refract --refract-no-strict  the same without strict mode
  pytest --refract, refract_strict=coders  strict mode with its coder check

It prints, per runner, the whole pytest run's wall time, the median of the
tests' own times (setup, call and teardown, from pytest's junit report) and
that median's ratio to DirectRunner's. The suite runs twice per runner and
the faster run counts, so a cold page cache does not decide.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, '..', 'wheel', 'python')
sys.path.insert(0, os.path.join(HERE, '..', 'python'))

from refract_testlib import free_port, python_job_server_argv, wait_for_port  # noqa: E402  # pylint: disable=wrong-import-position

SUITE = textwrap.dedent('''\
    import apache_beam as beam
    import pytest
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that
    from apache_beam.testing.util import equal_to
    from apache_beam.transforms import window

    REPEAT = list(range(%(repeat)d))


    @pytest.mark.parametrize('n', REPEAT)
    def test_map(n):
      with TestPipeline() as p:
        assert_that(p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 2),
                    equal_to([2, 4, 6]))


    @pytest.mark.parametrize('n', REPEAT)
    def test_group_by_key(n):
      with TestPipeline() as p:
        grouped = (p | beam.Create([('a', 1), ('b', 2), ('a', 3)])
                   | beam.GroupByKey()
                   | beam.MapTuple(lambda k, vs: (k, sorted(vs))))
        assert_that(grouped, equal_to([('a', [1, 3]), ('b', [2])]))


    @pytest.mark.parametrize('n', REPEAT)
    def test_combine_per_key(n):
      with TestPipeline() as p:
        sums = p | beam.Create([('a', 1), ('b', 2), ('a', 3)]) | beam.CombinePerKey(sum)
        assert_that(sums, equal_to([('a', 4), ('b', 2)]))


    @pytest.mark.parametrize('n', REPEAT)
    def test_side_input(n):
      with TestPipeline() as p:
        side = p | 'Side' >> beam.Create([10])
        out = (p | 'Main' >> beam.Create([1, 2])
               | beam.Map(lambda x, s: x + s, beam.pvalue.AsSingleton(side)))
        assert_that(out, equal_to([11, 12]))


    @pytest.mark.parametrize('n', REPEAT)
    def test_flatten(n):
      with TestPipeline() as p:
        a = p | 'A' >> beam.Create([1, 2])
        b = p | 'B' >> beam.Create([3])
        assert_that((a, b) | beam.Flatten(), equal_to([1, 2, 3]))


    @pytest.mark.parametrize('n', REPEAT)
    def test_tagged_outputs(n):
      def split(x):
        if x %% 2:
          yield beam.pvalue.TaggedOutput('odd', x)
        else:
          yield x

      with TestPipeline() as p:
        outs = (p | beam.Create([1, 2, 3, 4])
                | beam.FlatMap(split).with_outputs('odd', main='even'))
        assert_that(outs.even, equal_to([2, 4]), label='Even')
        assert_that(outs.odd, equal_to([1, 3]), label='Odd')


    @pytest.mark.parametrize('n', REPEAT)
    def test_windowed_sums(n):
      with TestPipeline() as p:
        sums = (p | beam.Create([1, 2, 11])
                | beam.Map(lambda t: window.TimestampedValue(('k', t), t))
                | beam.WindowInto(window.FixedWindows(10))
                | beam.CombinePerKey(sum)
                | beam.MapTuple(lambda k, v: v))
        assert_that(sums, equal_to([3, 11]))
''')

#: A user project's conftest, as Beam's own: TestPipelines take the
#: options of `--test-pipeline-options`.
CONFTEST = textwrap.dedent('''\
    from apache_beam.testing.test_pipeline import TestPipeline


    def pytest_addoption(parser):
      parser.addoption('--test-pipeline-options', default=None)


    def pytest_configure(config):
      TestPipeline.pytest_test_pipeline_options = config.getoption(
          'test_pipeline_options')
''')

#: Tests per repetition of the module above.
TESTS_PER_REPEAT = 7


class Server:
  """A job server started before a suite, stopped after it."""

  def __init__(self, cmd, port, what):
    self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port, self.proc, what)

  def stop(self):
    self.proc.terminate()
    try:
      self.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      self.proc.kill()


def configurations(refract, prism):
  """(name, pytest flags, server command or None, its port)."""
  loopback = '--environment_type=LOOPBACK'
  configs = [('DirectRunner', ['--test-pipeline-options=--runner=DirectRunner'], None, None)]
  if prism:
    configs.append(
      (
        'Prism',
        ['--test-pipeline-options=--runner=PrismRunner --prism_location=%s' % prism],
        None,
        None,
      )
    )
  port = free_port()
  configs.append(
    (
      'Python job server',
      [
        '--test-pipeline-options=--runner=PortableRunner '
        '--job_endpoint=localhost:%d %s' % (port, loopback)
      ],
      python_job_server_argv(port),
      port,
    )
  )
  port = free_port()
  configs.append(
    (
      'refract serve',
      [
        '--test-pipeline-options=--runner=PortableRunner '
        '--job_endpoint=localhost:%d %s' % (port, loopback)
      ],
      [refract, 'serve', '--job_port', str(port), '--serve_http=false'],
      port,
    )
  )
  configs.append(
    (
      'PrismRunner path',
      ['--test-pipeline-options=--runner=PrismRunner --prism_location=%s' % refract],
      None,
      None,
    )
  )
  configs.append(('pytest --refract', ['--refract'], None, None))
  configs.append(
    ('pytest --refract --refract-no-strict', ['--refract', '--refract-no-strict'], None, None)
  )
  configs.append(
    (
      'pytest --refract, refract_strict=coders',
      ['--refract', '--test-pipeline-options=--experiments=refract_strict=coders'],
      None,
      None,
    )
  )
  return configs


def run_suite(directory, flags, refract):
  """Runs the suite once: (wall seconds, per-test seconds)."""
  report = os.path.join(directory, 'junit.xml')
  env = dict(os.environ, REFRACT_BIN=refract)
  env['PYTHONPATH'] = os.pathsep.join(p for p in (PACKAGE, env.get('PYTHONPATH')) if p)
  start = time.perf_counter()
  done = subprocess.run(
    [
      sys.executable,
      '-m',
      'pytest',
      '-q',
      '-p',
      'no:cacheprovider',
      '-p',
      'refract_beam.pytest_plugin',
      '--junitxml',
      report,
      os.path.join(directory, 'test_small_pipelines.py'),
      *flags,
    ],
    capture_output=True,
    text=True,
    env=env,
    cwd=directory,
    timeout=3600,
    check=False,
  )
  wall = time.perf_counter() - start
  if done.returncode != 0:
    raise SystemExit('suite failed with %s:\n%s' % (' '.join(flags), done.stdout[-4000:]))
  cases = ET.parse(report).getroot().iter('testcase')
  return wall, [float(c.get('time')) for c in cases]


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--refract', required=True, help='refract binary')
  ap.add_argument('--prism', help="Beam's Prism binary (else not measured)")
  ap.add_argument(
    '--tests', type=int, default=35, help='tests in the suite (a multiple of %d)' % TESTS_PER_REPEAT
  )
  ap.add_argument(
    '--only',
    action='append',
    metavar='RUNNER',
    help='measure only this runner (its name as printed; '
    'repeatable); ratios are to the first one measured',
  )
  args = ap.parse_args()
  refract = os.path.abspath(args.refract)
  repeat = max(1, args.tests // TESTS_PER_REPEAT)
  results = []
  with tempfile.TemporaryDirectory(prefix='refract-suite-bench-') as directory:
    with open(os.path.join(directory, 'test_small_pipelines.py'), 'w') as f:
      f.write(SUITE % {'repeat': repeat})
    with open(os.path.join(directory, 'conftest.py'), 'w') as f:
      f.write(CONFTEST)
    for name, flags, server_cmd, port in configurations(refract, args.prism):
      if args.only and name not in args.only:
        continue
      server = Server(server_cmd, port, name) if server_cmd else None
      try:
        runs = [run_suite(directory, flags, refract) for _ in range(2)]
      finally:
        if server:
          server.stop()
      wall, times = min(runs, key=lambda r: r[0])
      median = statistics.median(times)
      results.append((name, len(times), wall, median))
      print(
        'suite: %-38s %d tests  wall %6.1f s  median %5.0f ms/test'
        % (name, len(times), wall, median * 1000),
        file=sys.stderr,
      )
  if not results:
    raise SystemExit('no runner measured: see --only')
  reference = results[0][3]
  print('| runner | tests | suite wall s | median ms per test | per test / DirectRunner |')
  print('|---|---:|---:|---:|---:|')
  for name, count, wall, median in results:
    print(
      '| %s | %d | %.1f | %.0f | %.2fx |' % (name, count, wall, median * 1000, median / reference)
    )


if __name__ == '__main__':
  main()

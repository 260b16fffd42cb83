#!/usr/bin/env python3
"""Beam's own TestPipeline test modules for core transforms, shipped in the
apache-beam wheel, run against Refract and against Beam's runners in one
run: how a user's `TestPipeline` suite fares on each.

    integration/beam_test_modules.py --refract BIN [--module M ...] [-k EXPR]

Each module runs under pytest once per runner, every TestPipeline in it
taking the runner from `--test-pipeline-options` (as Beam's own CI passes
it):

  DirectRunner        --runner=DirectRunner (Beam's default for tests)
  Python job server   PortableRunner, LOOPBACK, against Beam's
                      local_job_service_main started for the module
  refract serve       PortableRunner, LOOPBACK, against `refract serve`
                      started for the module
  pytest --refract    the refract-beam plugin (integration/wheel): every
                      TestPipeline on RefractRunner, LOOPBACK workers

Tests that build `beam.Pipeline()` or pass `options=` run on the
DirectRunner whatever the flag says, on every row alike.

It prints, per module and runner, passed / failed / skipped and the wall
time, then every test whose outcome on a Refract row differs from the
DirectRunner's or the Python job server's, with the first line of its
failure. Exits non-zero if a Refract row passes fewer tests than either
Beam row.
"""

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, 'python'))

from refract_testlib import free_port, python_job_server_argv, wait_for_port  # noqa: E402  # pylint: disable=wrong-import-position

SUITE_PLUGIN_DIR = os.path.join(HERE, 'beam_suite')
PACKAGE = os.path.join(HERE, 'wheel', 'python')

#: The modules run by default: Beam's tests of its core transforms that
#: build their pipelines with TestPipeline (ParDo, Flatten, GroupByKey,
#: CoGroupByKey, Combine and its combiners, windowing, user state and
#: timers, side inputs, the transforms of transforms/util.py).
MODULES = [
  'apache_beam/transforms/ptransform_test.py',
  'apache_beam/transforms/combiners_test.py',
  'apache_beam/transforms/util_test.py',
  'apache_beam/transforms/window_test.py',
  'apache_beam/transforms/userstate_test.py',
  'apache_beam/transforms/sideinputs_test.py',
  'apache_beam/transforms/core_test.py',
  'apache_beam/transforms/deduplicate_test.py',
]


def start_server(cmd, port, log):
  proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
  wait_for_port(port, proc, '%s (log %s)' % (cmd[0], log.name))
  return proc


def runners(refract):
  """(name, is Refract, server command maker or None, pytest flags maker)."""
  loopback = '--environment_type=LOOPBACK'

  def portable(port):
    return [
      '--test-pipeline-options=--runner=PortableRunner '
      '--job_endpoint=localhost:%d %s' % (port, loopback)
    ]

  return [
    ('DirectRunner', False, None, lambda _: ['--test-pipeline-options=--runner=DirectRunner']),
    (
      'Python job server',
      False,
      python_job_server_argv,
      portable,
    ),
    (
      'refract serve',
      True,
      lambda port: [refract, 'serve', '--job_port', str(port), '--serve_http=false'],
      portable,
    ),
    (
      'pytest --refract',
      True,
      None,
      lambda _: [
        '--refract',
        '-p',
        'refract_beam.pytest_plugin',
        '--test-pipeline-options=--runner=DirectRunner',
      ],
    ),
  ]


def outcomes(report):
  """{test id: (outcome, first line of the failure)} from a junit file."""
  found = {}
  for case in ET.parse(report).getroot().iter('testcase'):
    test_id = '%s::%s' % (case.get('classname'), case.get('name'))
    outcome, detail = 'passed', ''
    for child in case:
      if child.tag in ('failure', 'error'):
        outcome = 'failed'
        detail = (child.get('message') or '').strip().splitlines()[:1]
        detail = detail[0][:200] if detail else ''
      elif child.tag == 'skipped':
        outcome = 'skipped'
    found[test_id] = (outcome, detail)
  return found


def run_module(module, site, refract, name, server, flags, work, timeout, extra):
  report = os.path.join(work, 'junit.xml')
  if os.path.exists(report):
    os.remove(report)
  proc = None
  log = open(os.path.join(work, 'server.log'), 'w')
  port = free_port()
  if server:
    proc = start_server(server(port), port, log)
  env = dict(os.environ, REFRACT_BIN=refract)
  env['PYTHONPATH'] = os.pathsep.join(
    p for p in (SUITE_PLUGIN_DIR, PACKAGE, env.get('PYTHONPATH')) if p
  )
  start = time.time()
  try:
    subprocess.run(
      [
        sys.executable,
        '-m',
        'pytest',
        '-p',
        'refract_beam_plugin',
        '-p',
        'no:cacheprovider',
        '-c',
        os.path.join(SUITE_PLUGIN_DIR, 'pytest.ini'),
        '--rootdir',
        site,
        os.path.join(site, module),
        '--timeout',
        str(timeout),
        '--timeout-method=signal',
        '-q',
        '--disable-warnings',
        '-p',
        'no:randomly',
        '--junitxml',
        report,
        *flags(port),
        *extra,
      ],
      cwd=site,
      env=env,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
      timeout=7200,
      check=False,
    )
  finally:
    if proc:
      proc.terminate()
      try:
        proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
  wall = time.time() - start
  if not os.path.exists(report):
    raise SystemExit('%s on %s wrote no report' % (module, name))
  return wall, outcomes(report)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--refract', required=True, help='refract binary')
  ap.add_argument(
    '--module',
    action='append',
    help='a test module, relative to site-packages (repeatable; '
    'default: the core-transform modules)',
  )
  ap.add_argument('--timeout', type=int, default=300, help='seconds per test')
  ap.add_argument('-k', dest='keyword', help="pytest's -k expression")
  args = ap.parse_args()
  refract = os.path.abspath(args.refract)
  import apache_beam

  site = os.path.dirname(os.path.dirname(apache_beam.__file__))
  extra = ['-k', args.keyword] if args.keyword else []
  modules = args.module or MODULES
  table = []
  totals = collections.defaultdict(lambda: collections.Counter())
  differences = []
  with tempfile.TemporaryDirectory(prefix='refract-beam-modules-') as work:
    for module in modules:
      results = {}
      for name, _, server, flags in runners(refract):
        wall, found = run_module(
          module, site, refract, name, server, flags, work, args.timeout, extra
        )
        counts = collections.Counter(o for o, _ in found.values())
        counts['seconds'] = wall
        totals[name].update(counts)
        results[name] = found
        table.append((module, name, counts))
        print(
          '%s  %-18s passed %4d  failed %3d  skipped %3d  %5.0f s'
          % (module, name, counts['passed'], counts['failed'], counts['skipped'], wall),
          file=sys.stderr,
          flush=True,
        )
      for name, is_refract, _, _ in runners(refract):
        if not is_refract:
          continue
        for test_id, (outcome, detail) in sorted(results[name].items()):
          others = {
            ref: results[ref].get(test_id, ('missing', ''))[0]
            for ref in ('DirectRunner', 'Python job server')
          }
          if any(o != outcome for o in others.values()):
            differences.append((name, test_id, outcome, others, detail))

  names = [name for name, _, _, _ in runners(refract)]
  print('| module | ' + ' | '.join(names) + ' |')
  print('|---|' + '---:|' * len(names))
  by_module = collections.OrderedDict()
  for module, name, counts in table:
    by_module.setdefault(module, {})[name] = counts
  for module, row in list(by_module.items()) + [('**all**', totals)]:
    cells = [
      '%d / %d / %d, %.0f s' % (c['passed'], c['failed'], c['skipped'], c['seconds'])
      for c in (row[name] for name in names)
    ]
    print('| %s | %s |' % (os.path.basename(module), ' | '.join(cells)))
  print('\n(passed / failed / skipped, wall time)')
  if differences:
    print('\nOutcomes on a Refract row that differ from a Beam row:')
    for name, test_id, outcome, others, detail in differences:
      print(
        '- %s: %s %s (DirectRunner %s, Python job server %s) %s'
        % (name, test_id, outcome, others['DirectRunner'], others['Python job server'], detail)
      )
  best_beam = max(totals['DirectRunner']['passed'], totals['Python job server']['passed'])
  refract_rows = [name for name, is_refract, _, _ in runners(refract) if is_refract]
  short = [n for n in refract_rows if totals[n]['passed'] < best_beam]
  if short:
    print('\nfewer tests pass on %s than on a Beam runner' % ', '.join(short))
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())

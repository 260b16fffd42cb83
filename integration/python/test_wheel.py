"""The refract-beam wheel as a Beam Python user meets it: installed into a
fresh virtualenv that has apache-beam, with no refract on PATH and no
server started by hand.

* `--runner=refract_beam.RefractRunner` starts the packaged binary once per
  process, runs the pipeline's code in worker processes that see the
  submitting process's sys.path, skips the submission `pip freeze`, and
  prints the web UI's address once;
* a pipeline that needs its main session in the workers still works;
* `pytest --refract` moves a suite's TestPipelines onto Refract;
* an apache-beam older than Refract supports is refused, naming the
  range; a newer one runs, with a one-line warning;
* the apache-beam that pip picks for the wheel from the package index is
  one its binary runs.

The wheel is $REFRACT_WHEEL (integration/test.sh builds it), else built
here with integration/build-wheel.sh.
"""

import glob
import json
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_WHEEL = os.path.join(HERE, '..', 'build-wheel.sh')


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
  given = os.environ.get('REFRACT_WHEEL')
  if given:
    return given
  dist = tmp_path_factory.mktemp('dist')
  built = subprocess.run(
    [BUILD_WHEEL],
    env=dict(os.environ, REFRACT_DIST=str(dist)),
    capture_output=True,
    text=True,
    timeout=1200,
    check=False,
  )
  assert built.returncode == 0, built.stderr[-3000:]
  return built.stdout.strip().splitlines()[-1]


@pytest.fixture(scope='module')
def venv(tmp_path_factory, wheel):
  """A new virtualenv whose apache-beam (and pytest) are this test
  environment's, found through a .pth file instead of installed again,
  with the wheel pip-installed into it; its python."""
  root = tmp_path_factory.mktemp('venv')
  subprocess.run([sys.executable, '-m', 'venv', str(root)], check=True, timeout=120)
  python = str(root / 'bin' / 'python')
  site = subprocess.run(
    [python, '-c', 'import sysconfig; print(sysconfig.get_path("purelib"))'],
    check=True,
    capture_output=True,
    text=True,
  ).stdout.strip()
  with open(os.path.join(site, 'refract-test-beam.pth'), 'w') as f:
    f.write(sysconfig.get_path('purelib') + '\n')
  # No index: apache-beam is found installed, nothing is downloaded.
  installed = subprocess.run(
    [python, '-m', 'pip', 'install', '--no-index', '--disable-pip-version-check', '-q', wheel],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert installed.returncode == 0, installed.stderr[-3000:]
  return python


def user_env():
  """The environment of a user who never built Refract: no REFRACT_BIN, no
  refract on PATH."""
  env = {k: v for k, v in os.environ.items() if not k.startswith('REFRACT_') and k != 'PYTHONPATH'}
  env['PATH'] = '/usr/local/bin:/usr/bin:/bin'
  return env


def run_script(python, path, *args, env=None, timeout=240):
  return subprocess.run(
    [python, str(path), *map(str, args)],
    capture_output=True,
    text=True,
    timeout=timeout,
    cwd=os.path.dirname(str(path)),
    env=env or user_env(),
  )


def read_lines(prefix):
  lines = []
  for name in sorted(glob.glob(str(prefix) + '*')):
    with open(name) as f:
      lines.extend(line.rstrip('\n') for line in f)
  return lines


def test_refract_runner_runs_pipelines_in_worker_processes(venv, tmp_path):
  # A module the pipeline imports from a directory it adds to sys.path at
  # run time (as a conftest or a notebook does): its functions are pickled
  # by reference, so the workers must find it too.
  helpers = tmp_path / 'helpers'
  helpers.mkdir()
  (helpers / 'shout.py').write_text(
    textwrap.dedent('''\
      import os

      def shout(word):
        # Its worker's pid, and whether the fork server is its parent.
        with open('/proc/%d/cmdline' % os.getppid(), 'rb') as f:
          parent = f.read().split(b'\\0')
        how = 'forked' if b'serve' in parent else 'booted'
        return '%s %d %s' % (word.upper(), os.getpid(), how)
      ''')
  )
  script = tmp_path / 'pipeline.py'
  script.write_text(
    textwrap.dedent('''\
      import logging
      import os
      import sys

      sys.path.insert(0, sys.argv[1])
      import shout

      logging.basicConfig(level=logging.INFO)

      import apache_beam as beam
      from apache_beam.options.pipeline_options import PipelineOptions
      from apache_beam.runners.portability import stager
      from refract_beam import _binary

      # Counts the SDK's `pip freeze` of the submission environment.
      freezes = []
      freeze = stager.Stager._create_stage_submission_env_dependencies
      stager.Stager._create_stage_submission_env_dependencies = staticmethod(
          lambda *args: freezes.append(1) or freeze(*args))


      def run(out):
        options = PipelineOptions(['--runner=refract_beam.RefractRunner'])
        with beam.Pipeline(options=options) as p:
          _ = (
              p | beam.Create(['a', 'b', 'c'] * 200)
              | beam.Reshuffle()
              | beam.Map(shout.shout)
              | beam.io.WriteToText(out))


      run(sys.argv[2])
      run(sys.argv[3])
      print('BINARY', _binary.find())
      print('CLIENT', os.getpid())
      print('FREEZES', len(freezes))
      ''')
  )
  done = run_script(venv, script, helpers, tmp_path / 'one', tmp_path / 'two')
  assert done.returncode == 0, done.stderr[-4000:]
  out = dict(line.split(' ', 1) for line in done.stdout.splitlines() if ' ' in line)
  # The packaged binary, not one from PATH or the build tree.
  assert out['BINARY'] == os.path.join(os.path.dirname(venv), 'refract'), out
  assert out['FREEZES'] == '0', out
  # One server for both pipelines: its address printed once.
  assert done.stderr.count('its web UI is at http://127.0.0.1:') == 1, done.stderr[-4000:]
  # The server's JSON log lines come back as records under `refract`.
  assert 'INFO:refract:refract is serving (' in done.stderr, done.stderr[-4000:]
  raw = [line for line in done.stderr.splitlines() if ':{"time"' in line]
  assert not raw, raw[:3]
  # Nothing refused on the way: a normal submission logs no refusal.
  assert 'rejected job service request' not in done.stderr, done.stderr[-4000:]
  # Forked workers name themselves on their log channel (which the runner
  # refuses without an id; the harness then says so on its stderr, which
  # comes back here as the server's lines).
  assert 'Logging client failed' not in done.stderr, done.stderr[-4000:]
  for prefix in ('one', 'two'):
    lines = read_lines(tmp_path / prefix)
    words = sorted(line.split()[0] for line in lines)
    assert words == sorted(['A', 'B', 'C'] * 200), lines[:5]
    pids = {int(line.split()[1]) for line in lines}
    assert int(out['CLIENT']) not in pids, 'ran in the submitting process'
    assert {line.split()[2] for line in lines} == {'forked'}, lines[:5]


def test_a_pipeline_that_needs_its_main_session_runs(venv, tmp_path):
  script = tmp_path / 'main_session.py'
  script.write_text(
    textwrap.dedent('''\
      import sys
      import re as pattern_module

      import apache_beam as beam
      from apache_beam.options.pipeline_options import PipelineOptions

      SUFFIX = '!'


      class Tag(beam.DoFn):
        def process(self, word):
          # Names from the main session: gone in a worker without it.
          yield pattern_module.sub('a', 'A', word) + SUFFIX


      options = PipelineOptions([
          '--runner=refract_beam.RefractRunner', '--pickle_library=dill',
          '--save_main_session'
      ])
      with beam.Pipeline(options=options) as p:
        _ = (
            p | beam.Create(['abc', 'bca']) | beam.ParDo(Tag())
            | beam.io.WriteToText(sys.argv[1]))
      ''')
  )
  done = run_script(venv, script, tmp_path / 'out')
  assert done.returncode == 0, done.stderr[-4000:]
  assert sorted(read_lines(tmp_path / 'out')) == ['Abc!', 'bcA!']


def test_pytest_refract_moves_test_pipelines_onto_refract(venv, tmp_path):
  suite = tmp_path / 'suite'
  suite.mkdir()
  (suite / 'test_doubling.py').write_text(
    textwrap.dedent('''\
      import os

      import apache_beam as beam
      from apache_beam.testing.test_pipeline import TestPipeline
      from apache_beam.testing.util import assert_that
      from apache_beam.testing.util import equal_to


      def test_doubles():
        with TestPipeline() as p:
          assert type(p.runner).__name__ == os.environ['EXPECTED_RUNNER']
          assert_that(
              p | beam.Create([1, 2, 3]) | beam.Map(lambda x: 2 * x),
              equal_to([2, 4, 6]))
      ''')
  )

  # As Beam's own conftest does: options for every TestPipeline, here
  # naming another runner, which --refract replaces.
  (suite / 'conftest.py').write_text(
    textwrap.dedent('''\
      from apache_beam.testing.test_pipeline import TestPipeline


      def pytest_configure(config):
        TestPipeline.pytest_test_pipeline_options = '--runner=DirectRunner'
      ''')
  )

  def pytest_run(*flags, expected):
    env = dict(user_env(), EXPECTED_RUNNER=expected)
    return subprocess.run(
      [venv, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', *flags],
      capture_output=True,
      text=True,
      timeout=240,
      cwd=str(suite),
      env=env,
    )

  on_refract = pytest_run('--refract', expected='RefractRunner')
  assert on_refract.returncode == 0, on_refract.stdout[-4000:]
  assert '1 passed' in on_refract.stdout, on_refract.stdout[-2000:]
  # Without the flag the plugin does nothing.
  plain = pytest_run(expected='SwitchingDirectRunner')
  assert plain.returncode == 0, plain.stdout[-4000:]


def test_an_older_beam_is_refused_and_a_newer_one_runs_with_a_warning(venv, tmp_path):
  script = tmp_path / 'other_beam.py'
  script.write_text(
    textwrap.dedent('''\
      import sys

      import apache_beam as beam
      from apache_beam.options.pipeline_options import PipelineOptions

      beam.__version__ = sys.argv[1]  # as if another apache-beam were installed
      for _ in range(2):
        with beam.Pipeline(options=PipelineOptions(
            ['--runner=refract_beam.RefractRunner'])) as p:
          _ = p | beam.Create([1]) | beam.Map(lambda x: x)
      print('RAN')
      ''')
  )
  older = run_script(venv, script, '2.50.0')
  assert older.returncode != 0
  assert re.search(
    r'apache-beam 2\.50\.0 is older than this Refract \(.*\) supports: it '
    r'runs apache-beam 2\.\d+ to 2\.\d+',
    older.stderr,
  ), older.stderr[-3000:]
  assert 'RAN' not in older.stdout

  newer = run_script(venv, script, '2.999.0')
  assert newer.returncode == 0, newer.stderr[-3000:]
  assert 'RAN' in newer.stdout
  warned = [line for line in newer.stderr.splitlines() if 'is newer than any' in line]
  # One line, once per process (two pipelines ran).
  assert len(warned) == 1, newer.stderr[-3000:]
  assert re.search(
    r'apache-beam 2\.999\.0 is newer than any Refract \(.*\) was tested '
    r'with \(2\.\d+ to 2\.\d+\); running it anyway',
    warned[0],
  ), warned


def test_the_beam_pip_picks_for_the_wheel_is_one_it_runs(wheel, tmp_path):
  """What a new user's `pip install` of the wheel would install as
  apache-beam, asked of the package index (PyPI) without installing it, is
  a version the wheel's binary runs without refusing."""
  report = tmp_path / 'report.json'
  asked = subprocess.run(
    [
      sys.executable,
      '-m',
      'pip',
      'install',
      '--dry-run',
      '--ignore-installed',
      '--quiet',
      '--disable-pip-version-check',
      '--report',
      str(report),
      wheel,
    ],
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert asked.returncode == 0, asked.stderr[-3000:]
  with open(report) as f:
    picked = {
      item['metadata']['name'].lower(): item['metadata']['version']
      for item in json.load(f)['install']
    }
  beam_version = picked['apache-beam']
  binary = os.path.join(str(tmp_path), 'refract')
  with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith('.data/scripts/refract'))
    with z.open(name) as src, open(binary, 'wb') as dst:
      dst.write(src.read())
  os.chmod(binary, 0o755)
  sys.path.insert(0, os.path.join(HERE, '..', 'wheel', 'python'))
  try:
    from refract_beam import _binary
  finally:
    sys.path.pop(0)
  supported = _binary.supported_python_range(binary)
  # Raises for a version the binary refuses; a newer one only warns.
  _binary.check_beam_version(beam_version, supported, binary)
  assert _binary._minor(beam_version) >= supported[0], (beam_version, supported)

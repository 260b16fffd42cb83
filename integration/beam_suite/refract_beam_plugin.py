"""pytest plugin for running Beam's own runner suites against Refract.

The apache-beam wheel ships its test modules (for example
apache_beam/runners/portability/prism_runner_test.py) but not Beam's root
conftest.py, which is where the `--test-pipeline-options` option is declared.
Without it PrismRunnerTest skips every test. Load this module with
`-p refract_beam_plugin` (its directory on PYTHONPATH) to:

* declare `--test-pipeline-options` and hand it to TestPipeline, as Beam's own
  conftest does;
* watch the runner subprocess that PortableRunnerTest-style classes start
  (`cls._subprocess`): when it has died during a test, or a test hit the
  pytest-timeout limit, record that, kill what is left of the runner and make
  the next test start a fresh one, so one crash or hang costs one test, not
  the rest of the suite;
* report those events in the terminal summary and, through
  refract_session_record.py (whose hooks it shares), as JSON in the file the
  environment variable REFRACT_SUITE_EVENTS names, with how many tests were
  collected (read by summarize.py).
"""

import pytest

import refract_session_record

# Registered as this plugin's own hooks: loading this module is enough
# (pytest finds hooks by name in the plugin module, so these are used).
from refract_session_record import pytest_collection_finish  # noqa: F401  # pylint: disable=unused-import
from refract_session_record import pytest_sessionfinish  # noqa: F401  # pylint: disable=unused-import

_TIMEOUT_MARK = 'from pytest-timeout'
_BEFORE = pytest.StashKey()


class _Health:
  def __init__(self):
    # Dicts: nodeid, kind ('crash' | 'timeout'), detail; written out with
    # the session's record.
    self.events = refract_session_record.EVENTS

  def add(self, item, kind, detail):
    for e in self.events:
      if e['nodeid'] == item.nodeid and e['kind'] == kind:
        return
    self.events.append({'nodeid': item.nodeid, 'kind': kind, 'detail': detail})
    item.user_properties.append(('refract_' + kind, detail))


_health = _Health()


def pytest_addoption(parser):
  try:
    parser.addoption(
      '--test-pipeline-options',
      dest='test_pipeline_options',
      default=None,
      help='Pipeline options for Beam test pipelines, e.g. '
      '"--prism_bin=/path/to/refract --environment_type=LOOPBACK".',
    )
  except ValueError:
    # Already declared (e.g. by Beam's own conftest.py in a source checkout).
    pass


def pytest_configure(config):
  # Mirrors Beam's sdks/python/conftest.py, so the suite behaves as in Beam's
  # own CI.
  from apache_beam.options import pipeline_options
  from apache_beam.testing.test_pipeline import TestPipeline

  TestPipeline.pytest_test_pipeline_options = config.getoption('test_pipeline_options', default='')
  pipeline_options.enable_all_additional_type_checks()


def _runner_process(item):
  cls = getattr(item, 'cls', None)
  if cls is None:
    return None, None
  return cls, getattr(cls, '_subprocess', None)


def _restart_runner_next_time(cls, proc):
  if proc is not None and proc.poll() is None:
    proc.kill()
    try:
      proc.wait(timeout=10)
    except Exception:  # pylint: disable=broad-except
      pass
  # PortableRunnerTest._get_job_endpoint starts a runner when the class has no
  # `_job_endpoint` of its own.
  if '_job_endpoint' in cls.__dict__:
    delattr(cls, '_job_endpoint')


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
  # Remember which runner process was up before the test, so that a runner
  # that died in an earlier test is not blamed on this one.
  _, proc = _runner_process(item)
  item.stash[_BEFORE] = (proc, proc is not None and proc.poll() is None)
  yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  outcome = yield
  report = outcome.get_result()
  if call.when not in ('setup', 'call'):
    return
  cls, proc = _runner_process(item)
  before, was_alive = item.stash.get(_BEFORE, (None, False))
  timed_out = report.failed and _TIMEOUT_MARK in (report.longreprtext or '')
  crashed = proc is not None and proc.poll() is not None and (proc is not before or was_alive)
  if crashed:
    _health.add(
      item, 'crash', 'runner process %s exited with code %s' % (proc.pid, proc.returncode)
    )
  if timed_out:
    lines = [line for line in report.longreprtext.splitlines() if _TIMEOUT_MARK in line]
    _health.add(item, 'timeout', lines[-1].lstrip('E ').strip())
  if (crashed or timed_out) and cls is not None:
    _restart_runner_next_time(cls, proc)


def pytest_terminal_summary(terminalreporter):
  if not _health.events:
    return
  terminalreporter.section('refract runner health')
  for e in _health.events:
    terminalreporter.write_line('%s %s: %s' % (e['kind'].upper(), e['nodeid'], e['detail']))

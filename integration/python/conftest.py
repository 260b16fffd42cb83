"""Fixtures for Refract's Python end-to-end tests.

The binary under test comes from the environment variable REFRACT_BIN
(integration/test.sh sets it to the release build). Each test that asks for
`refract_server` gets its own `refract serve --job_port <free port>` process,
started in a new session so that it and anything it spawns can be ended
together, and the server's log is attached to the report of a failing test.
"""

import os
import sys

import pytest

import xlang_services
from refract_testlib import RefractServer
from refract_testlib import accepts
from refract_testlib import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, 'integration', 'wordcount'))
# integration/java's worker pool (see `worker_pool`).
POOL_MAIN = 'org.refract.examples.ProcessWorkerPool'


@pytest.fixture(scope='session')
def refract_bin():
  path = os.environ.get('REFRACT_BIN')
  if not path:
    pytest.fail(
      'set REFRACT_BIN to the refract binary under test (integration/test.sh does this)',
      pytrace=False,
    )
  path = os.path.abspath(path)
  if not (os.path.isfile(path) and os.access(path, os.X_OK)):
    pytest.fail('REFRACT_BIN=%s is not an executable file' % path, pytrace=False)
  return path


@pytest.fixture
def refract_server(request, refract_bin, tmp_path):
  """A fresh `refract serve --job_port <free port>`, ready to take jobs."""
  server = RefractServer(refract_bin, tmp_path / 'refract-serve.log')
  request.node.refract_processes = [server]
  try:
    server.wait_ready()
    yield server
    exit_code = server.proc.poll()
  finally:
    server.stop()
  if exit_code is not None:
    pytest.fail(
      'refract serve exited with code %s during the test; log:\n%s'
      % (exit_code, server.log_tail()),
      pytrace=False,
    )


@pytest.fixture
def java_classpath():
  """integration/java's classpath, built with Maven when needed."""
  return xlang_services.common_sh('refract_java_classpath')


@pytest.fixture
def worker_pool(tmp_path, java_classpath):
  """A Java worker pool in a process of its own, which outlives the runner
  and the clients that submit to it: ProcessWorkerPool (integration/java),
  which starts each SDK worker as a JVM of its own, as Beam's Java container
  does in worker-pool mode. (Beam's ExternalWorkerService runs them as
  threads sharing one executor, which the first worker to end shuts down:
  it cannot serve a restarted runner.) Yields (address, process)."""
  port = free_port()
  pool = xlang_services.ServiceProcess(
    'Java worker pool',
    ['java', '-Xmx256m', '-cp', java_classpath, POOL_MAIN, port, '512m'],
    tmp_path / 'worker-pool.log',
  )
  with xlang_services._running(  # pylint: disable=protected-access
    pool, lambda: accepts(port)
  ):
    yield 'localhost:%d' % port, pool


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  outcome = yield
  report = outcome.get_result()
  if report.failed:
    for p in getattr(item, 'refract_processes', []):
      report.sections.append(('refract log (%s)' % ' '.join(p.args), p.log_tail() or '(empty)'))

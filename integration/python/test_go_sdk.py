"""Go pipelines on Refract: the Go word count (integration/go/wordcount,
built against Beam's Go SDK from the Go module proxy) submitted with
`--runner=universal --endpoint=...` in each environment a Go user picks:

- LOOPBACK, workers inside the submitting binary;
- DOCKER, the Go SDK's default: with no Docker engine here Refract runs
  Go's image as the staged pipeline binary in worker mode;
- PROCESS, with the boot program of Go's image as the command: it fetches
  the staged binary through Refract's provision and artifact services.

Each run's counts must equal a count made here in Python. A DoFn that fails
must fail the job with the Go SDK's own error text, which the Go client
reads from the job's message stream.
"""

import collections
import os
import re
import shutil
import subprocess

import pytest

from refract_testlib import RefractServer, serving
from test_sdk_images import docker_engine_reachable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
INPUT = os.path.join(REPO, 'integration', 'wordcount', 'input.txt')
WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")

pytestmark = pytest.mark.skipif(shutil.which('go') is None, reason='needs Go on PATH')


def build(helper):
  """Runs an integration/common.sh helper that prints a binary's path."""
  out = subprocess.run(
    ['bash', '-c', '. "$1/integration/common.sh" && ' + helper, '_', REPO],
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  if out.returncode != 0:
    pytest.fail('%s failed:\n%s' % (helper, out.stderr[-4000:]), pytrace=False)
  return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope='module')
def wordcount_bin():
  return build('refract_go_wordcount_bin')


@pytest.fixture(scope='module')
def boot_bin():
  return build('refract_go_boot_bin')


def expected_counts():
  with open(INPUT, encoding='utf-8') as f:
    return collections.Counter(WORD.findall(f.read().lower()))


def run_wordcount(binary, server, tmp_path, *flags):
  output = tmp_path / 'counts.txt'
  # --worker_binary: the SDK stages this binary as the worker instead of
  # cross-compiling the pipeline's sources, which it would look for in the
  # current directory.
  run = subprocess.run(
    [
      binary,
      '--input',
      INPUT,
      '--output',
      str(output),
      '--runner=universal',
      '--endpoint=' + server.endpoint,
      '--worker_binary=' + binary,
    ]
    + list(flags),
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  return run, output


def read_counts(path):
  counts = {}
  with open(path, encoding='utf-8') as f:
    for line in f:
      word, n = line.rstrip('\n').rsplit(': ', 1)
      counts[word] = int(n)
  return counts


@pytest.fixture
def go_server(request, refract_bin, tmp_path):
  """A `refract serve` working in the test's directory: a PROCESS worker
  inherits it, and Go's boot program writes `pipeline_options.json` where
  it runs."""
  workdir = tmp_path / 'server'
  workdir.mkdir()
  server = RefractServer(refract_bin, tmp_path / 'refract-serve.log', cwd=str(workdir))
  with serving(request, server):
    yield server


@pytest.mark.parametrize('environment', ['LOOPBACK', 'DOCKER', 'PROCESS'])
def test_go_wordcount_counts_every_word(environment, wordcount_bin, boot_bin, go_server, tmp_path):
  flags = ['--environment_type=' + environment]
  if environment == 'DOCKER' and docker_engine_reachable():
    pytest.skip('a Docker engine is reachable: DOCKER environments use it')
  if environment == 'PROCESS':
    flags.append('--environment_config={"command": "%s"}' % boot_bin)
  run, output = run_wordcount(wordcount_bin, go_server, tmp_path, *flags)
  assert run.returncode == 0, run.stderr[-6000:]
  assert read_counts(output) == expected_counts()
  if environment == 'DOCKER':
    assert "starting the SDK image's harness as a process" in go_server.log_tail(1 << 20)


def test_a_failing_go_dofn_fails_the_job_with_its_error(wordcount_bin, go_server, tmp_path):
  # Workers in their own processes: a LOOPBACK worker takes over the
  # submitting process's Beam logger (its lines go to the runner), so the
  # client's closing error is not on its stderr, on Prism as here.
  if docker_engine_reachable():
    pytest.skip('a Docker engine is reachable: DOCKER environments use it')
  run, _ = run_wordcount(
    wordcount_bin, go_server, tmp_path, '--environment_type=DOCKER', '--fail_on=the'
  )
  assert run.returncode != 0
  # The Go logger quotes the message, escaping its inner quotes.
  assert 'as -fail_on asked' in run.stderr, run.stderr[-6000:]
  assert 'main.splitFn' in run.stderr, run.stderr[-6000:]

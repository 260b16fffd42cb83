"""Word count over the bundled text: Refract must agree with the reference.

The reference is Beam's DirectRunner, itself checked against a plain-Python
count. Refract runs the same pipeline twice: through PortableRunner against
`refract serve` (LOOPBACK workers), and through PrismRunner, which starts the
refract binary itself as `BIN --job_port N --log_level ... --log_kind ...
--serve_http=false`.
"""

import logging

import pytest

from apache_beam.runners.portability import job_server
from apache_beam.runners.portability import prism_runner

import wordcount  # integration/wordcount, put on sys.path by conftest.py


def run(tmp_path, name, beam_args, runner=None):
  prefix = str(tmp_path / name / 'counts')
  return wordcount.run_wordcount(wordcount.DEFAULT_INPUT, prefix, beam_args, runner)


class PrismRunnerKeepingItsServer(prism_runner.PrismRunner):
  """PrismRunner as users get it, except that the test can stop the job
  server it starts (normally kept until the Python process exits)."""

  job_server = None

  def default_job_server(self, options):
    self.job_server = job_server.StopOnExitJobServer(prism_runner.PrismJobServer(options))
    return self.job_server


def assert_same_counts(actual, expected, what):
  if actual == expected:
    return
  missing = sorted(set(expected) - set(actual))
  extra = sorted(set(actual) - set(expected))
  wrong = sorted(
    (w, actual[w], expected[w]) for w in set(actual) & set(expected) if actual[w] != expected[w]
  )
  pytest.fail(
    '%s: counts differ from the reference (%d words expected, %d got)\n'
    '  missing words: %s\n  unexpected words: %s\n'
    '  wrong counts (word, got, expected): %s'
    % (what, len(expected), len(actual), missing[:20], extra[:20], wrong[:20]),
    pytrace=False,
  )


@pytest.fixture(scope='module')
def reference_counts(tmp_path_factory):
  # In Beam 2.77 the DirectRunner first tries Prism, which it would download
  # from GitHub. --allow_unsafe_triggers (no effect on this pipeline, whose
  # trigger is the default) makes it skip that and run Beam's own Python
  # runner, offline and deterministically.
  counts = run(
    tmp_path_factory.mktemp('direct'),
    'direct',
    ['--runner=DirectRunner', '--allow_unsafe_triggers'],
  )
  assert_same_counts(counts, wordcount.expected_counts(), 'DirectRunner')
  return counts


def test_bundled_text_is_substantial():
  counts = wordcount.expected_counts()
  assert sum(counts.values()) > 2000
  assert len(counts) > 300


def test_direct_runner_matches_plain_python(reference_counts):
  assert reference_counts['lens'] == wordcount.expected_counts()['lens']


def test_portable_runner_loopback(refract_server, tmp_path, reference_counts):
  counts = run(tmp_path, 'portable', refract_server.portable_args())
  assert_same_counts(counts, reference_counts, 'PortableRunner on refract')


def test_prism_runner_with_refract_binary(refract_bin, tmp_path, reference_counts, caplog):
  caplog.set_level(logging.INFO)
  runner = PrismRunnerKeepingItsServer()
  try:
    counts = run(
      tmp_path,
      'prism',
      [
        '--runner=PrismRunner',
        '--prism_location=%s' % refract_bin,
        '--environment_type=LOOPBACK',
      ],
      runner,
    )
  finally:
    if runner.job_server is not None:
      runner.job_server.stop()
  assert_same_counts(counts, reference_counts, 'PrismRunner(refract)')
  # PrismRunner starts the binary with `--log_kind json` and parses each
  # line it prints as Prism's JSON log: Refract's lines must parse, so the
  # user reads messages, not JSON.
  lines = [r for r in caplog.records if r.name == 'PrismRunner']
  assert any(r.getMessage().startswith('refract is serving') for r in lines), [
    r.getMessage() for r in caplog.records
  ][-20:]
  raw = [r.getMessage() for r in caplog.records if r.getMessage().startswith('{"')]
  assert not raw, raw[:5]

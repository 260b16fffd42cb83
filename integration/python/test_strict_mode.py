"""Strict mode (`pytest --refract`'s default, `--experiments=refract_strict`)
on test pipelines that are wrong in the ways it looks for: each passes on
Beam's DirectRunner and on Refract without strict mode, and fails under
it, its error saying what strict mode did (which transforms ran twice, on
which elements), the rule, and how to turn it off, after the SDK's own
assertion and stack. A correct pipeline passes under strict mode too.

The pipelines are in strict_suite/wrong_pipelines.py, run by pytest
sessions of their own with the refract-beam plugin (integration/wheel).
"""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = os.path.join(HERE, 'strict_suite')
PACKAGE = os.path.join(HERE, '..', 'wheel', 'python')


def session(refract_bin, *flags, check=None):
  """Runs the suite's pipelines (or the one named `check`) in pytest."""
  env = dict(os.environ, REFRACT_BIN=refract_bin)
  env['PYTHONPATH'] = os.pathsep.join(p for p in (PACKAGE, env.get('PYTHONPATH')) if p)
  args = [
    sys.executable,
    '-m',
    'pytest',
    '-p',
    'no:cacheprovider',
    '-p',
    'refract_beam.pytest_plugin',
    '-c',
    os.path.join(SUITE, 'pytest.ini'),
    '--rootdir',
    SUITE,
    '-q',
    '--tb=short',
    '-rf',
    '--timeout',
    '120',
    *flags,
  ]
  if check:
    args += ['-k', check]
  return subprocess.run(
    args, capture_output=True, text=True, cwd=SUITE, env=env, timeout=600, check=False
  )


def test_the_wrong_pipelines_pass_without_strict_mode(refract_bin):
  direct = session(refract_bin, '--test-pipeline-options=--runner=DirectRunner')
  assert '5 passed' in direct.stdout, direct.stdout[-3000:]
  lenient = session(refract_bin, '--refract', '--refract-no-strict')
  assert '5 passed' in lenient.stdout, lenient.stdout[-3000:]


@pytest.mark.parametrize(
  'check, rule, flags',
  [
    ('dedupe_in_memory', 'Create/Map(decode)+DedupeInMemory+', ()),
    ('count_per_bundle', 'bundle(s) smaller', ()),
    ('pairs_in_arrival_order', 'reordered the input of', ()),
    (
      'loses_data',
      'every element crossed its coder between transforms',
      ('--test-pipeline-options=--experiments=refract_strict=coders',),
    ),
  ],
)
def test_strict_mode_fails_a_wrong_pipeline_saying_why(refract_bin, check, rule, flags):
  done = session(refract_bin, '--refract', *flags, check=check)
  out = done.stdout
  assert '1 failed' in out, out[-4000:]
  # The SDK's own assertion and stack come first ...
  assert 'BeamAssertException: Failed assert' in out, out[-4000:]
  # ... then what strict mode did, the rule and the way out.
  assert "Refract's strict mode (seed " in out, out[-4000:]
  assert rule in out, out[-4000:]
  assert 'A DoFn must not depend on how often its input is processed' in out
  assert '--refract-no-strict' in out, out[-4000:]


def test_a_correct_pipeline_passes_under_strict_mode(refract_bin):
  done = session(refract_bin, '--refract', check='correct_pipeline')
  assert '1 passed' in done.stdout, done.stdout[-3000:]
  done = session(
    refract_bin,
    '--refract',
    '--test-pipeline-options=--experiments=refract_strict=coders',
    check='correct_pipeline',
  )
  assert '1 passed' in done.stdout, done.stdout[-3000:]


def test_a_coder_that_loses_data_passes_strict_mode_without_coders(refract_bin):
  """The coder check is `refract_strict=coders`' alone: by default the
  pipeline's transforms stay fused, as production runners fuse them."""
  done = session(refract_bin, '--refract', check='loses_data')
  assert '1 passed' in done.stdout, done.stdout[-3000:]


def test_strict_mode_asks_for_a_known_setting(refract_bin):
  """A bad value is refused at submission, naming it."""
  done = session(
    refract_bin,
    '--refract',
    '--test-pipeline-options=--experiments=refract_strict=sometimes',
    check='correct_pipeline',
  )
  assert '1 failed' in done.stdout, done.stdout[-3000:]
  assert 'refract_strict=sometimes' in done.stdout, done.stdout[-3000:]

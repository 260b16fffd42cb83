"""`pytest --refract`: every TestPipeline of a suite runs on Refract.

Installed with the refract-beam package (a `pytest11` entry point), so an
existing Beam test suite switches runners with one flag. With `--refract`,
each `TestPipeline` that does not name its runner in code gets
`--runner=refract_beam.RefractRunner`, in place of a `--runner` of
`--test-pipeline-options`, and LOOPBACK workers unless those options name
an environment: test pipelines are small and many, and a worker thread in
the test process starts in milliseconds where a worker process takes a
second or more to import Beam. Pipelines built with `beam.Pipeline(...)`
directly keep the runner they ask for.

Strict mode is on (`--experiments=refract_strict`): Refract runs some
bundles twice, cuts input into small bundles and reorders it, as any runner
may, so that a DoFn relying on one runner's habits fails its test here
rather than in production; `--experiments=refract_strict=coders` in
`--test-pipeline-options` also makes every element passing between the
pipeline's transforms cross its coder. `--refract-no-strict` turns it off; so does
`--experiments=refract_strict=off` in a pipeline's own options.

Without `--refract` the plugin does nothing.
"""

import pytest

_RUNNER = '--runner=refract_beam.RefractRunner'
_STRICT = '--experiments=refract_strict'
_ORIGINAL = pytest.StashKey()


def pytest_addoption(parser):
  parser.getgroup('refract').addoption(
    '--refract',
    action='store_true',
    default=False,
    help='Run every TestPipeline on Refract (refract_beam.RefractRunner), '
    'with LOOPBACK workers unless --test-pipeline-options names an '
    'environment, in strict mode.',
  )
  parser.getgroup('refract').addoption(
    '--refract-no-strict',
    action='store_true',
    default=False,
    help='With --refract: no strict mode (bundles are neither run twice, cut small nor reordered).',
  )


def on_refract(args, strict=True):
  """TestPipeline arguments `args`, made to run on Refract (in strict
  mode, unless `strict` is false)."""

  def named(flag):
    return lambda a: a == flag or a.startswith(flag + '=')

  out = []
  skip_value = False
  for arg in args:
    if skip_value:
      skip_value = False
      continue
    if named('--runner')(arg):
      skip_value = arg == '--runner'
      continue
    out.append(arg)
  out.append(_RUNNER)
  if not any(named('--environment_type')(a) for a in out):
    out.append('--environment_type=LOOPBACK')
  if strict:
    out.append(_STRICT)
  return out


# Last, so that a conftest that sets TestPipeline's options (as Beam's own
# does) has done so.
@pytest.hookimpl(trylast=True)
def pytest_configure(config):
  if not config.getoption('refract', default=False):
    return
  from apache_beam.testing.test_pipeline import TestPipeline

  original = TestPipeline._parse_test_option_args
  config.stash[_ORIGINAL] = original
  strict = not config.getoption('refract_no_strict', default=False)

  def parse_on_refract(self, argv):
    return on_refract(original(self, argv), strict)

  TestPipeline._parse_test_option_args = parse_on_refract


def pytest_unconfigure(config):
  original = config.stash.get(_ORIGINAL, None)
  if original is not None:
    from apache_beam.testing.test_pipeline import TestPipeline

    TestPipeline._parse_test_option_args = original

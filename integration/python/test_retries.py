"""Failed bundles are retried; a crashed SDK worker is replaced.

A bundle is a transaction: when it fails, nothing it did is kept, and its
input is processed again: up to four attempts in batch, and for as long as
it takes (with backoff) in streaming. These tests make the first attempt
fail — by raising, and by killing the worker process outright — and check
that the job still succeeds with exactly one copy of every output; and
make a streaming job fail more often than a batch job may.
"""

import json
import os

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to

HERE = os.path.dirname(os.path.abspath(__file__))
BOOT = os.path.join(os.path.dirname(HERE), 'python_boot.sh')


class FailOnce(beam.DoFn):
  """Fails the first bundle it sees (per marker file), then works."""

  def __init__(self, marker, crash):
    self.marker = marker
    self.crash = crash

  def process(self, element):
    if not os.path.exists(self.marker):
      with open(self.marker, 'w') as f:
        f.write('failed once')
      if self.crash:
        os._exit(3)  # the whole worker process dies mid-bundle
      raise RuntimeError('transient failure')
    yield element * 10


class FailTimes(beam.DoFn):
  """Fails its first `times` bundles (counted in a file), then works."""

  def __init__(self, counter, times):
    self.counter = counter
    self.times = times

  def process(self, element):
    failed = 0
    if os.path.exists(self.counter):
      with open(self.counter) as f:
        failed = int(f.read())
    if failed < self.times:
      with open(self.counter, 'w') as f:
        f.write(str(failed + 1))
      raise RuntimeError('transient failure %d' % (failed + 1))
    yield element * 10


def run_failing_once(options, marker, crash):
  with beam.Pipeline(options=options) as p:
    out = p | beam.Create([1, 2, 3]) | beam.ParDo(FailOnce(marker, crash))
    assert_that(out, equal_to([10, 20, 30]))


def test_a_failing_bundle_is_retried_and_its_output_kept_once(refract_server, tmp_path):
  run_failing_once(
    PipelineOptions(refract_server.portable_args()), str(tmp_path / 'marker'), crash=False
  )


def test_a_crashed_worker_is_replaced_and_the_bundle_retried(refract_server, tmp_path):
  args = refract_server.portable_args()
  args = [a for a in args if not a.startswith('--environment_type')]
  options = PipelineOptions(
    args
    + [
      '--environment_type=PROCESS',
      '--environment_config=' + json.dumps({'command': BOOT}),
    ]
  )
  run_failing_once(options, str(tmp_path / 'marker'), crash=True)


def test_a_streaming_job_retries_beyond_the_batch_limit(refract_server, tmp_path):
  counter = str(tmp_path / 'failures')
  # Five failures in a row: a batch job gives up after four attempts.
  options = PipelineOptions(refract_server.portable_args() + ['--streaming'])
  with beam.Pipeline(options=options) as p:
    out = p | beam.Create([1, 2, 3]) | beam.ParDo(FailTimes(counter, 5))
    assert_that(out, equal_to([10, 20, 30]))
  with open(counter) as f:
    assert f.read() == '5'

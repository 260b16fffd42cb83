"""The SDK's job client against Refract: jobs that outlive the client's
request timeout.

Python's PortableRunner opens the job's state and message streams before Run
with `--job_server_timeout` as their deadline (300 s by default). Refract
refuses those subscriptions, so the client opens them again after Run without
a deadline; a job may then run as long as it needs. The tests shrink the
timeout to a few seconds instead of running for five minutes.
"""

import time

import pytest

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to

CLIENT_TIMEOUT_S = 3
JOB_LENGTH_S = 3 * CLIENT_TIMEOUT_S
SLOW_FAILURE = 'refract-e2e: slow failure 5150'


def slow(x):
  time.sleep(JOB_LENGTH_S)
  return x * 2


def slow_then_fail(x):
  time.sleep(JOB_LENGTH_S)
  raise ValueError(SLOW_FAILURE)


def options(server):
  return PipelineOptions(server.portable_args('--job_server_timeout=%d' % CLIENT_TIMEOUT_S))


def test_a_job_longer_than_the_client_timeout_reports_done(refract_server):
  p = beam.Pipeline(options=options(refract_server))
  assert_that(p | beam.Create([1]) | beam.Map(slow), equal_to([2]))
  started = time.monotonic()
  state = p.run().wait_until_finish()
  elapsed = time.monotonic() - started
  assert state == PipelineState.DONE
  assert elapsed > CLIENT_TIMEOUT_S, (
    'the job took %.1f s, no longer than the client timeout: the test proves nothing' % elapsed
  )


def test_a_long_failing_job_still_shows_its_error(refract_server):
  with pytest.raises(RuntimeError, match=SLOW_FAILURE):
    with beam.Pipeline(options=options(refract_server)) as p:
      _ = p | beam.Create([1]) | beam.Map(slow_then_fail)

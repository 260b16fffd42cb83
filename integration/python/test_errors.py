"""Refract's errors must be clear: each failure names its cause."""

import subprocess

import grpc
import pytest

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_job_api_pb2
from apache_beam.portability.api import beam_job_api_pb2_grpc
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to

MADE_UP_URN = 'refract:test:no_such_transform:v1'
USER_ERROR = 'refract-e2e: intentional failure in user code 4711'


class MadeUpLeaf(beam.PTransform):
  """A primitive (no subtransforms) whose URN no runner knows."""

  def expand(self, pcoll):
    return pvalue.PCollection.from_(pcoll)

  def to_runner_api_parameter(self, unused_context):
    return MADE_UP_URN, b''


def explode(element):
  raise ValueError('%s (element %r)' % (USER_ERROR, element))


def test_unsupported_urn_is_rejected_at_submission(refract_server):
  p = beam.Pipeline(options=PipelineOptions(refract_server.portable_args()))
  _ = p | beam.Create([1, 2, 3]) | 'MadeUp' >> MadeUpLeaf() | beam.Map(lambda x: x)
  try:
    result = p.run()
  except Exception as e:  # pylint: disable=broad-except
    assert MADE_UP_URN in str(e), (
      'pipeline.run() failed, but its error does not name the unsupported '
      'URN %s:\n%s' % (MADE_UP_URN, e)
    )
    return
  # Accepted: the job must not be left running.
  try:
    state = result.wait_until_finish(duration=60 * 1000)
  except Exception as e:  # pylint: disable=broad-except
    state = 'failed while running (%s)' % str(e)[:500]
  finally:
    try:
      result.cancel()
    except Exception:  # pylint: disable=broad-except
      pass
  pytest.fail(
    'pipeline.run() accepted a transform with the unknown URN %s (job: %s); '
    'it must be rejected at submission' % (MADE_UP_URN, state),
    pytrace=False,
  )


def test_crashing_dofn_error_reaches_the_client(refract_server):
  with pytest.raises(RuntimeError, match=USER_ERROR):
    with beam.Pipeline(options=PipelineOptions(refract_server.portable_args())) as p:
      _ = p | beam.Create([1, 2, 3]) | 'Explode' >> beam.Map(explode)

  # The server outlives a failed job and keeps serving.
  with beam.Pipeline(options=PipelineOptions(refract_server.portable_args())) as p:
    assert_that(p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 10), equal_to([10, 20, 30]))


@pytest.mark.parametrize(
  'store, error',
  [
    ('rocksdb', 'refract_state_store=rocksdb needs a runner started with'),
    ('disk', "unknown state store 'disk'"),
  ],
)
def test_a_state_store_the_runner_cannot_give_is_refused_at_submission(
  refract_server, store, error
):
  options = PipelineOptions(
    refract_server.portable_args() + ['--experiments=refract_state_store=' + store]
  )
  p = beam.Pipeline(options=options)
  _ = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x)
  with pytest.raises(Exception, match=error):
    p.run().wait_until_finish()


def test_a_worker_count_past_the_limit_is_refused_at_submission(refract_server):
  """Each SDK worker is a process: a client asking for 100 000 per
  environment is refused, naming the option, and no worker starts."""
  options = PipelineOptions(refract_server.portable_args() + ['--sdk_worker_parallelism=100000'])
  p = beam.Pipeline(options=options)
  _ = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x)
  with pytest.raises(Exception, match='sdk_worker_parallelism=100000: at most 128'):
    p.run().wait_until_finish()


def test_an_update_of_no_running_job_is_refused_at_submission_starting_nothing(refract_server):
  """`--update` replaces the running job of that --job_name; with none
  running it is refused, saying what to do instead, and no job is created
  (test_recovery.py updates a running one)."""
  with grpc.insecure_channel(refract_server.endpoint) as channel:
    stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
    before = len(stub.GetJobs(beam_job_api_pb2.GetJobsRequest()).job_info)
    options = PipelineOptions(refract_server.portable_args() + ['--update', '--job_name=counts'])
    p = beam.Pipeline(options=options)
    _ = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x)
    with pytest.raises(Exception, match='no running job has --job_name=counts'):
      p.run().wait_until_finish()
    after = len(stub.GetJobs(beam_job_api_pb2.GetJobsRequest()).job_info)
  assert after == before


def run_cli(refract_bin, *args):
  return subprocess.run(
    [refract_bin] + list(args),
    stdin=subprocess.DEVNULL,
    capture_output=True,
    text=True,
    timeout=30,
    check=False,
  )


def test_bad_flag_exits_nonzero_with_usage(refract_bin):
  r = run_cli(refract_bin, '--no_such_flag')
  output = r.stdout + r.stderr
  assert r.returncode != 0, output
  assert 'usage' in output.lower(), output
  assert 'no_such_flag' in output, output


def test_a_bad_memory_budget_exits_nonzero_naming_it(refract_bin):
  r = run_cli(refract_bin, 'serve', '--memory_budget', 'lots')
  output = r.stdout + r.stderr
  assert r.returncode != 0, output
  assert '--memory_budget' in output and "'lots' is not a size" in output, output


@pytest.mark.parametrize(
  'args,expected',
  [
    ((), '--boot'),
    (('--boot', '/bin/true', '--max_workers', '0'), '--max_workers'),
    (('--boot', '/no/such/boot'), '/no/such/boot'),
  ],
  ids=['no_boot', 'zero_workers', 'missing_boot'],
)
def test_a_bad_worker_pool_invocation_exits_nonzero_naming_it(refract_bin, args, expected):
  r = run_cli(refract_bin, 'worker-pool', *args)
  output = r.stdout + r.stderr
  assert r.returncode != 0, output
  assert expected in output, output


def test_help_exits_zero_with_usage(refract_bin):
  r = run_cli(refract_bin, '--help')
  output = r.stdout + r.stderr
  assert r.returncode == 0, output
  assert 'usage' in output.lower(), output
  assert 'job_port' in output, output
